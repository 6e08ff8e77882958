"""`python -m sru_lightning <command> [overrides]`: Hydra-configured fit/validate/test, plus
the package's tool commands (bench, build, fidelity, gpu-check)."""

from __future__ import annotations

import difflib
import importlib
import logging
import math
import sys
import time
import traceback
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sru_lightning._resources import conf_dir

log = logging.getLogger("sru_lightning")

PROG = "python -m sru_lightning"
TRAINER_COMMANDS = {
    "fit": "train a language model (default: SRU on pydoc prose, a few minutes on CPU)",
    "validate": "evaluate on the validation split (load weights with ckpt_path=...)",
    "test": "evaluate on the test split (load weights with ckpt_path=...)",
}
# command -> (module, description); imported only when the command runs.
TOOL_COMMANDS = {
    "bench": ("sru_lightning.diagnostics.bench", "speed and memory of the SRU recurrence vs LSTM and the GEMM floor"),
    "build": ("sru_lightning.ops.build", "compile the C++/CUDA recurrence extension ahead of time"),
    "fidelity": ("sru_lightning.diagnostics.fidelity", "numeric fidelity of every precision policy vs float64"),
    "gpu-check": ("sru_lightning.diagnostics.gpu_check", "end-to-end checks on a CUDA machine"),
}
CHECKPOINT_NAME = "last.ckpt"
# What a run leaves to continue from: the last epoch-end/periodic save, and the checkpoint
# written when a fit is interrupted (conf/callbacks/fault_tolerance.yaml). The newer one wins.
RESUMABLE_NAMES = (CHECKPOINT_NAME, "interrupted.ckpt")


def newest_resumable(folder: Path) -> Path | None:
    """The most recently written of `folder`'s resumable checkpoints, or None."""
    found = [folder / name for name in RESUMABLE_NAMES if (folder / name).is_file()]
    return max(found, key=lambda path: path.stat().st_mtime) if found else None


class UsageError(Exception):
    """A problem with the command line or the configuration; reported without a traceback."""


def _hydra_usage_error(message: str, cause: BaseException | None = None) -> Exception:
    # Hydra prints a CompactHydraException as its message alone (HYDRA_FULL_ERROR=1 for more).
    from hydra.errors import CompactHydraException

    error = CompactHydraException(message)
    error.__cause__ = cause
    return error


# --------------------------------------------------------------------------------------------
# help
def config_groups() -> dict[str, list[str]]:
    """Config group -> its options, read from the installed conf/ tree."""
    root = conf_dir()
    return {
        group.name: sorted(option.stem for option in group.glob("*.yaml"))
        for group in sorted(root.iterdir())
        if group.is_dir() and not group.name.startswith((".", "_")) and group.name != "hydra"
    }


def usage() -> str:
    lines = [f"usage: {PROG} <command> [-m] [group=option ...] [key=value ...]", "", "Commands:"]
    width = max(map(len, [*TRAINER_COMMANDS, *TOOL_COMMANDS])) + 2
    for name, text in TRAINER_COMMANDS.items():
        lines.append(f"  {name:<{width}}{text}")
    for name, (_, text) in TOOL_COMMANDS.items():
        lines.append(f"  {name:<{width}}{text}")
    lines += ["", "Config groups for fit/validate/test (conf/ in the package):"]
    for group, options in config_groups().items():
        lines.append(f"  {group:<{width}}{', '.join(options)}")
    lines += [
        "",
        "Top-level keys: seed, ckpt_path (null | file | run dir | last), resume_dir.",
        "",
        "Examples:",
        f"  {PROG} fit",
        f"  {PROG} fit model=lstm trainer.max_epochs=1",
        f"  {PROG} fit -m trainer.precision=32-true,bf16-true    # a sweep, one dir per job + summary",
        f"  {PROG} fit ckpt_path=last                           # resume the latest matching run",
        f"  {PROG} fit --help                                    # composed config, all keys",
        f"  {PROG} bench --help",
    ]
    return "\n".join(lines)


def _fail(message: str, status: int = 2) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return status


# --------------------------------------------------------------------------------------------
# entry point
def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point; returns the process exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command in TOOL_COMMANDS:
        return _run_tool(command, rest)
    if command in TRAINER_COMMANDS:
        return _run_trainer_command(command, rest)
    if "=" in command or command.startswith("-"):
        return _fail(f"the command must come first, got {command!r}; e.g. `{PROG} fit {' '.join(argv)}`")
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
    import hydra
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import DictConfig

    from sru_lightning import sweep

    original_argv = list(sys.argv)
    statuses: list[str] = []

    def task(cfg: DictConfig) -> dict[str, Any] | None:
        # Lightning's DDP launcher re-runs `sys.argv`; it must include the command again.
        sys.argv = [original_argv[0], command, *overrides]
        try:
            result = run(cfg, command, multirun=_is_multirun(HydraConfig))
        finally:
            sys.argv = [original_argv[0], *overrides]
        statuses.append(result["status"])
        return result

    problem = _unparsable_override(overrides)
    if problem:
        return _fail(problem, 1)
    sweep.last_summary = None
    entry = hydra.main(version_base="1.3", config_path=str(conf_dir()), config_name="config")(task)
    sys.argv = [original_argv[0], *overrides]
    try:
        entry()
    except SystemExit as exit_request:
        return exit_request.code if isinstance(exit_request.code, int) else 1
    finally:
        sys.argv = original_argv
    failed = [row for row in (sweep.last_summary or []) if row["status"] != "completed"]
    if failed or "failed" in statuses:
        count = len(failed) or statuses.count("failed")
        total = len(sweep.last_summary or statuses)
        print(f"{PROG}: {count} of {total} runs did not complete; see the summary above", file=sys.stderr)
        return 1
    return 0


