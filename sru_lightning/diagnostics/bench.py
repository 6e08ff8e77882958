"""`python -m sru_lightning bench <subcommand> [options]`: the benchmarks, each a subcommand with
only the options it reads (``bench <subcommand> --help``); ``bench`` alone runs ``bench op``.

``bench op [--length 128 --batch 32 --hidden 256 --layers 2 --dtype fp32|bf16|fp16 --threads 2
--levels all --plot chart.png]`` times an SRU stack against nn.LSTM, nn.GRU, the GEMM floor and
the ``sru`` package, its training step by phase, and the recurrence op in fp32/bf16/fp16 at each
CPU vector level (``op_bench``); ``bench decode`` text generation (``decode_bench``), ``bench export`` the
exported models (``export_bench``), ``bench compile`` the default language model eagerly and
compiled (``compile_bench``), ``bench documents`` what document boundaries in packed rows cost
(``documents_bench``), ``bench serve`` the completions server under 1, 8 and 64 streaming
clients (``serve_bench``), ``bench lm`` what the training loop adds to the model's own step, and
(``--curve``) validation bits per character against wall-clock time for the default, SRU++, LSTM and a
recipe (``lm_bench``, ``lm_curve``), ``bench data`` corpus preparation and fits from shards against the
text in memory (``data_bench``). Each measures in one process, interleaved, so the ratios hold on a shared,
noisy machine.
"""

from __future__ import annotations

import sys

from sru_lightning.app.usage import CommandParser, command_prog
from sru_lightning.diagnostics import op_bench
from sru_lightning.diagnostics.tables import STATISTIC_NAMES

#: bench's subcommands and what each times; `bench` without one runs `op`.
MODES = {
    "op": "an SRU stack against nn.LSTM, nn.GRU, the GEMM floor and the `sru` package, forward+backward "
    "and inference, and the bytes autograd saves (the default)",
    "decode": "step-by-step text generation of the default model (conf/model/sru.yaml) against the "
    "same-size LSTM (conf/model/lstm.yaml) and SRU++",
    "hf": "transformers' generate() on the default model's export folder against the package's own decoding "
    "(`generate`'s loop) at batch 1 and 16",
    "export": "the default SRU, SRU++ and LSTM language models eagerly, as AOTInductor packages and in "
    "onnxruntime: a decoding step at batch 1 and a sequence of --length x --batch",
    "compile": "the default language model's training step and inference eagerly and with torch.compile "
    "(model.compile=true)",
    "documents": "training on padded against packed documents, and the recurrence op with and without "
    "document boundaries (reset flags)",
    "serve": "the completions server (`serve`) under 1, 8 and 64 streaming clients: tokens/s, failed "
    "requests and the server's memory",
    "data": "`prepare` (MB/s at char level and with BPE) and a fit of the default model from shards against "
    "the text in memory (peak RSS, time to the first step, tokens/s) on generated corpora of --sizes MB",
    "hold": "holding a run folder: what taking and giving back the hold adds to a fit's start, and --pairs "
    "double starts of two fits into one folder (exactly one must train)",
    "lm": "a fit's step as `fit` runs it (callbacks, logger, progress bar) against the plain forward, backward "
    "and optimizer step, with Lightning's profiler; or (--curve) validation bits per character against "
    "wall-clock time of the default, SRU++, LSTM and a recipe",
}
DEFAULT_MODE = "op"

