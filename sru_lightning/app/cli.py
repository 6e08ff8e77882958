"""`python -m sru_lightning <command> [overrides]`: Hydra-configured fit/validate/test, plus
the package's tool commands (bench, build, fidelity, gpu-check, generate, export, prepare, serve)."""

from __future__ import annotations

import contextlib
import difflib
import errno
import importlib
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from sru_lightning._resources import conf_dir
from sru_lightning.app.hydra_errors import configuration_error as _configuration_error
from sru_lightning.app.hydra_errors import unparsable_override as _unparsable_override
from sru_lightning.app.usage import PROG, print_error

TRAINER_COMMANDS = {
    "fit": "train a language model (default: SRU on pydoc prose, a few minutes on CPU)",
    "validate": "evaluate on the validation split (load weights with ckpt_path=...)",
    "test": "evaluate on the test split (load weights with ckpt_path=...)",
}
# command -> (module, description); imported only when the command runs.
TOOL_COMMANDS = {
    "bench": (
        "sru_lightning.diagnostics.bench",
        "speed and memory: op (SRU vs LSTM and the GEMM floor), decode, export, compile, documents",
    ),
    "build": ("sru_lightning.app.build_command", "compile the CPU (and CUDA) recurrence kernels ahead of time"),
    "fidelity": ("sru_lightning.diagnostics.fidelity", "numeric fidelity of every precision policy vs float64"),
    "gpu-check": ("sru_lightning.diagnostics.gpu_check", "end-to-end checks on a CUDA machine"),
    "generate": ("sru_lightning.app.generate", "write text with a trained checkpoint (prompt=... length=...)"),
    "export": (
        "sru_lightning.app.export_command",
        "export a checkpoint to ONNX, torch.export or AOTInductor (format=... out=...)",
    ),
    "prepare": (
        "sru_lightning.app.prepare_command",
        "tokenize a corpus once into token shards that fit reads by memory map (data=... out=...)",
    ),
    "serve": (
        "sru_lightning.app.serve",
        "an OpenAI-style completions server, open streams batched per token (model=... port=...)",
    ),
}


# --------------------------------------------------------------------------------------------
# help
def config_groups() -> dict[str, list[str]]:
    """Config group -> its options, read from the installed conf/ tree; a group inside a group's
    folder is named by its path (`model/optimizer`), as its override spells it."""
    root = conf_dir()
    groups = {}
    for group in sorted(root.iterdir()):
        if not group.is_dir() or group.name.startswith((".", "_")) or group.name == "hydra":
            continue
        groups[group.name] = sorted(option.stem for option in group.glob("*.yaml"))
        for inner in sorted(group.iterdir()):
            if inner.is_dir() and not inner.name.startswith((".", "_")):
                groups[f"{group.name}/{inner.name}"] = sorted(option.stem for option in inner.glob("*.yaml"))
    return groups


def usage() -> str:
    lines = [f"usage: {PROG} <command> [-m] [group=option ...] [key=value ...]", "", "Commands:"]
    width = max(map(len, [*TRAINER_COMMANDS, *TOOL_COMMANDS])) + 2
    for name, text in TRAINER_COMMANDS.items():
        lines.append(f"  {name:<{width}}{text}")
    for name, (_, text) in TOOL_COMMANDS.items():
        lines.append(f"  {name:<{width}}{text}")
    lines += ["", "Config groups for fit/validate/test (conf/ in the package):"]
    groups = config_groups()
    group_width = max(map(len, groups)) + 2
    for group, options in groups.items():
        lines.append(f"  {group:<{group_width}}{', '.join(options)}")
    lines += [
        "",
        "Top-level keys: seed, threads, ckpt_path (null | file | run dir | last), resume_dir.",
        "",
        "Examples:",
        f"  {PROG} fit",
        f"  {PROG} fit model=lstm trainer.max_epochs=1",
        f"  {PROG} fit -m trainer.precision=32-true,bf16-true    # a sweep, one dir per job + summary",
        f"  {PROG} fit ckpt_path=last                           # resume the latest matching run",
        f"  {PROG} fit --help                                    # composed config, all keys",
        f"  {PROG} generate ckpt_path=last prompt='The ' length=200",
        f"  {PROG} bench --help",
    ]
    return "\n".join(lines)


def _fail(message: str, status: int = 2) -> int:
    print_error(message)
    return status


# --------------------------------------------------------------------------------------------
# entry point
def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point; returns the process exit status."""
    _survive_scheduler_warnings()
    try:
        status = _dispatch(list(sys.argv[1:] if argv is None else argv))
        sys.stdout.flush()
        return status
    except BrokenPipeError:  # e.g. `--help | head -3`: the reader has seen enough
        _silence_stdout()
        return 0
    except OSError as error:
        if error.errno not in _FULL_OUTPUT_ERRORS:
            raise
        _silence_stdout()
        return _fail(f"cannot write the output: {error.strerror or error}", 1)


def _survive_scheduler_warnings() -> None:
    """SIGUSR1/SIGUSR2 (a scheduler's warning before a preemption or time limit) end a process
    by default. Until a run watches them (its signal watch, then its GracefulInterrupt stop and
    requeue), one arriving while the interpreter imports must not kill the job: it is ignored."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return
    for signum in (signal.SIGUSR1, signal.SIGUSR2):
        if signal.getsignal(signum) == signal.SIG_DFL:
            signal.signal(signum, signal.SIG_IGN)


# A full disk or device (`> /dev/full`), a file too large: the output could not be written.
_FULL_OUTPUT_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO}