def _unparsable_override(overrides: list[str]) -> str | None:
    """Hydra's parse error names the bad token but not the override; name it here."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser = OverridesParser.create()
    for override in overrides:
        if override.startswith("-") or "=" not in override:
            continue  # Hydra's own flags and their values
        try:
            parser.parse_overrides([override])
        except OverrideParseException as error:
            return f"cannot parse override {override!r}: {error.message.splitlines()[0]}"
    return None


def _is_multirun(hydra_config) -> bool:
    from hydra.types import RunMode

    return hydra_config.get().mode == RunMode.MULTIRUN


# --------------------------------------------------------------------------------------------
# one run
def run(cfg, command: str, *, multirun: bool = False) -> dict[str, Any]:
    """Build everything from `cfg`, run `command`, record the result in the output dir.

    Configuration problems raise a short error (single run) or mark the job failed (sweep:
    the other jobs go on). Errors during training keep their traceback.
    """
    from hydra.core.hydra_config import HydraConfig

    from sru_lightning.sweep import write_result

    output_dir = Path(HydraConfig.get().runtime.output_dir)
    overrides = list(HydraConfig.get().overrides.task)
    record: dict[str, Any] = {"command": command, "overrides": overrides, "status": "running"}
    started = time.monotonic()
    try:
        try:
            trainer, model, datamodule, ckpt_path = build(cfg, command, output_dir)
        except Exception as error:
            if not _is_usage_error(error):
                raise
            raise _hydra_usage_error(_describe(error), error) from error
        metrics = execute(command, trainer, model, datamodule, ckpt_path)
    except Exception as error:
        record.update(status="failed", error=_describe(error), seconds=round(time.monotonic() - started, 1))
        write_result(output_dir, record)
        if not multirun:
            raise
        log.error("job in %s failed: %s\n%s", output_dir, _describe(error), traceback.format_exc())
        return record
    record.update(status="completed", metrics=metrics, seconds=round(time.monotonic() - started, 1))
    if ckpt_path is not None:
        record["ckpt_path"] = str(ckpt_path)
    if trainer.is_global_zero:
        write_result(output_dir, record)
    return record


def _is_usage_error(error: BaseException) -> bool:
    from hydra.errors import InstantiationException
    from lightning.fabric.utilities.exceptions import MisconfigurationException
    from omegaconf.errors import OmegaConfBaseException

    return isinstance(
        error,
        (ValueError, TypeError, FileNotFoundError, PermissionError, UsageError,
         InstantiationException, MisconfigurationException, OmegaConfBaseException, ImportError),
    )


def _describe(error: BaseException) -> str:
    """The message a user needs: Hydra's instantiate wrapper gives way to the real cause."""
    from hydra.errors import InstantiationException

    if isinstance(error, InstantiationException) and error.__cause__ is not None:
        error = error.__cause__
    text = str(error).strip()
    if isinstance(error, UsageError):
        return text
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def build(cfg, command: str, output_dir: Path):
    """Instantiate data, model, callbacks, loggers and trainer from `cfg`."""
    import lightning.pytorch as pl
    from hydra.utils import instantiate

    seed = cfg.get("seed")
    if seed is not None:
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise UsageError(f"`seed` must be an integer or null, got {seed!r}")
        pl.seed_everything(seed, workers=True, verbose=False)
    datamodule = instantiate(cfg.data)
    model = instantiate(cfg.model, vocab_size=datamodule.vocab_size)
    callbacks = [instantiate(node) for node in (cfg.get("callbacks") or {}).values() if node is not None]
    loggers = [instantiate(node) for node in (cfg.get("logger") or {}).values() if node is not None]
    trainer = instantiate(cfg.trainer, callbacks=callbacks, logger=loggers or False)
    ckpt_path = resolve_checkpoint(cfg, command, output_dir)
    earlier = sorted((output_dir / "checkpoints").glob("*.ckpt"))
    if command == "fit" and ckpt_path is None and earlier:
        # A fresh fit would write over them; continuing must be asked for.
        raise UsageError(
            f"the run directory {str(output_dir)!r} already holds checkpoints of an earlier run "
            f"({', '.join(p.name for p in earlier[:3])}); pass ckpt_path=last to continue that run, "
            "or choose another hydra.run.dir"
        )
    return trainer, model, datamodule, ckpt_path


