"""transformers' ``generate()`` against the package's own decoding (`python -m sru_lightning bench hf`).

The default model (conf/model/sru.yaml, as `bench decode` builds it) is written as an export
folder (`export format=hf`) and loaded by ``AutoModelForCausalLM``; then, round by round in one
process, the same number of tokens is sampled at batch 1 and at batch 16 by

* the package: `generate`'s loop (:func:`~sru_lightning.app.decoding.generate_text`: prompt pass,
  sample, one ``step`` per token, decode, write) at batch 1; at batch 16 the same loop over a batch
  of rows (``sample_rows``, each row decoded), as `serve` steps its streams;
* transformers: ``model.generate(do_sample=True, max_new_tokens=min_new_tokens=N)`` and
  ``tokenizer.batch_decode`` of its output,

and prints tokens per second of each and their ratio (the goal: transformers at >= 0.8x).
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

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

BATCHES = (1, 16)
PROMPT = "The "
GOAL = 0.8  # transformers' tokens/s over the package's


@dataclass
class HFBenchConfig:
    tokens: int = count_setting(200, "tokens generated per run")
    threads: int = threads_setting(2)
    repeats: int = repeats_setting(10)
    warmup: int = warmup_setting(2)
    statistic: str = statistic_setting("min")


@dataclass
class HFBenchResult:
    config: HFBenchConfig
    description: str = ""
    package_tokens_per_s: dict[int, float] = field(default_factory=dict)
    transformers_tokens_per_s: dict[int, float] = field(default_factory=dict)

    def ratio(self, batch: int) -> float:
        return self.transformers_tokens_per_s[batch] / self.package_tokens_per_s[batch]


def run_hf_benchmark(config: HFBenchConfig) -> HFBenchResult:
    with intra_op_threads(config.threads):
        return _run(config)


def _run(config: HFBenchConfig) -> HFBenchResult:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import sru_lightning.hf  # noqa: F401  (registers the model type)
    from sru_lightning.diagnostics.decode_bench import default_models
    from sru_lightning.export.pretrained import save_pretrained

    torch.manual_seed(0)
    datamodule, models = default_models()
    network, codec = models["SRU (model=sru)"], datamodule.codec
    with tempfile.TemporaryDirectory() as scratch:
        folder = save_pretrained(network, Path(scratch) / "default", codec)
        model = AutoModelForCausalLM.from_pretrained(folder).eval()
        tokenizer = AutoTokenizer.from_pretrained(folder)
    shape = network.config
    result = HFBenchResult(
        config,
        f"default model (hidden {shape['hidden_size']}, {shape['num_layers']} layers, vocabulary "
        f"{codec.vocab_size}), {config.tokens} tokens per row, temperature 1",
    )
    seconds: dict[tuple[str, int], list[float]] = {}
    with open(os.devnull, "w", encoding="utf-8") as sink:
        for round_index in range(config.warmup + config.repeats):
            for batch in BATCHES:
                timings = {
                    "package": _package(network, codec, sink, batch, config.tokens, round_index),
                    "transformers": _transformers(model, tokenizer, batch, config.tokens, round_index),
                }
                if round_index >= config.warmup:
                    for side, value in timings.items():
                        seconds.setdefault((side, batch), []).append(value)
    pick = statistic_of(config.statistic)
    for batch in BATCHES:
        result.package_tokens_per_s[batch] = batch * config.tokens / pick(seconds[("package", batch)])
        result.transformers_tokens_per_s[batch] = batch * config.tokens / pick(seconds[("transformers", batch)])
    return result


def _package(network, codec, sink, batch: int, tokens: int, seed: int) -> float:
    """Seconds of the package's decoding of `tokens` tokens for `batch` rows, prompt pass included."""
    from sru_lightning.app.decoding import generate_text, sample_rows

    started = time.perf_counter()
    if batch == 1:
        generate_text(network, codec, sink, prompt=PROMPT, length=tokens, temperature=1.0, seed=seed)
        return time.perf_counter() - started
    generators = [torch.Generator().manual_seed(seed + row) for row in range(batch)]
    writers = [codec.decoder(after=PROMPT) for _ in range(batch)]
    with torch.inference_mode():
        logits, state = network.step(torch.tensor([codec.encode(PROMPT)] * batch))
        for index in range(tokens):
            drawn = sample_rows(logits, [1.0] * batch, [0] * batch, generators)
            for row, token in enumerate(drawn.tolist()):
                sink.write(writers[row](token))
            if index + 1 < tokens:
                logits, state = network.step(drawn, state)
    return time.perf_counter() - started


def _transformers(model, tokenizer, batch: int, tokens: int, seed: int) -> float:
    """Seconds of ``generate()`` of `tokens` new tokens for `batch` rows and their decoding."""
    torch.manual_seed(seed)
    inputs = tokenizer([PROMPT] * batch, return_tensors="pt")
    started = time.perf_counter()
    output = model.generate(
        **inputs, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=True, temperature=1.0, top_k=0
    )
    tokenizer.batch_decode(output[:, inputs["input_ids"].shape[1] :])
    return time.perf_counter() - started


COLUMNS = (("batch", ">5"), ("generate tok/s", ">16"), ("transformers tok/s", ">20"), ("ratio", ">7"), ("goal", ">6"))


def format_table(result: HFBenchResult) -> str:
    cfg = result.config
    rows = [
        (
            str(batch),
            f"{result.package_tokens_per_s[batch]:.0f}",
            f"{result.transformers_tokens_per_s[batch]:.0f}",
            f"{result.ratio(batch):.2f}",
            "met" if result.ratio(batch) >= GOAL else f"<{GOAL}",
        )
        for batch in BATCHES
    ]
    return "\n".join(
        [
            f"transformers generate() against the package's decoding: {result.description}, threads={cfg.threads} "
            f"({STATISTIC_NAMES[cfg.statistic]} of {cfg.repeats})",
            *fixed_width_lines(COLUMNS, rows),
            f"ratio: transformers over the package (goal >= {GOAL}); both include the prompt pass and decoding",
        ]
    )
