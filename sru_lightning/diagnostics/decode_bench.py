"""Decoding benchmark (`python -m sru_lightning bench decode`): tokens per second of the
default language model (conf/model/sru.yaml) against the LSTM of the same size
(conf/model/lstm.yaml), and SRU++ (conf/model/srupp.yaml), one token at a time with the
carried state, at batch 1.

Both models run through `generate`'s own decoding loop (`app/decoding.py`: prompt pass,
sampling, one `model.step` per token, decoding to text, writing to a file), interleaved round
by round in one process, so the ratio holds on a busy machine. The recurrent layers alone (one step from
the carried state, no embedding, output layer or sampling) are timed the same way.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from types import SimpleNamespace

import torch

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

MODELS = {"SRU (model=sru)": "sru", "SRU++ (model=srupp)": "srupp", "nn.LSTM (model=lstm)": "lstm"}
BASELINE = "nn.LSTM (model=lstm)"


@dataclass
class DecodeBenchConfig:
    tokens: int = count_setting(200, "tokens generated per run")
    threads: int = threads_setting(2)
    repeats: int = repeats_setting(15)
    warmup: int = warmup_setting(3)
    statistic: str = statistic_setting("min")
    temperature: float = 0.8


@dataclass
class DecodeBenchResult:
    config: DecodeBenchConfig
    description: str = ""
    generate_tokens_per_s: dict[str, float] = field(default_factory=dict)
    layer_steps_per_s: dict[str, float] = field(default_factory=dict)

    def ratio(self, table: dict[str, float], model: str) -> float | None:
        if model not in table or BASELINE not in table:
            return None
        return table[model] / table[BASELINE]


def default_models():
    """The data module and the networks of the language models `fit` builds by default (model=sru /
    model=lstm), built from `model.net` as `fit` builds them."""
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    from sru_lightning._resources import conf_dir

    models = {}
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        datamodule = None
        for name, option in MODELS.items():
            cfg = compose("config", overrides=[f"model={option}"])
            if datamodule is None:
                datamodule = instantiate(cfg.data)
            models[name] = instantiate(cfg.model.net, vocab_size=datamodule.vocab_size).eval()
    return datamodule, models


def run_decode_benchmark(config: DecodeBenchConfig) -> DecodeBenchResult:
    with intra_op_threads(config.threads):
        return _run(config)


def _run(config: DecodeBenchConfig) -> DecodeBenchResult:
    from sru_lightning.app.decoding import generate_text

    torch.manual_seed(0)
    datamodule, models = default_models()
    sru = SimpleNamespace(**models["SRU (model=sru)"].config)
    result = DecodeBenchResult(
        config,
        f"default model: embedding {sru.embedding_dim}, hidden {sru.hidden_size}, {sru.num_layers} layers, "
        f"vocabulary {datamodule.vocab_size} ({type(datamodule).__name__}), batch 1",
    )
    generate_seconds: dict[str, list[float]] = {name: [] for name in models}
    layer_seconds: dict[str, list[float]] = {name: [] for name in models}
    codec = datamodule.codec
    with open(os.devnull, "w", encoding="utf-8") as sink:
        for round_index in range(config.warmup + config.repeats):
            for name, model in models.items():
                stats = generate_text(
                    model,
                    codec,
                    sink,
                    prompt="The ",
                    length=config.tokens,
                    temperature=config.temperature,
                    seed=round_index,
                )
                layers = _time_layer_steps(model, config.tokens)
                if round_index >= config.warmup:
                    generate_seconds[name].append(stats.seconds)
                    layer_seconds[name].append(layers)
    pick = statistic_of(config.statistic)
    for name in models:
        result.generate_tokens_per_s[name] = config.tokens / pick(generate_seconds[name])
        result.layer_steps_per_s[name] = config.tokens / pick(layer_seconds[name])
    return result


def _time_layer_steps(net, steps: int) -> float:
    """Seconds for `steps` single steps of the recurrent layers alone, carrying the state."""
    # The network's backbone pass carries what its layers need (SRU++: the attention memory next to c).
    x = torch.randn(1, 1, net.embedding_dim)
    with torch.inference_mode():
        output, state = net.backbone_forward(x, None)
        started = time.perf_counter()
        for _ in range(steps):
            output, state = net.backbone_forward(x, state)
        return time.perf_counter() - started


COLUMNS = (("model", "<24"), ("generate tok/s", ">16"), ("x LSTM", ">9"), ("layers steps/s", ">17"), ("x LSTM", ">9"))


def format_table(result: DecodeBenchResult) -> str:
    cfg = result.config
    rows = [
        (
            name,
            f"{result.generate_tokens_per_s[name]:.0f}",
            f"{result.ratio(result.generate_tokens_per_s, name):.2f}",
            f"{result.layer_steps_per_s[name]:.0f}",
            f"{result.ratio(result.layer_steps_per_s, name):.2f}",
        )
        for name in result.generate_tokens_per_s
    ]
    lines = [
        f"Decoding benchmark: {result.description}, {cfg.tokens} tokens per run, threads={cfg.threads} "
        f"({STATISTIC_NAMES[cfg.statistic]} of {cfg.repeats})",
        *fixed_width_lines(COLUMNS, rows),
        "generate tok/s: `generate`'s loop after the prompt (sample, step, decode, write); "
        "layers: the recurrent stack alone",
    ]
    return "\n".join(lines)