def execute(command: str, trainer, model, datamodule, ckpt_path) -> dict[str, float]:
    """Run the trainer command; return the final metrics, and print the headline line."""
    split = "test" if command == "test" else "val"
    if command == "fit":
        with warnings.catch_warnings():
            # With OnExceptionCheckpoint among the callbacks, Lightning turns a fresh fit's
            # ckpt_path=None into "last" and warns twice; the run directory is new (build()
            # refuses one with checkpoints), so there is nothing to resume and nothing to say.
            warnings.filterwarnings("ignore", message=r".*\.fit\(ckpt_path=None\)` was called without a model")
            warnings.filterwarnings("ignore", message=r".*ckpt_path=\"last\"\) is set, but there is no last checkpoint")
            trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)
        if f"{split}_bpc" not in trainer.callback_metrics and trainer.limit_val_batches != 0:
            trainer.validate(model, datamodule=datamodule, verbose=False)
    elif command == "validate":
        trainer.validate(model, datamodule=datamodule, ckpt_path=ckpt_path)
    else:
        trainer.test(model, datamodule=datamodule, ckpt_path=ckpt_path)
    metrics = {
        name: float(value)
        for name, value in trainer.callback_metrics.items()
        if getattr(value, "numel", lambda: 1)() == 1
    }
    baseline = datamodule.unigram_bpc(split)
    metrics["unigram_bpc"] = baseline
    if trainer.is_global_zero:
        value = metrics.get(f"{split}_bpc", math.nan)
        print(f"final {split}_bpc={value:.4f} (unigram baseline bpc={baseline:.4f})", flush=True)
    return metrics


# --------------------------------------------------------------------------------------------
# checkpoints
def resolve_checkpoint(cfg, command: str, output_dir: Path) -> str | None:
    """Turn the `ckpt_path` setting into a checkpoint file (or None for a fresh start)."""
    from omegaconf import OmegaConf

    setting = cfg.get("ckpt_path")
    if setting is None or str(setting).strip() == "":
        if command != "fit":
            log.warning("%s without ckpt_path: evaluating freshly initialised weights", command)
        return None
    setting = str(setting)
    if setting != "last":
        path = Path(setting).expanduser()
        if path.is_dir():
            for folder in (path / "checkpoints", path):
                candidate = newest_resumable(folder)
                if candidate is not None:
                    return str(candidate.absolute())
            raise UsageError(
                f"`ckpt_path` is the directory {setting!r}, which holds no checkpoints/{CHECKPOINT_NAME} "
                "or checkpoints/interrupted.ckpt; point ckpt_path at a .ckpt file"
            )
        if not path.is_file():
            raise UsageError(f"`ckpt_path` must be a checkpoint file, a run directory or 'last', got {setting!r}, which does not exist")
        return str(path.absolute())

    own = newest_resumable(output_dir / "checkpoints")
    if own is not None:
        return str(own.absolute())
    found = find_last_checkpoint(
        Path(str(cfg.get("resume_dir") or "outputs")),
        OmegaConf.to_container(cfg.model, resolve=True),
        OmegaConf.to_container(cfg.data, resolve=True),
        exclude=output_dir,
    )
    if found is not None:
        log.info("ckpt_path=last: resuming from %s", found)
        print(f"resuming from {found}", flush=True)
        return str(found)
    if command != "fit":
        raise UsageError(
            f"`ckpt_path=last` found no {CHECKPOINT_NAME} of a run with this model and data config "
            f"under resume_dir={cfg.get('resume_dir')!r}; pass ckpt_path=/path/to/file.ckpt"
        )
    log.warning("ckpt_path=last: no earlier checkpoint for this model/data config; starting from scratch")
    return None


def find_last_checkpoint(root: Path, model_config: dict, data_config: dict, exclude: Path | None = None) -> Path | None:
    """Newest resumable checkpoint (`last.ckpt` or `interrupted.ckpt`) under `root` whose run used
    the same model and data config."""
    from omegaconf import OmegaConf

    if not root.is_dir():
        return None
    candidates = []
    for checkpoint in (found for name in RESUMABLE_NAMES for found in root.rglob(f"checkpoints/{name}")):
        run_dir = checkpoint.parent.parent
        if exclude is not None and run_dir.resolve() == exclude.resolve():
            continue
        saved = run_dir / ".hydra" / "config.yaml"
        if not saved.is_file():
            continue
        try:
            config = OmegaConf.load(saved)
            same = (
                OmegaConf.to_container(config.model, resolve=True) == model_config
                and OmegaConf.to_container(config.data, resolve=True) == data_config
            )
        except Exception:  # an unreadable or foreign config is simply not a match
            continue
        if same:
            candidates.append((checkpoint.stat().st_mtime, checkpoint))
    return max(candidates)[1].absolute() if candidates else None