def _silence_stdout() -> None:
    # Point stdout at /dev/null so the interpreter's final flush does not fail again.
    try:
        sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return  # not a real file (captured): nothing will be flushed at exit
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _dispatch(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command in TOOL_COMMANDS:
        return _run_tool(command, rest)
    if command in TRAINER_COMMANDS:
        return _run_trainer_command(command, rest)
    if "=" in command or command.startswith("-"):
        named = [word for word in argv if word in TRAINER_COMMANDS or word in TOOL_COMMANDS]
        first = named[0] if named else "fit"
        rest = [word for word in argv if word != first]
        return _fail(f"the command must come first, got {command!r}; e.g. `{PROG} {first} {' '.join(rest)}`")
    close = difflib.get_close_matches(command, [*TRAINER_COMMANDS, *TOOL_COMMANDS], n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    choices = ", ".join([*TRAINER_COMMANDS, *TOOL_COMMANDS])
    return _fail(f"unknown command {command!r}{hint}; choose one of: {choices}")


def _run_tool(command: str, argv: list[str]) -> int:
    module_name, _ = TOOL_COMMANDS[command]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name and module_name.startswith(error.name):
            return _fail(f"command {command!r} is not available: module {module_name} is not installed", 1)
        raise
    entry = getattr(module, "main", None)
    if entry is None:
        return _fail(f"command {command!r} is not available: {module_name} has no main(argv)", 1)
    result = entry(argv)
    return result if isinstance(result, int) else 0


def _run_trainer_command(command: str, overrides: list[str]) -> int:
    from sru_lightning.app import sweep
    from sru_lightning.app.hydra_launch import FlagsConflict, run_hydra
    from sru_lightning.app.runs.context import RunContext, activated
    from sru_lightning.app.search import register_sweeper

    problem = _unparsable_override(overrides)
    if problem:
        return _fail(problem)
    register_sweeper()  # the package's own sweeper (hydra/sweeper=pruned_optuna)
    context = RunContext(command, tuple(overrides))
    statuses: list[str] = []
    task = _trainer_task(context, statuses)
    # Hydra's own errors (an unknown key or option) come back as exceptions, told in one line below;
    # the context's holds are given back when the block ends, however the command ended.
    try:
        with activated(context), _command_line_for_launched_ranks([command, *overrides]):
            run_hydra(overrides, task, config_path=str(conf_dir()), config_name="config")
    except sweep.SweepIncomplete as incomplete:  # the summary above lists every job
        return sweep.report_incomplete(incomplete)
    except SystemExit as exit_request:  # a job stopped by SIGTERM or Ctrl+C stops its sweep too
        sweep.summarise_stopped_sweep(context, continue_with=[command, *overrides])
        return exit_request.code if isinstance(exit_request.code, int) else 1
    except KeyboardInterrupt:  # a second Ctrl+C outside the fit; the run has recorded what it could
        sweep.summarise_stopped_sweep(context, continue_with=[command, *overrides])
        return _fail("aborted by Ctrl+C (SIGINT)", 130)
    except FlagsConflict as error:
        return _fail(str(error))
    except sweep.JobFailed as error:
        sweep.summarise_stopped_sweep(context)
        return _fail(f"the sweep stopped: {error} (hydra.sweeper.max_failure_rate sets how many may fail)", 1)
    except Exception as error:
        message = _configuration_error(error)
        if message is not None:
            return _fail(message)
        if sweep.ended_by_a_plugin(context):  # e.g. Optuna after every trial failed
            sweep.summarise_stopped_sweep(context)
            return _fail(f"the sweep stopped: {type(error).__name__}: {error}", 1)
        raise
    if any(status != "completed" for status in statuses):
        return 1  # the run said why (interrupted, failed)
    return 0


def _trainer_task(context, statuses: list[str]):
    """Hydra's task for one run or sweep job of `context`'s command; appends each run's status."""

    def task(cfg) -> float:
        from hydra.core.hydra_config import HydraConfig

        from sru_lightning.app import sweep
        from sru_lightning.app.runs.run import run

        hydra_config = HydraConfig.get()
        job_overrides = sweep.as_typed(list(hydra_config.overrides.task), list(context.overrides))
        output_dir = Path(hydra_config.runtime.output_dir)
        result = run(cfg, context, output_dir, job_overrides, multirun=sweep.is_multirun(hydra_config))
        statuses.append(result["status"])
        return sweep.job_return(result, hydra_config)

    return task


@contextlib.contextmanager
def _command_line_for_launched_ranks(words: list[str]) -> Iterator[None]:
    """Lightning's DDP launcher starts the other ranks with this process's `sys.argv`: while the
    command runs, it is the command's own (as `python -m sru_lightning` set it, or as a caller of
    :func:`main` passed it); afterwards, what it was. The one place that sets `sys.argv`."""
    previous = sys.argv
    sys.argv = [previous[0] if previous else PROG, *words]
    try:
        yield
    finally:
        sys.argv = previous
