"""Compile benchmark (`python -m sru_lightning bench compile`): the default language model
(conf/model/sru.yaml, vocabulary of the default data) eagerly and as `model.compile=true` runs it
(`torch.compile` of the model, `SRULanguageModel.for_trainer`): a training step (forward, loss,
backward, optimizer step) and an inference pass of `batch` streams of `length` tokens.

Both copies start from the same weights and are timed interleaved round by round in one process,
so the ratio holds on a busy machine; the time of the first compiled calls (tracing and code
generation) is reported apart.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from sru_lightning.diagnostics.tables import (
    STATISTIC_NAMES,
    count_setting,
    fixed_width_lines,
    intra_op_threads,
    repeats_setting,
    statistic_of,
    statistic_setting,
    threads_setting,
    warmup_setting,
)

KINDS = ("train step", "inference")


@dataclass
class CompileBenchConfig:
    length: int = count_setting(64, "sequence length L")
    batch: int = count_setting(16, "batch size B")
    threads: int = threads_setting(2)
    repeats: int = repeats_setting(15)
    warmup: int = warmup_setting(3)
    statistic: str = statistic_setting("min")


@dataclass
class CompileBenchResult:
    config: CompileBenchConfig
    description: str = ""
    eager_ms: dict[str, float] = field(default_factory=dict)
    compiled_ms: dict[str, float] = field(default_factory=dict)
    first_compiled_calls_s: float = 0.0

    def ratio(self, kind: str) -> float:
        """Compiled time over eager time of `kind` (below 1: compiling pays)."""
        return self.compiled_ms[kind] / self.eager_ms[kind]


def default_model(compile_setting: bool):
    """The model `fit` builds by default, with `model.compile` set to `compile_setting`, and the
    vocabulary size it reads (the default data's)."""
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    from sru_lightning._resources import conf_dir
    from sru_lightning.app.runs.init_from import without_init_from

    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = compose("config", overrides=[f"model.compile={str(compile_setting).lower()}"])
    datamodule = instantiate(cfg.data)
    net = instantiate(cfg.model.net, vocab_size=datamodule.vocab_size)
    model = instantiate(without_init_from(cfg.model), net=net, token_unit=datamodule.token_unit)
    return model, datamodule


def run_compile_benchmark(config: CompileBenchConfig) -> CompileBenchResult:
    with intra_op_threads(config.threads):
        return _run(config)


def _steps(module, model, tokens: torch.Tensor, targets: torch.Tensor):
    """(train step, inference pass) of `module` (`model` itself or its compiled form)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def train() -> None:
        model.train()
        logits, _ = module(tokens)
        loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def infer() -> None:
        model.eval()
        with torch.no_grad():
            module(tokens)

    return {"train step": train, "inference": infer}


def _run(config: CompileBenchConfig) -> CompileBenchResult:
    torch.manual_seed(0)
    eager, datamodule = default_model(False)
    compiled_model, _ = default_model(True)
    compiled_model.load_state_dict(eager.state_dict())
    sizes = eager.net.config
    result = CompileBenchResult(
        config,
        f"default model: embedding {sizes['embedding_dim']}, hidden {sizes['hidden_size']}, {sizes['num_layers']} "
        f"layers, vocabulary {datamodule.vocab_size}; batch {config.batch} x {config.length} tokens",
    )
    tokens = torch.randint(0, datamodule.vocab_size, (config.batch, config.length))
    targets = torch.randint(0, datamodule.vocab_size, (config.batch, config.length))
    runs = {
        "eager": _steps(eager, eager, tokens, targets),
        "compiled": _steps(compiled_model.for_trainer(), compiled_model, tokens, targets),
    }
    started = time.perf_counter()
    for step in runs["compiled"].values():  # tracing and code generation, once per mode
        step()
    result.first_compiled_calls_s = time.perf_counter() - started
    samples: dict[tuple[str, str], list[float]] = {}
    for round_index in range(config.warmup + config.repeats):
        for kind in KINDS:
            for name, steps in runs.items():
                began = time.perf_counter()
                steps[kind]()
                if round_index >= config.warmup:
                    samples.setdefault((name, kind), []).append((time.perf_counter() - began) * 1e3)
    pick = statistic_of(config.statistic)
    for (name, kind), times in samples.items():
        (result.eager_ms if name == "eager" else result.compiled_ms)[kind] = pick(times)
    return result


COLUMNS = (("", "<12"), ("eager ms", ">10"), ("compiled ms", ">13"), ("compiled/eager", ">16"))


def format_table(result: CompileBenchResult) -> str:
    cfg = result.config
    rows = [
        (kind, f"{result.eager_ms[kind]:.2f}", f"{result.compiled_ms[kind]:.2f}", f"{result.ratio(kind):.3f}")
        for kind in KINDS
    ]
    return "\n".join(
        [
            f"Compile benchmark: {result.description}, threads={cfg.threads} "
            f"({STATISTIC_NAMES[cfg.statistic]} of {cfg.repeats})",
            *fixed_width_lines(COLUMNS, rows),
            f"first compiled calls (tracing, code generation): {result.first_compiled_calls_s:.1f} s; "
            "train step: forward, loss, backward, AdamW step",
        ]
    )
