"""`python -m sru_lightning bench <subcommand> [key=value ...]`: the benchmarks, each a subcommand
with only the settings it reads (``bench <subcommand> --help``); ``bench`` alone runs ``bench op``.
A subcommand's settings are the fields of its config, declared once with their help (``op_bench``,
``decode_bench``, ...); the old ``--flag`` spellings are translated with a notice.

``bench op`` times an SRU stack against nn.LSTM, nn.GRU, the GEMM floor and the ``sru`` package, its
training step by phase, and the recurrence op in fp32/bf16/fp16 at each CPU vector level
(``op_bench``); ``bench decode`` text generation (``decode_bench``), ``bench export`` the exported
models (``export_bench``), ``bench compile`` the default language model eagerly and compiled
(``compile_bench``), ``bench documents`` what document boundaries in packed rows cost
(``documents_bench``), ``bench serve`` the completions server under 1, 8 and 64 streaming clients
(``serve_bench``), ``bench lm`` what the training loop adds to the model's own step, and
(``curve=true``) validation bits per character against wall-clock time for the default, SRU++,
LSTM and a recipe (``lm_bench``, ``lm_curve``), ``bench data`` corpus preparation and fits from
shards against the text in memory (``data_bench``), ``bench hold`` the cost of holding a run folder
(``hold_bench``). Each measures in one process, interleaved, so the ratios hold on a shared, noisy
machine."""

from __future__ import annotations

import sys

from sru_lightning.app.key_value import command_usage, declared, read_settings, subcommands_usage, wants_help
from sru_lightning.app.usage import UsageError, command_prog, print_error
from sru_lightning.diagnostics import op_bench

#: bench's subcommands and what each times; `bench` without one runs `op`.
MODES = {
    "op": "an SRU stack against nn.LSTM, nn.GRU, the GEMM floor and the `sru` package, forward+backward "
    "and inference, and the bytes autograd saves (the default)",
    "decode": "step-by-step text generation of the default model (conf/model/sru.yaml) against the "
    "same-size LSTM (conf/model/lstm.yaml) and SRU++",
    "hf": "transformers' generate() on the default model's export folder against the package's own decoding "
    "(`generate`'s loop) at batch 1 and 16",
    "export": "the default SRU, SRU++ and LSTM language models eagerly, as AOTInductor packages and in "
    "onnxruntime: a decoding step at batch 1 and a sequence of `length` x `batch`",
    "compile": "the default language model's training step and inference eagerly and with torch.compile "
    "(model.compile=true)",
    "documents": "training on padded against packed documents, and the recurrence op with and without "
    "document boundaries (reset flags)",
    "serve": "the completions server (`serve`) under 1, 8 and 64 streaming clients: tokens/s, failed "
    "requests and the server's memory",
    "data": "`prepare` (MB/s at char level and with BPE) and a fit of the default model from shards against "
    "the text in memory (peak RSS, time to the first step, tokens/s) on generated corpora of `sizes` MB",
    "hold": "holding a run folder: what taking and giving back the hold adds to a fit's start, and `pairs` "
    "double starts of two fits into one folder (exactly one must train)",
    "lm": "a fit's step as `fit` runs it (callbacks, logger, progress bar) against the plain forward, backward "
    "and optimizer step, with Lightning's profiler; or (curve=true) validation bits per character against "
    "wall-clock time of the default, SRU++, LSTM and a recipe",
}
DEFAULT_MODE = "op"


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


PROG = command_prog("bench")


def mode_settings(mode: str) -> list[str]:
    """The settings `bench <mode>` reads: the fields of its config declared as settings."""
    return [item.name for item in declared(_mode_config(mode))]


def _old_switches() -> dict[str, str]:
    """Old switches that are not `--<setting>` (`--no-peer`) -> the setting they set."""
    items = [item for mode in MODES for item in declared(_mode_config(mode))]
    return {item.metadata["old_flag"][0]: item.name for item in items if item.metadata["old_flag"]}


def _readers_hint(argv: list[str], mode: str) -> None:
    """A setting of another subcommand (or a subcommand spelled as an option) is refused naming
    the subcommands that read it."""
    own = set(mode_settings(mode))
    switches = _old_switches()
    for word in argv:
        name = given = word.split("=", 1)[0]
        if word.startswith("--"):
            name = switches.get(name, name[2:].replace("-", "_"))
            if name in MODES:
                raise UsageError(f"{name!r} is a subcommand, not a setting: `bench {name} ...`")
        elif "=" not in word:
            continue
        if name in own:
            continue
        readers = [f"`bench {other}`" for other in MODES if name in mode_settings(other)]
        if readers:
            raise UsageError(
                f"unknown setting {given!r}; it is a setting of {', '.join(readers)}; "
                f"`bench {mode}` takes {', '.join(sorted(own))}"
            )


