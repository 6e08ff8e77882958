"""Export benchmark (`python -m sru_lightning bench export`): the default SRU, SRU++ and LSTM
language models (conf/model/*.yaml) run eagerly, as AOTInductor packages and in onnxruntime, in
one process, interleaved round by round, best of N.

Two workloads: a decoding step at batch 1 (one token from the carried state, the state fed
back, as `generate` does) and one sequence pass at L=128, B=32 from a zero state. Every backend
runs the same graph (:class:`~sru_lightning.export.ExportableLanguageModel`), so the ratios
compare runtimes, not models.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from sru_lightning.diagnostics.decode_bench import default_models
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

BACKENDS = ("eager", "aoti", "onnxruntime")
BASELINE_MODEL = "nn.LSTM (model=lstm)"


@dataclass
class ExportBenchConfig:
    threads: int = threads_setting(1)
    tokens: int = count_setting(100, "chained decoding steps per run")
    length: int = count_setting(128, "sequence length L")
    batch: int = count_setting(32, "batch size B")
    repeats: int = repeats_setting(7)
    warmup: int = warmup_setting(2)
    statistic: str = statistic_setting("min")
    backends: tuple = BACKENDS


@dataclass
class ExportBenchResult:
    config: ExportBenchConfig
    export_seconds: dict = field(default_factory=dict)  # (model, format) -> seconds
    step_seconds: dict = field(default_factory=dict)  # (model, backend) -> seconds per step
    sequence_seconds: dict = field(default_factory=dict)  # (model, backend) -> seconds per pass


def _runners(name: str, model, folder: Path, backends, export_seconds: dict) -> dict:
    from sru_lightning.export import ExportableLanguageModel, export_language_model, load_exported

    runners = {}
    if "eager" in backends:
        wrapped = ExportableLanguageModel(model).eval()

        def eager(tokens, state, wrapped=wrapped):
            with torch.inference_mode():
                logits, *new_state = wrapped(tokens, *state)
            return logits, new_state

        runners["eager"] = (eager, wrapped.state_specs())
    for backend, fmt in (("aoti", "aoti"), ("onnxruntime", "onnx")):
        if backend not in backends:
            continue
        started = time.perf_counter()
        out = export_language_model(model, folder / f"{model.rnn_type}-{fmt}", fmt)
        export_seconds[(name, fmt)] = time.perf_counter() - started
        exported = load_exported(out, "pt2" if fmt == "aoti" else "onnxruntime", threads=torch.get_num_threads())
        runners[backend] = (exported.__call__, exported.state_specs)
    return runners


def _time_steps(run, specs, steps: int, vocab: int) -> float:
    token = torch.tensor([[vocab // 2]])
    state = [spec.initial_tensor(1) for spec in specs]
    _, state = run(token, state)
    started = time.perf_counter()
    for _ in range(steps):
        _, state = run(token, state)
    return (time.perf_counter() - started) / steps


def _time_sequence(run, specs, tokens) -> float:
    state = [spec.initial_tensor(tokens.shape[0]) for spec in specs]
    started = time.perf_counter()
    run(tokens, state)
    return time.perf_counter() - started


def run_export_benchmark(config: ExportBenchConfig) -> ExportBenchResult:
    result = ExportBenchResult(config)
    with intra_op_threads(config.threads), tempfile.TemporaryDirectory(prefix="sru-export-bench-") as folder:
        torch.manual_seed(0)
        _, models = default_models()
        runners = {
            name: _runners(name, model, Path(folder), config.backends, result.export_seconds)
            for name, model in models.items()
        }
        tokens = torch.randint(0, next(iter(models.values())).vocab_size, (config.batch, config.length))
        steps: dict = {key: [] for key in ((m, b) for m in runners for b in runners[m])}
        sequences: dict = {key: [] for key in steps}
        for round_index in range(config.warmup + config.repeats):
            for name, backends in runners.items():
                vocab = models[name].vocab_size
                for backend, (run, specs) in backends.items():
                    step = _time_steps(run, specs, config.tokens, vocab)
                    sequence = _time_sequence(run, specs, tokens)
                    if round_index >= config.warmup:
                        steps[(name, backend)].append(step)
                        sequences[(name, backend)].append(sequence)
    pick = statistic_of(config.statistic)
    result.step_seconds = {key: pick(values) for key, values in steps.items()}
    result.sequence_seconds = {key: pick(values) for key, values in sequences.items()}
    return result


COLUMNS = (
    ("model", "<22"),
    ("backend", "<13"),
    ("step us", ">9"),
    ("tok/s", ">8"),
    ("x eager", ">9"),
    ("x LSTM", ">8"),
    ("seq ms", ">9"),
    ("x eager", ">9"),
    ("x LSTM", ">8"),
)


def _ratio(table: dict, key: tuple, other: tuple) -> str:
    return f"{table[key] / table[other]:.2f}" if other in table else "-"


def _row(result: ExportBenchResult, name: str, backend: str) -> tuple[str, ...]:
    """One model on one backend: its step and sequence times, and their ratios to eager and to the LSTM."""
    key, eager, lstm = (name, backend), (name, "eager"), (BASELINE_MODEL, backend)
    step, sequence = result.step_seconds[key], result.sequence_seconds[key]
    return (
        name,
        backend,
        f"{step * 1e6:.0f}",
        f"{1 / step:.0f}",
        _ratio(result.step_seconds, key, eager),
        _ratio(result.step_seconds, key, lstm),
        f"{sequence * 1e3:.2f}",
        _ratio(result.sequence_seconds, key, eager),
        _ratio(result.sequence_seconds, key, lstm),
    )


def format_table(result: ExportBenchResult) -> str:
    cfg = result.config
    exports = ", ".join(
        f"{name.split()[0]} {fmt} {seconds:.0f} s" for (name, fmt), seconds in result.export_seconds.items()
    )
    lines = [
        f"Export benchmark: default models, threads={cfg.threads}, decoding step at B=1 ({cfg.tokens} chained steps), "
        f"sequence L={cfg.length} B={cfg.batch} ({STATISTIC_NAMES[cfg.statistic]} of {cfg.repeats}, interleaved)",
        *fixed_width_lines(COLUMNS, [_row(result, name, backend) for name, backend in result.step_seconds]),
        f"export time: {exports}",
        "x eager: time over the same model run eagerly; x LSTM: over the LSTM model on the same backend",
    ]
    return "\n".join(lines)
