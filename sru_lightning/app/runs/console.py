"""What a run says, and where: Lightning's messages on the console and in the run's log file,
the lines written for the user (:func:`say`), the command that resumes an interrupted run, and
an error told in the user's terms (:func:`describe`).
"""

from __future__ import annotations

import contextlib
import logging
import re
import warnings
from pathlib import Path

from sru_lightning.app.usage import UsageError

from .checkpoints import CheckpointError
from .folder import RunFolder

log = logging.getLogger("sru_lightning")

# Warnings the user cannot act on: the package's streams define __len__ on purpose (one
# worker, so no duplicates); Lightning's own use of a torch API that torch deprecated.
_QUIET_WARNINGS = (
    r".*Your `IterableDataset` has `__len__` defined.*",
    r".*isinstance\(treespec, LeafSpec\)` is deprecated.*",
    # Mixed precision keeps the weights in float32, which is what the summary then assumes:
    # its size estimate is right.
    r".*Precision (bf16-|16-)?mixed is not supported by the model summary.*",
    # Resuming into the run's own directory: its checkpoints are expected there.
    r".*Checkpoint directory .* exists and is not empty.*",
)


class RunFailed(Exception):
    """The run failed for a reason the message fully explains (no traceback needed)."""


# --------------------------------------------------------------------------------------------
# the console and the log file
# Evaluating a checkpoint restores no callback state: Lightning's advice to add the callbacks
# that wrote it is about resuming a fit.
_QUIET_WHEN_EVALUATING = (r".*callbacks used to create the checkpoint need to be provided.*",)


@contextlib.contextmanager
def visible_logging(command: str = "fit"):
    """Lightning's info messages (the precision report among them) and warnings reach the
    console and the run's log file through Hydra's handlers, each once; known noise does not."""
    restore = []
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logger = logging.getLogger(name)
        own = [handler for handler in logger.handlers if type(handler) is logging.StreamHandler]
        restore.append((logger, logger.propagate, own))
        for handler in own:
            logger.removeHandler(handler)
        logger.propagate = True
        logger.setLevel(logging.INFO)
    logging.captureWarnings(True)
    handlers = logging.getLogger().handlers
    for handler in handlers:
        handler.addFilter(_drop_advertising)
    try:
        with warnings.catch_warnings():
            for pattern in _QUIET_WARNINGS + (_QUIET_WHEN_EVALUATING if command != "fit" else ()):
                warnings.filterwarnings("ignore", message=pattern)
            yield
    finally:
        for handler in handlers:
            handler.removeFilter(_drop_advertising)
        logging.captureWarnings(False)
        for logger, propagate, own in restore:
            logger.propagate = propagate
            for handler in own:
                logger.addHandler(handler)


def _drop_advertising(record: logging.LogRecord) -> bool:
    # Lightning's "Tip: try installing <product>" lines are not about the run.
    return not str(record.msg).startswith("\N{ELECTRIC LIGHT BULB} Tip:")


def say(message: str) -> None:
    """A line for the user on stdout, and in the run's log file."""
    print(message, flush=True)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.emit(logging.LogRecord("sru_lightning", logging.INFO, __file__, 0, message, None, None))


def log_traceback_to_file(error: BaseException) -> None:
    """The traceback of an unexpected failure, for the run's log file only (the console gets one line)."""
    import traceback

    text = "".join(traceback.format_exception(error))
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.emit(logging.LogRecord("sru_lightning", logging.ERROR, __file__, 0, text, None, None))


# --------------------------------------------------------------------------------------------
# interruptions
def resume_command(command: str, overrides: list[str], output_dir: Path) -> str:
    """The command that continues this run, started as this run was (python, torchrun or srun)."""
    from sru_lightning.app.override_text import command_line, override

    from .jobs import launcher_words

    launcher, note = launcher_words()
    kept = [item for item in overrides if not item.lstrip("+~").startswith(("ckpt_path=", "hydra.run.dir="))]
    # The folder quoted for Hydra (an apostrophe, a space, `ü`), then every word for the shell.
    folder = str(output_dir)
    words = [*launcher, command, *kept, override("hydra.run.dir", folder), override("ckpt_path", folder)]
    return command_line(words) + note


def interruption_message(command: str, overrides: list[str], output_dir: Path, step: int) -> str:
    """Where an interrupted run stopped, and how to resume it (or that nothing can be resumed)."""
    newest = RunFolder(output_dir).latest if command == "fit" else None
    if newest is not None and newest.resumable:
        saved_step = newest.step
        where = "" if saved_step == step else f" from step {saved_step} ({newest.path.name})"
        return f"interrupted at step {step}; resume{where} with: {resume_command(command, overrides, output_dir)}"
    return f"interrupted at step {step}; nothing to resume (no checkpoint was written): run the command again"


# --------------------------------------------------------------------------------------------
# errors
def describe(error: BaseException, as_usage: bool = False, cfg=None) -> str:
    """The message a user needs: Hydra's instantiate wrapper gives way to the real cause. A
    usage error (`as_usage`) is told in the user's terms, without the Python class name."""
    from hydra.errors import InstantiationException

    target = None
    if isinstance(error, InstantiationException) and error.__cause__ is not None:
        found = re.search(r"target '([\w.]+)'", str(error))
        target = found.group(1) if found else None
        error = error.__cause__
    text = str(error).strip()
    from sru_lightning.strategies.deepspeed import HardwareRefusesDtype

    if isinstance(error, HardwareRefusesDtype):  # names the engine, the dtype and what works instead
        return text
    if target and target.split(".")[-1] not in text:  # name what was being built
        text = f"{target}: {text}"
    from sru_lightning.strategies import CheckpointWriteError

    if isinstance(error, (UsageError, CheckpointError, RunFailed, CheckpointWriteError)):
        return text
    text += _no_gpu_hint(text, cfg)
    if as_usage and text:
        return text
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _no_gpu_hint(text: str, cfg=None) -> str:
    """What to do when a GPU trainer config (trainer=ddp, fsdp, deepspeed_*) meets no GPU."""
    import torch

    lowered = text.lower()
    # Lightning's words when the accelerator a config asks for is not there.
    no_gpu = "no supported gpu backend" in lowered or "accelerator is not available" in lowered
    if torch.cuda.is_available() or not no_gpu:
        return ""
    strategy = cfg.trainer.get("strategy") if cfg is not None and "trainer" in cfg else None
    target = str(strategy.get("_target_", "")) if hasattr(strategy, "get") else str(strategy or "")
    if target.endswith("lightning.pytorch.strategies.DDPStrategy") or target == "ddp":
        # Its NCCL backend has no CPU form: the gloo config is the CPU one.
        return "; this machine has no CUDA GPU: use trainer=ddp_cpu to run DDP on CPU processes"
    return "; this machine has no CUDA GPU: add trainer.accelerator=cpu trainer.devices=2 to run on CPU processes"