#: The options each subcommand reads, each with the field of the subcommand's config it sets (the
#: config's default is the option's); argparse refuses any other.
_COMMON = {"threads": "threads", "repeats": "repeats", "warmup": "warmup", "statistic": "statistic"}
MODE_OPTIONS: dict[str, dict[str, str]] = {
    "op": {
        **{name: name for name in ("length", "batch", "hidden", "layers", "dtype")},
        **_COMMON,
        "include_peer": "include_peer",
        "plot": "plot",
        "levels": "levels",
    },
    "decode": {"tokens": "tokens", **_COMMON},
    "hf": {"tokens": "tokens", **_COMMON},
    "export": {"tokens": "steps", "length": "length", "batch": "batch", **_COMMON},
    "compile": {"length": "length", "batch": "batch", **_COMMON},
    "documents": {"length": "length", "batch": "batch", "hidden": "hidden", **_COMMON},
    "serve": {"model": "model", "seconds": "seconds", "tokens": "tokens", "threads": "threads"},
    "data": {
        "sizes": "sizes",
        "repeats": "repeats",
        "warmup": "warmup",
        "out": "out",
        "bpe_mb": "bpe_mb",
        "memory_mb": "memory_mb",
    },
    "hold": {"repeats": "repeats", "pairs": "pairs", "threads": "threads"},
    "lm": {
        "model": "model",
        "extra": "extra",
        "repeats": "repeats",
        "warmup": "warmup",
        "statistic": "statistic",
        "curve": "curve",
        "budget": "budget",
        "recipe": "recipe",
        "runs": "runs",
        "seeds": "seeds",
        "out": "out",
        "plot": "plot",
    },
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
    "tokens": ("--tokens", "tokens generated per run"),
    "model": ("--model", "an export folder, a run directory, a .ckpt file or 'last'"),
    "seconds": ("--seconds", "seconds per level"),
    "extra": ("--extra", "Hydra overrides of every fit, in one quoted string"),
    "curve": ("--curve", "run the curve: one fit per model of --budget seconds each"),
    "budget": ("--budget", "seconds of each fit of --curve (trainer.max_time)"),
    "recipe": ("--recipe", "the overrides of the curve's run `recipe`, in one quoted string"),
    "runs": ("--runs", "the curve's runs, comma-separated, of sru (the default model), srupp, lstm, recipe"),
    "seeds": ("--seeds", "comma-separated seeds: one fit per run and seed (mean and spread); empty: the config's seed"),
    "out": ("--out", "folder of the curve's run folders"),
    "sizes": ("--sizes", "comma-separated corpus sizes in MB"),
    "bpe_mb": ("--bpe-mb", "MB of each corpus the BPE preparation is timed on"),
    "memory_mb": ("--memory-mb", "the in-memory fit runs for corpora up to this many MB"),
    "pairs": ("--pairs", "double starts: two fits started together into one new folder, this many times"),
    "levels": (
        "--levels",
        "CPU vector levels of the op's fp32/bf16/fp16 table, each timed in its own process: all (every level "
        "this processor runs), none, or names separated by commas",
    ),
}
#: What an option means in a subcommand where it is not what OPTIONS says.
_MEANING_IN = {
    ("tokens", "export"): "chained decoding steps per run",
    ("tokens", "serve"): "max_tokens of each request",
    ("model", "lm"): "the model config (conf/model/) of the timed fit",
    ("repeats", "lm"): "timed training steps",
    ("warmup", "lm"): "training steps before them",
    ("repeats", "hold"): "timed takes of a hold",
    ("threads", "hold"): "threads of each fit of a double start",
    ("plot", "lm"): "with --curve: draw validation bits per character against seconds into FILE",
    ("repeats", "data"): "timed training steps of each fit",
    ("warmup", "data"): "training steps before them",
    ("out", "data"): "folder for the corpora, shards and fits (kept); empty: a temporary folder",
}
#: Options that count something: at least 1 (--warmup: at least 0).
_COUNTS = ("length", "batch", "hidden", "layers", "threads", "repeats", "tokens", "seconds", "budget", "bpe_mb")
#: Options that count something and may be 0.
_COUNTS_FROM_ZERO = ("pairs",)
#: Options whose value is text.
_TEXTS = ("model", "extra", "recipe", "runs", "seeds", "out", "sizes", "levels")