def parse_settings(argv) -> tuple[str, object]:
    """(the subcommand, its config) from `[subcommand] key=value ...` (or the old `--flag`
    spellings); `bench` without a subcommand is `bench op`. A problem raises UsageError."""
    argv = list(argv)
    mode = DEFAULT_MODE
    if argv and argv[0] in MODES:
        mode, argv = argv[0], argv[1:]
    elif argv and "=" not in argv[0] and not argv[0].startswith("-"):
        import difflib

        close = difflib.get_close_matches(argv[0], list(MODES), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise UsageError(f"unknown subcommand {argv[0]!r}{hint}; choose one of: {', '.join(MODES)}")
    _readers_hint(argv, mode)
    config, _ = read_settings(argv, _mode_config(mode), UsageError, old_flags=True)
    _check(mode, config)
    return mode, config


def _check(mode: str, config) -> None:
    """The checks that need more than one setting, or the file system, before a benchmark runs."""
    problem = op_bench.plot_problem(config.plot) if getattr(config, "plot", "") else None
    if problem:
        raise UsageError(problem)
    problem = op_bench.levels_problem(config.levels) if mode == "op" else None
    if problem:
        raise UsageError(problem)
    if mode == "data":
        from sru_lightning.diagnostics import data_bench

        try:
            data_bench.parse_sizes(config.sizes)
        except ValueError as error:
            raise UsageError(str(error)) from None
    if mode == "lm":
        _check_lm(config)


def usage(mode: str | None) -> str:
    """`bench --help` (the subcommands) or `bench <mode> --help` (its settings)."""
    if mode is None:
        notes = [
            f"`bench` without a subcommand runs `bench {DEFAULT_MODE}`; `bench <subcommand> --help` lists its "
            "settings.",
            "Each measures in one process, interleaved, so the ratios hold on a shared, noisy machine.",
        ]
        purpose = "Speed and memory benchmarks."
        return subcommands_usage(PROG, purpose, {mode: f"time {meaning}" for mode, meaning in MODES.items()}, notes)
    prog = f"{PROG} {mode}"
    return command_usage(prog, f"Time {MODES[mode]}.", _mode_config(mode), examples=[EXAMPLES[mode]])


#: One command line per subcommand, shown by its help.
EXAMPLES = {
    "op": f"{PROG} op length=64 batch=16 dtype=bf16 include_peer=false levels=none",
    "decode": f"{PROG} decode tokens=200 threads=1",
    "hf": f"{PROG} hf tokens=200 threads=2",
    "export": f"{PROG} export tokens=100 length=128 batch=32",
    "compile": f"{PROG} compile length=64 batch=16",
    "documents": f"{PROG} documents length=128 batch=32 hidden=256",
    "serve": f"{PROG} serve model=outputs/<date>/<time> seconds=10",
    "data": f"{PROG} data sizes=30,300 memory_mb=300",
    "hold": f"{PROG} hold pairs=20",
    "lm": f"{PROG} lm curve=true budget=60 runs=sru,lstm plot=curve.png",
}


def main(argv=None) -> int:
    argv = [] if argv is None else list(argv)
    if wants_help(argv):
        print(usage(argv[0] if argv and argv[0] in MODES else None))
        return 0
    try:
        mode, config = parse_settings(argv)
    except UsageError as error:
        named = argv and "=" not in argv[0] and not argv[0].startswith("-")
        mode = argv[0] if named else DEFAULT_MODE
        print_error(str(error), f"{PROG} {mode}" if mode in MODES else PROG)
        return 2
    return _run(mode, config)


def _run(mode: str, config) -> int:
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
        from sru_lightning.diagnostics import lm_bench, lm_curve

        if config.curve:
            lm_curve.main_curve(config)
        else:
            print(lm_bench.format_overhead(lm_bench.measure_overhead(config)))
    elif mode == "data":
        from sru_lightning.diagnostics import data_bench

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


def _check_lm(config) -> None:
    import shlex

    from sru_lightning.app.cli import config_groups
    from sru_lightning.diagnostics import lm_curve

    models = config_groups()["model"]
    if config.model not in models:
        raise UsageError(f"`model` must be one of {', '.join(models)} (conf/model/), got {config.model!r}")
    for option in ("extra", "recipe"):
        try:
            shlex.split(getattr(config, option))
        except ValueError as error:
            value = getattr(config, option)
            raise UsageError(
                f"`{option}` must be overrides as a shell would split them, got {value!r} ({error})"
            ) from None
    for option in ("plot", "runs", "seeds", "target"):
        default = type(config).__dataclass_fields__[option].default
        if getattr(config, option) != default and not config.curve:
            raise UsageError(f"`{option}` is a setting of the curve: add curve=true")
    names = lm_curve.run_names(config)
    unknown = [name for name in names if name not in lm_curve.CURVE_RUNS]
    if not names or unknown or len(set(names)) != len(names):
        known = ", ".join(lm_curve.CURVE_RUNS)
        raise UsageError(f"`runs` must name each of {known} at most once, comma-separated, got {config.runs!r}")
    if config.seeds.strip() and not all(seed.strip().isdigit() for seed in config.seeds.split(",")):
        raise UsageError(f"`seeds` must be non-negative integers, comma-separated, got {config.seeds!r}")
