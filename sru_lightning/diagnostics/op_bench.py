"""The op benchmark (`python -m sru_lightning bench op`, or `bench` alone): an SRU stack against
nn.LSTM, nn.GRU, the GEMM-only floor and the ``sru`` package, in one process, so the ratios are
meaningful on a shared, noisy machine.

It prints the best (or median) time of forward+backward and of inference for each model with its
weights and input in ``dtype``, the ratios to nn.LSTM, nn.GRU and the GEMM floor (the same input
matmuls alone, forward and backward) in that dtype, and the bytes autograd saves for an SRU stack
under the half policy (bf16 autocast on CPU) relative to float32. Then the SRU stack's training
step by phase (:mod:`.step_breakdown`), and the recurrence op alone (one layer, forward+backward)
in float32, bfloat16 and float16 storage at each CPU vector level of ``levels``, each level in
a process of its own (:mod:`.op_levels`).
"""

from __future__ import annotations

import importlib.util
import os
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from sru_lightning.app.key_value import setting
from sru_lightning.diagnostics import op_levels
from sru_lightning.diagnostics.op_levels import LevelTimings
from sru_lightning.diagnostics.step_breakdown import StepBreakdown, breakdown_lines, measure_step_breakdown
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

DTYPES = {"fp32": torch.float32, "fp64": torch.float64, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class BenchConfig:
    length: int = count_setting(128, "sequence length L")
    batch: int = count_setting(32, "batch size B")
    hidden: int = count_setting(256, "hidden size D (input size too)")
    layers: int = count_setting(2, "SRU, LSTM and GRU layers")
    dtype: str = setting("fp32", "dtype of the weights and input", choices=sorted(DTYPES))
    threads: int = threads_setting(2)
    repeats: int = repeats_setting(15)
    warmup: int = warmup_setting(3)
    include_peer: bool = setting(True, "time the `sru` package too", old_flag=("--no-peer", "false"))
    plot: str = setting("", "also draw the times as a bar chart into this image file")
    # Noise on a shared machine only ever adds time, so the best of N estimates the cost
    # itself (as timeit does); "median" shows the typical time instead.
    statistic: str = statistic_setting("min")
    # CPU vector levels of the op's storage-dtype table: "all" (every level this processor
    # runs), "none", or names separated by commas.
    levels: str = setting(
        "all",
        "CPU vector levels of the op's fp32/bf16/fp16 table, each timed in its own process: all (every level this "
        "processor runs), none, or names separated by commas",
    )


@dataclass
class BenchResult:
    config: BenchConfig
    train_ms: dict[str, float] = field(default_factory=dict)  # forward + backward
    inference_ms: dict[str, float] = field(default_factory=dict)
    saved_bytes: dict[str, int] = field(default_factory=dict)  # SRU stack, fp32 / half policy
    step: StepBreakdown | None = None  # the SRU stack's training step by phase
    levels: list[LevelTimings] = field(default_factory=list)  # the op alone per level and storage dtype
    notes: list[str] = field(default_factory=list)

    def ratio(self, table: str, model: str, baseline: str) -> float | None:
        times = self.train_ms if table == "train" else self.inference_ms
        if model not in times or baseline not in times:
            return None
        return times[model] / times[baseline]


def saved_tensor_bytes(fn) -> int:
    """Bytes of the tensors autograd saves for backward while ``fn()`` runs, each storage once."""
    storages: dict[tuple, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        storages[(tensor.device.type, storage.data_ptr())] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        result = fn()
    del result
    return sum(storages.values())


class GemmFloor(nn.Module):
    """Only the input matmuls of an SRU stack (L*B x D times D x 3D per layer), run the way the
    layers run them (:func:`sru_lightning.ops.projection.input_projection`)."""

    def __init__(self, hidden: int, layers: int):
        super().__init__()
        self.weights = nn.ParameterList(
            nn.Parameter(torch.randn(hidden, 3 * hidden) / hidden**0.5) for _ in range(layers)
        )

    def forward(self, x):
        from sru_lightning.ops.projection import input_projection

        flat = x.reshape(-1, x.shape[-1])
        return [input_projection(flat, weight) for weight in self.weights]


def build_sru_stack(hidden: int, layers: int) -> nn.Module:
    from sru_lightning.nn import SRU

    return SRU(hidden, hidden, num_layers=layers)


def build_peer_stack(hidden: int, layers: int) -> nn.Module | None:
    if importlib.util.find_spec("sru") is None:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import sru

        return sru.SRU(hidden, hidden, num_layers=layers)


def _outputs(result):
    """Tensors to backpropagate from, whatever the model returns."""
    if isinstance(result, list):
        return result
    if isinstance(result, tuple):
        return [result[0]]
    return [result]


def _make_train_step(model: nn.Module, x: torch.Tensor):
    grads = None

    def step():
        nonlocal grads
        for parameter in model.parameters():
            parameter.grad = None
        x.grad = None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            outputs = _outputs(model(x))
        if grads is None:
            grads = [torch.randn_like(output) for output in outputs]
        torch.autograd.backward(outputs, grads)

    return step


def _make_inference_step(model: nn.Module, x: torch.Tensor):
    def step():
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model(x)

    return step


def run_benchmark(config: BenchConfig) -> BenchResult:
    """Time every model, interleaved round by round; keep the best (or median) time of each."""
    with intra_op_threads(config.threads):
        result = _run_benchmark(config)
    levels = selected_levels(config.levels)
    from sru_lightning.ops.build import extension_available

    if levels and not extension_available():
        result.notes.append("the level table times the C++ kernels, which this process could not load: left out")
    elif levels:
        result.levels, notes = op_levels.measure_levels(
            levels,
            length=config.length,
            batch=config.batch,
            hidden=config.hidden,
            threads=config.threads,
            repeats=config.repeats,
            warmup=config.warmup,
            statistic=config.statistic,
        )
        result.notes.extend(notes)
    return result


def levels_problem(levels: str) -> str | None:
    """Why `levels` cannot be read (checked before the benchmark runs), or None."""
    from sru_lightning.ops.signature import CPU_VECTOR_LEVELS

    if levels in ("all", "none"):
        return None
    names = [name.strip() for name in levels.split(",")]
    unknown = [name for name in names if name not in CPU_VECTOR_LEVELS]
    if unknown or not names:
        return (
            f"`levels` must be all, none, or vector levels separated by commas from {', '.join(CPU_VECTOR_LEVELS)}, "
            f"got {levels!r}"
        )
    return None


def selected_levels(levels: str) -> tuple[str, ...]:
    """The levels `levels` names, widest first ("all": every level this processor runs)."""
    from sru_lightning.ops.signature import CPU_VECTOR_LEVELS

    if levels == "none":
        return ()
    if levels == "all":
        return op_levels.processor_levels()
    names = {name.strip() for name in levels.split(",")}
    return tuple(level for level in reversed(CPU_VECTOR_LEVELS) if level in names)


def _run_benchmark(config: BenchConfig) -> BenchResult:
    dtype = DTYPES[config.dtype]
    result = BenchResult(config)
    models: dict[str, nn.Module] = {
        "SRU (sru_lightning)": build_sru_stack(config.hidden, config.layers),
        "nn.LSTM": nn.LSTM(config.hidden, config.hidden, config.layers),
        "nn.GRU": nn.GRU(config.hidden, config.hidden, config.layers),
        "GEMM floor": GemmFloor(config.hidden, config.layers),
    }
    if config.include_peer:
        peer = build_peer_stack(config.hidden, config.layers)
        if peer is None:
            result.notes.append("the `sru` package is not installed: its row is left out")
        else:
            models["sru package"] = peer
    for model in models.values():
        model.to(dtype)
    x = torch.randn(config.length, config.batch, config.hidden, dtype=dtype, requires_grad=True)

    train = {name: _make_train_step(model, x) for name, model in models.items()}
    infer = {name: _make_inference_step(model, x) for name, model in models.items() if "GEMM floor" not in name}
    samples: dict[tuple[str, str], list[float]] = {}
    for kind, steps in (("train", train), ("inference", infer)):
        for name, step in list(steps.items()):
            try:
                for _ in range(config.warmup):
                    step()
            except Exception as error:  # e.g. a dtype the `sru` package has no kernel for
                result.notes.append(f"{name} left out of {kind}: {error_line(error)}")
                del steps[name]
        for _ in range(config.repeats):
            for name, step in steps.items():
                start = time.perf_counter()
                step()
                samples.setdefault((kind, name), []).append((time.perf_counter() - start) * 1e3)
    for (kind, name), times in samples.items():
        target = result.train_ms if kind == "train" else result.inference_ms
        target[name] = statistic_of(config.statistic)(times)

    result.saved_bytes = measure_saved_bytes(config)
    sru = models["SRU (sru_lightning)"]
    result.step = measure_step_breakdown(
        sru, x, train["SRU (sru_lightning)"], config.repeats, config.warmup, config.statistic
    )
    return result


def measure_saved_bytes(config: BenchConfig) -> dict[str, int]:
    """Saved-for-backward bytes of the SRU stack: float32, and half policy under bf16 autocast."""
    stack = build_sru_stack(config.hidden, config.layers)
    x = torch.randn(config.length, config.batch, config.hidden, requires_grad=True)
    fp32 = saved_tensor_bytes(lambda: stack(x))
    from sru_lightning.nn import set_recurrence_policy

    set_recurrence_policy(stack, "half")

    def half_forward():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return stack(x)

    return {"fp32": fp32, "half (bf16 autocast)": saved_tensor_bytes(half_forward)}


COLUMNS = (
    ("model", "<22"),
    ("fwd+bwd ms", ">12"),
    ("x LSTM", ">9"),
    ("x GRU", ">8"),
    ("x GEMM", ">9"),
    ("infer ms", ">11"),
    ("x LSTM", ">9"),
    ("x GRU", ">8"),
)


def _cell(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _row(result: BenchResult, name: str) -> tuple[str, ...]:
    """One model's times and their ratios to nn.LSTM, nn.GRU and the GEMM floor ("-" where missing)."""
    return (
        name,
        _cell(result.train_ms.get(name), 2),
        _cell(result.ratio("train", name, "nn.LSTM"), 3),
        _cell(result.ratio("train", name, "nn.GRU"), 3),
        _cell(result.ratio("train", name, "GEMM floor"), 3),
        _cell(result.inference_ms.get(name), 2),
        _cell(result.ratio("inference", name, "nn.LSTM"), 3),
        _cell(result.ratio("inference", name, "nn.GRU"), 3),
    )


def format_table(result: BenchResult) -> str:
    cfg = result.config
    names = dict.fromkeys(list(result.train_ms) + list(result.inference_ms))
    lines = [
        f"SRU benchmark: L={cfg.length} B={cfg.batch} D={cfg.hidden} layers={cfg.layers} "
        f"dtype={cfg.dtype} threads={cfg.threads} ({STATISTIC_NAMES[cfg.statistic]} of {cfg.repeats})",
        *fixed_width_lines(COLUMNS, [_row(result, name) for name in names]),
    ]
    if result.saved_bytes:
        fp32 = result.saved_bytes["fp32"]
        half = result.saved_bytes["half (bf16 autocast)"]
        lines.append(
            f"saved for backward, SRU stack: fp32 {fp32 / 2**20:.2f} MiB, half policy (bf16 autocast) "
            f"{half / 2**20:.2f} MiB, ratio {half / fp32:.3f}"
        )
    try:
        from sru_lightning.ops.op import cpu_vector_level

        lines.append(f"CPU recurrence kernels: {cpu_vector_level()} vector code")
    except Exception as error:  # the extension could not be built: the reference ran
        lines.append(f"CPU recurrence kernels unavailable ({type(error).__name__}); the reference ran")
    if result.step is not None:
        layers = f"{cfg.layers} layer" + ("s" if cfg.layers != 1 else "")
        lines.append("")
        lines.extend(breakdown_lines(result.step, f"SRU training step by phase, {layers}, {cfg.dtype}:"))
    if result.levels:
        lines.append("")
        lines.append(
            f"recurrence op alone, one layer, fwd+bwd ms by storage dtype; each level in its own process "
            f"({STATISTIC_NAMES[cfg.statistic]} of {cfg.repeats}):"
        )
        lines.extend(fixed_width_lines(op_levels.LEVEL_COLUMNS, op_levels.level_rows(result.levels)))
    lines.extend(f"note: {note}" for note in result.notes)
    return "\n".join(lines)


def error_line(error: BaseException) -> str:
    """`Type: message` in one line; TorchScript puts the cause last, often already prefixed."""
    reason = (str(error).strip().splitlines() or [""])[-1].strip()
    prefix = f"{type(error).__name__}: "
    while reason.startswith(prefix):
        reason = reason[len(prefix) :]
    return f"{prefix}{reason}" if reason else type(error).__name__


def plot_problem(path: str) -> str | None:
    """Why `plot=path` cannot be written (checked before the benchmark runs), or None."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return "`plot` needs matplotlib (pip install 'sru_lightning[bench]')"
    target = Path(path).expanduser()
    formats = sorted(Figure().canvas.get_supported_filetypes())
    suffix = target.suffix.lower().lstrip(".")
    if suffix not in formats:
        return f"`plot` must name an image file ending in one of .{', .'.join(formats)}, got {path!r}"
    folder = target.parent if str(target.parent) else Path(".")
    if not folder.is_dir():
        return f"`plot` must be a file in an existing folder, got {path!r} ({str(folder)!r} does not exist)"
    if not os.access(folder, os.W_OK):
        return f"`plot` must be a file in a writable folder, got {path!r} ({str(folder)!r} is not writable)"
    return None


def plot(result: BenchResult, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(list(result.train_ms) + list(result.inference_ms)))
    positions = range(len(names))
    figure, axis = plt.subplots(figsize=(8, 4))
    axis.bar(
        [p - 0.2 for p in positions], [result.train_ms.get(n, 0.0) for n in names], width=0.4, label="forward+backward"
    )
    axis.bar(
        [p + 0.2 for p in positions],
        [result.inference_ms.get(n, 0.0) for n in names],
        width=0.4,
        label="inference",
    )
    axis.set_xticks(list(positions), names, rotation=15)
    cfg = result.config
    axis.set_ylabel(f"ms ({STATISTIC_NAMES[cfg.statistic]} of {cfg.repeats})")
    axis.set_title(
        f"L={cfg.length} B={cfg.batch} D={cfg.hidden} layers={cfg.layers} {cfg.dtype}, {cfg.threads} threads"
    )
    axis.legend()
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