def _mode_config(mode: str):
    """The config dataclass of `mode`: its fields' defaults are the subcommand's defaults."""
    from sru_lightning.diagnostics import (
        compile_bench,
        data_bench,
        decode_bench,
        documents_bench,
        export_bench,
        hf_bench,
        hold_bench,
        lm_bench,
        serve_bench,
    )

    return {
        "op": op_bench.BenchConfig,
        "decode": decode_bench.DecodeBenchConfig,
        "hf": hf_bench.HFBenchConfig,
        "export": export_bench.ExportBenchConfig,
        "compile": compile_bench.CompileBenchConfig,
        "documents": documents_bench.DocumentsBenchConfig,
        "serve": serve_bench.ServeBenchConfig,
        "lm": lm_bench.LMBenchConfig,
        "data": data_bench.DataBenchConfig,
        "hold": hold_bench.HoldBenchConfig,
    }[mode]


def _add_options(parser: CommandParser, mode: str) -> None:
    fields = _mode_config(mode).__dataclass_fields__
    for option, field_name in MODE_OPTIONS[mode].items():
        flag, meaning = OPTIONS[option]
        meaning = _MEANING_IN.get((option, mode), meaning)
        default = fields[field_name].default
        if option == "include_peer":
            parser.add_argument(flag, dest=option, action="store_false", default=default, help=meaning)
        elif option == "curve":
            parser.add_argument(flag, action="store_true", default=default, help=meaning)
        elif option == "plot":
            parser.add_argument(flag, metavar="FILE", default=default, help=meaning)
        else:
            choices = {"dtype": sorted(op_bench.DTYPES), "statistic": sorted(STATISTIC_NAMES)}.get(option)
            kind = str if choices or option in _TEXTS else int
            parser.add_argument(flag, type=kind, choices=choices, default=default, help=f"{meaning}; default {default}")


class SubcommandParser(CommandParser):
    """A subcommand's parser: an option it does not read is refused here, in its name and with the
    subcommands that read the option (argparse would leave the refusal to `bench`'s parser)."""

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}{_readers_hint(extras)}")
        return namespace, extras


def _readers_hint(extras: list[str]) -> str:
    flag = extras[0].split("=", 1)[0]
    if flag.startswith("--") and flag[2:] in MODES:
        return f"; {flag[2:]} is a subcommand: `bench {flag[2:]} ...`"
    option = next((name for name, (known, _) in OPTIONS.items() if known == flag), None)
    if option is None:
        return ""
    readers = [f"`bench {mode}`" for mode, options in MODE_OPTIONS.items() if option in options]
    return f"; {flag} is an option of {', '.join(readers)}"


def build_parser() -> CommandParser:
    """`bench` and one subparser per subcommand (kept in the parser's `modes`)."""
    parser = CommandParser(
        prog=command_prog("bench"),
        description="Speed and memory benchmarks, in one process each, so the ratios hold on a busy machine.",
        epilog=f"`bench` without a subcommand runs `bench {DEFAULT_MODE}`; `bench <subcommand> --help` lists "
        "its options.",
    )
    subcommands = parser.add_subparsers(
        dest="mode", metavar="{" + ",".join(MODES) + "}", title="subcommands", parser_class=SubcommandParser
    )
    parser.modes = {}
    for mode, meaning in MODES.items():
        parser.modes[mode] = subcommands.add_parser(mode, help=f"time {meaning}", description=f"Time {meaning}.")
        _add_options(parser.modes[mode], mode)
    return parser


