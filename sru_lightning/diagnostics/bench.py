"""Benchmark: an SRU stack against nn.LSTM, nn.GRU, the GEMM-only floor and the ``sru``
package, in one process, so the ratios are meaningful on a shared, noisy machine.

``python -m sru_lightning bench [--length 128 --batch 32 --hidden 256 --layers 2
--dtype fp32|bf16|fp16 --threads 2 --plot chart.png]`` prints the best (or median) time of
forward+backward and of inference for each model with its weights and input in ``--dtype``,
the ratios to nn.LSTM, nn.GRU and the GEMM floor (the same input matmuls alone, forward and
backward) in that dtype, and the bytes autograd saves for an SRU stack under the half policy
(bf16 autocast on CPU) relative to float32. For a half dtype it also times the recurrence op
alone (one layer, forward+backward) in that dtype and in float32 and prints the ratio.

``bench --decode [--tokens 200]`` times text generation instead: the default language model
against the LSTM of the same size, one token at a time (see ``decode_bench``).

``bench --compile`` times the default language model's training step and inference eagerly and
compiled (``model.compile=true``), with the ratio (see ``compile_bench``).

``bench --documents`` times what document boundaries in packed rows cost (see ``documents_bench``).
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

from sru_lightning.app.usage import CommandParser, command_prog
from sru_lightning.diagnostics.tables import STATISTIC_NAMES, fixed_width_lines, intra_op_threads, statistic_of

DTYPES = {"fp32": torch.float32, "fp64": torch.float64, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class BenchConfig:
    length: int = 128
    batch: int = 32
    hidden: int = 256
    layers: int = 2
    dtype: str = "fp32"
    threads: int = 2
    repeats: int = 15
    warmup: int = 3
    include_peer: bool = True
    plot: str | None = None
    # Noise on a shared machine only ever adds time, so the best of N estimates the cost
    # itself (as timeit does); "median" shows the typical time instead.
    statistic: str = "min"


@dataclass
class BenchResult:
    config: BenchConfig
    train_ms: dict[str, float] = field(default_factory=dict)  # forward + backward
    inference_ms: dict[str, float] = field(default_factory=dict)
    saved_bytes: dict[str, int] = field(default_factory=dict)  # SRU stack, fp32 / half policy
    kernel_ms: dict[str, float] = field(default_factory=dict)  # recurrence op alone, per storage dtype
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
        return _run_benchmark(config)


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
    if dtype in (torch.bfloat16, torch.float16):
        result.kernel_ms = measure_kernel(config, (config.dtype, "fp32"))
    return result


def measure_kernel(config: BenchConfig, dtype_names) -> dict[str, float]:
    """Best (or median) forward+backward time of the recurrence op alone, one layer of the
    benchmark's size (k = 3, skip term from x), for each storage dtype, timed interleaved."""
    from sru_lightning.ops import functional
    from sru_lightning.ops.testing import make_case

    steps = {}
    for name in dtype_names:
        (U, x, weight_c, bias, c0), kwargs = make_case(
            config.length, config.batch, config.hidden, dtype=DTYPES[name], seed=0
        )
        leaves = [t.requires_grad_(True) for t in (U, x, weight_c, bias, c0)]
        grad_h = torch.randn(config.length, config.batch, config.hidden).to(DTYPES[name])

        def step(leaves=leaves, kwargs=kwargs, grad_h=grad_h):
            for leaf in leaves:
                leaf.grad = None
            h, _ = functional.sru_recurrence(*leaves, **kwargs)
            h.backward(grad_h)

        steps[name] = step
    samples: dict[str, list[float]] = {name: [] for name in steps}
    for step in steps.values():
        for _ in range(config.warmup):
            step()
    for _ in range(config.repeats):
        for name, step in steps.items():
            start = time.perf_counter()
            step()
            samples[name].append((time.perf_counter() - start) * 1e3)
    pick = statistic_of(config.statistic)
    return {name: pick(times) for name, times in samples.items()}


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
    if result.kernel_ms:
        half, fp32 = result.kernel_ms[cfg.dtype], result.kernel_ms["fp32"]
        lines.append(
            f"recurrence op alone, fwd+bwd, one layer: {cfg.dtype} {half:.2f} ms, fp32 {fp32:.2f} ms, "
            f"{cfg.dtype}/fp32 {half / fp32:.3f}"
        )
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
    """Why `--plot path` cannot be written (checked before the benchmark runs), or None."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return "--plot needs matplotlib (pip install 'sru_lightning[bench]')"
    target = Path(path).expanduser()
    formats = sorted(Figure().canvas.get_supported_filetypes())
    suffix = target.suffix.lower().lstrip(".")
    if suffix not in formats:
        return f"--plot must name an image file ending in one of .{', .'.join(formats)}, got {path!r}"
    folder = target.parent if str(target.parent) else Path(".")
    if not folder.is_dir():
        return f"--plot must be a file in an existing folder, got {path!r} ({str(folder)!r} does not exist)"
    if not os.access(folder, os.W_OK):
        return f"--plot must be a file in a writable folder, got {path!r} ({str(folder)!r} is not writable)"
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


#: The mode flags; without one, the layer benchmark above runs.
MODES = {
    "decode": "time step-by-step text generation of the default model (conf/model/sru.yaml) vs the "
    "same-size LSTM (conf/model/lstm.yaml) instead",
    "export": "time the default SRU, SRU++ and LSTM language models eagerly, as AOTInductor packages and "
    "in onnxruntime instead: a decoding step at batch 1 and a sequence of --length x --batch",
    "compile": "time the default language model's training step and inference eagerly and with "
    "torch.compile (model.compile=true) instead",
    "documents": "time training on padded against packed documents, and the recurrence op with and "
    "without document boundaries (reset flags), instead",
}
LAYERS = None  # the mode of the layer benchmark (no mode flag)

#: The options each mode reads, each with the field of the mode's config it sets: the help's
#: lists, the defaults shown and the refusal of an option the mode would not read come from here.
_COMMON = {"threads": "threads", "repeats": "repeats", "warmup": "warmup", "statistic": "statistic"}
MODE_OPTIONS: dict[str | None, dict[str, str]] = {
    LAYERS: {
        **{name: name for name in ("length", "batch", "hidden", "layers", "dtype")},
        **_COMMON,
        "include_peer": "include_peer",
        "plot": "plot",
    },
    "decode": {"tokens": "tokens", **_COMMON},
    "export": {"tokens": "steps", "length": "length", "batch": "batch", **_COMMON},
    "compile": {"length": "length", "batch": "batch", **_COMMON},
    "documents": {"length": "length", "batch": "batch", "hidden": "hidden", **_COMMON},
}
#: Option (its dest) -> its flag and what it sets.
OPTIONS = {
    "length": ("--length", "sequence length L"),
    "batch": ("--batch", "batch size B"),
    "hidden": ("--hidden", "hidden size D (input size too)"),
    "layers": ("--layers", "SRU, LSTM and GRU layers"),
    "dtype": ("--dtype", "dtype of the weights and input"),
    "threads": ("--threads", "intra-op threads (torch.set_num_threads)"),
    "repeats": ("--repeats", "timed rounds"),
    "warmup": ("--warmup", "untimed rounds before them"),
    "statistic": ("--statistic", "best (min) or median of the repeats"),
    "include_peer": ("--no-peer", "leave out the `sru` package"),
    "plot": ("--plot", "also draw the times as a bar chart into FILE"),
    "tokens": ("--tokens", "tokens generated per run (--decode), chained decoding steps per run (--export)"),
}


def _mode_config(mode: str | None):
    """The config dataclass of `mode`: its fields' defaults are the mode's defaults."""
    from sru_lightning.diagnostics import compile_bench, decode_bench, documents_bench, export_bench

    return {
        LAYERS: BenchConfig,
        "decode": decode_bench.DecodeBenchConfig,
        "export": export_bench.ExportBenchConfig,
        "compile": compile_bench.CompileBenchConfig,
        "documents": documents_bench.DocumentsBenchConfig,
    }[mode]


def _mode_name(mode: str | None, short: bool = False) -> str:
    if mode is LAYERS:
        return "the layer benchmark" if short else "the layer benchmark (no mode flag)"
    return f"--{mode}"


def _readers(option: str) -> list[str | None]:
    return [mode for mode, options in MODE_OPTIONS.items() if option in options]


def _default_text(option: str) -> str:
    """The default of `option` in each mode that reads it, e.g. "128; --compile: 64"."""
    defaults: dict = {}
    for mode in _readers(option):
        field_name = MODE_OPTIONS[mode][option]
        value = _mode_config(mode).__dataclass_fields__[field_name].default
        defaults.setdefault(value, []).append(mode)
    if set(defaults) <= {None, True}:  # a flag (--no-peer) or an optional file (--plot)
        return ""
    first, *others = defaults
    text = [str(first)] + [f"{' and '.join(_mode_name(m) for m in defaults[value])} {value}" for value in others]
    return f"; default {', '.join(text)}"


def _option_help(option: str) -> str:
    flag, meaning = OPTIONS[option]
    readers = _readers(option)
    where = "" if len(readers) == len(MODE_OPTIONS) else "; read by " + ", ".join(_mode_name(m, True) for m in readers)
    return f"{meaning}{_default_text(option)}{where}"


def build_parser() -> CommandParser:
    parser = CommandParser(prog=command_prog("bench"), description=__doc__.split("\n\n")[0])
    # Every option defaults to None, so an option given to a mode that would not read it is seen.
    for option in ("length", "batch", "hidden", "layers", "threads", "repeats", "warmup", "tokens"):
        parser.add_argument(OPTIONS[option][0], type=int, default=None, help=_option_help(option))
    parser.add_argument("--dtype", choices=sorted(DTYPES), default=None, help=_option_help("dtype"))
    parser.add_argument("--statistic", choices=sorted(STATISTIC_NAMES), default=None, help=_option_help("statistic"))
    parser.add_argument(
        "--no-peer", dest="include_peer", action="store_false", default=None, help=_option_help("include_peer")
    )
    parser.add_argument("--plot", metavar="FILE", default=None, help=_option_help("plot"))
    modes = parser.add_mutually_exclusive_group()
    for mode, meaning in MODES.items():
        uses = ", ".join(OPTIONS[option][0] for option in MODE_OPTIONS[mode])
        modes.add_argument(f"--{mode}", action="store_true", help=f"{meaning}; uses {uses}")
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args([] if argv is None else list(argv))
    mode = next((name for name in MODES if getattr(args, name)), LAYERS)
    reads = MODE_OPTIONS[mode]
    for option in OPTIONS:
        value = getattr(args, option)
        if value is None or option in reads:
            continue
        flag = OPTIONS[option][0]
        given = flag if isinstance(value, bool) else f"{flag} {value}"
        readers = " and ".join(_mode_name(m) for m in _readers(option))
        parser.error(f"{flag} is read by {readers} only, got {given} with {_mode_name(mode)}")
    for option in ("length", "batch", "hidden", "layers", "threads", "repeats", "tokens"):
        value = getattr(args, option)
        if value is not None and value < 1:
            parser.error(f"--{option} must be >= 1, got {value}")
    if args.warmup is not None and args.warmup < 0:
        parser.error(f"--warmup must be >= 0, got {args.warmup}")
    problem = plot_problem(args.plot) if args.plot else None
    if problem:
        parser.error(problem)
    settings = {field: getattr(args, option) for option, field in reads.items() if getattr(args, option) is not None}
    config = _mode_config(mode)(**settings)
    if mode == "decode":
        from sru_lightning.diagnostics import decode_bench

        print(decode_bench.format_table(decode_bench.run_decode_benchmark(config)))
    elif mode == "export":
        from sru_lightning.diagnostics import export_bench

        print(export_bench.format_table(export_bench.run_export_benchmark(config)))
    elif mode == "compile":
        from sru_lightning.diagnostics import compile_bench

        print(compile_bench.format_table(compile_bench.run_compile_benchmark(config)))
    elif mode == "documents":
        from sru_lightning.diagnostics import documents_bench

        print(documents_bench.format_packing(config, documents_bench.measure_packing(config)))
        print()
        print(documents_bench.format_table(config, documents_bench.measure_reset_overhead(config)))
    else:
        result = run_benchmark(config)
        print(format_table(result))
        if config.plot:
            plot(result, config.plot)
            print(f"chart written to {config.plot}")
    return 0