def main(argv=None) -> int:
    argv = [] if argv is None else list(argv)
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help")):
        argv = [DEFAULT_MODE, *argv]  # `bench [options]` is `bench op [options]`
    parser = build_parser()
    args = parser.parse_args(argv)
    mode, reads = args.mode, MODE_OPTIONS[args.mode]
    refuse = parser.modes[mode].error
    warmup = getattr(args, "warmup", 0)
    for option in _COUNTS:
        value = getattr(args, option, None)
        if option in reads and value < 1:
            refuse(f"--{option} must be >= 1, got {value}")
    if warmup < 0:
        refuse(f"--warmup must be >= 0, got {warmup}")
    for option in _COUNTS_FROM_ZERO:
        value = getattr(args, option, None)
        if option in reads and value < 0:
            refuse(f"--{option} must be >= 0, got {value}")
    problem = op_bench.plot_problem(args.plot) if getattr(args, "plot", None) else None
    if problem:
        refuse(problem)
    problem = op_bench.levels_problem(args.levels) if "levels" in reads else None
    if problem:
        refuse(problem)
    config = _mode_config(mode)(**{field: getattr(args, option) for option, field in reads.items()})
    if mode == "decode":
        from sru_lightning.diagnostics import decode_bench

        print(decode_bench.format_table(decode_bench.run_decode_benchmark(config)))
    elif mode == "hf":
        from sru_lightning.diagnostics import hf_bench

        print(hf_bench.format_table(hf_bench.run_hf_benchmark(config)))
    elif mode == "export":
        from sru_lightning.diagnostics import export_bench

        print(export_bench.format_table(export_bench.run_export_benchmark(config)))
    elif mode == "compile":
        from sru_lightning.diagnostics import compile_bench

        print(compile_bench.format_table(compile_bench.run_compile_benchmark(config)))
    elif mode == "serve":
        from sru_lightning.diagnostics import serve_bench

        try:
            results = serve_bench.run_serve_benchmark(config)
        except serve_bench.ServerRefused as refusal:  # the server's own line names the setting
            print(refusal, file=sys.stderr)
            return 2
        print(serve_bench.format_table(config, results))
    elif mode == "lm":
        return _bench_lm(config, refuse)
    elif mode == "data":
        from sru_lightning.diagnostics import data_bench

        try:
            data_bench.parse_sizes(config.sizes)
        except ValueError as error:
            refuse(str(error))
        print(data_bench.format_table(config, data_bench.run_data_benchmark(config)))
    elif mode == "hold":
        from sru_lightning.diagnostics import hold_bench

        times, problems = hold_bench.run_hold_benchmark(config)
        print(hold_bench.format_table(config, times, problems))
        return 1 if hold_bench.failed_pairs(problems) else 0
    elif mode == "documents":
        from sru_lightning.diagnostics import documents_bench

        print(documents_bench.format_packing(config, documents_bench.measure_packing(config)))
        print()
        print(documents_bench.format_table(config, documents_bench.measure_reset_overhead(config)))
    else:
        result = op_bench.run_benchmark(config)
        print(op_bench.format_table(result))
        if config.plot:
            op_bench.plot(result, config.plot)
            print(f"chart written to {config.plot}")
    return 0


def _bench_lm(config, refuse) -> int:
    import shlex

    from sru_lightning.app.cli import config_groups
    from sru_lightning.diagnostics import lm_bench, lm_curve

    models = config_groups()["model"]
    if config.model not in models:
        refuse(f"--model must be one of {', '.join(models)} (conf/model/), got {config.model!r}")
    for option in ("extra", "recipe"):
        try:
            shlex.split(getattr(config, option))
        except ValueError as error:
            value = getattr(config, option)
            refuse(f"--{option} must be overrides as a shell would split them, got {value!r} ({error})")
    for option in ("plot", "runs", "seeds"):
        default = type(config).__dataclass_fields__[option].default
        if getattr(config, option) != default and not config.curve:
            refuse(f"--{option} is a setting of the curve: add --curve")
    names = lm_curve.run_names(config)
    unknown = [name for name in names if name not in lm_curve.CURVE_RUNS]
    if not names or unknown or len(set(names)) != len(names):
        known = ", ".join(lm_curve.CURVE_RUNS)
        refuse(f"--runs must name each of {known} at most once, comma-separated, got {config.runs!r}")
    if config.seeds.strip() and not all(seed.strip().isdigit() for seed in config.seeds.split(",")):
        refuse(f"--seeds must be non-negative integers, comma-separated, got {config.seeds!r}")
    if config.curve:
        lm_curve.main_curve(config)
    else:
        print(lm_bench.format_overhead(lm_bench.measure_overhead(config)))
    return 0
