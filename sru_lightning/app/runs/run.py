"""Build one run from its Hydra config, execute it, and record what happened.

Every run directory ends with a `result.json` that tells the truth about the final weights:
its status (`completed`, `failed`, `interrupted`), the final metrics (validated again when the
last validation is older than the last optimizer step), optimizer steps, tokens per second
and wall time; `history.jsonl` keeps one such record per attempt, so a run resumed into its
own directory keeps the story of every attempt (and its overrides).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import math
import os
import re
import shlex
import signal
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from sru_lightning.app.usage import UsageError

from .checkpoints import CHECKPOINT_NAME, CheckpointError, check_fits_model, saved_codec
from .folder import CHECKPOINTS_DIR, RunFolder, SaveRunConfig, plain_config
from .records import write_record, write_result
from .starting_point import StartingPoint, starting_point
from .threads import set_thread_count, thread_setting_problem
from .trainer_args import check_trainer_settings

log = logging.getLogger("sru_lightning")

# Warnings the user cannot act on: the package's streams define __len__ on purpose (one
# worker, so no duplicates); Lightning's own use of a torch API that torch deprecated.
_QUIET_WARNINGS = (
    r".*Your `IterableDataset` has `__len__` defined.*",
    r".*isinstance\(treespec, LeafSpec\)` is deprecated.*",
    # Resuming into the run's own directory: its checkpoints are expected there.
    r".*Checkpoint directory .* exists and is not empty.*",
)


class RunFailed(Exception):
    """The run failed for a reason the message fully explains (no traceback needed)."""


class LastValidation(Callback):
    """Remembers the optimizer step of the fit's most recent validation, and where its training
    started: the optimizer step and whether it resumed in the middle of an epoch."""

    def __init__(self) -> None:
        super().__init__()
        self.step: int | None = None
        self.start_step: int | None = None
        self.resumed_mid_epoch = False
        self.epochs_ended = 0

    def on_train_start(self, trainer, pl_module) -> None:
        # Not called when a resumed fit has nothing left to train (start_step stays None).
        self.start_step = trainer.global_step
        self.resumed_mid_epoch = trainer.fit_loop.epoch_loop.batch_progress.current.completed > 0
        self.epochs_ended = 0

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.epochs_ended += 1

    def on_validation_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking and trainer.state.fn == "fit":
            self.step = trainer.global_step


class AnnounceRunDirectory(Callback):
    """Prints the run directory once the run is under way: after Lightning has checked the
    settings against the data, so a run refused as a usage error never names a directory."""

    def __init__(self, output_dir: Path) -> None:
        super().__init__()
        self.output_dir = output_dir
        self.said = False

    def _say_once(self, trainer) -> None:
        if not self.said and trainer.is_global_zero and not trainer.sanity_checking:
            self.said = True
            _say(f"run directory: {self.output_dir}")

    def on_train_start(self, trainer, pl_module) -> None:
        self._say_once(trainer)

    def on_validation_start(self, trainer, pl_module) -> None:
        self._say_once(trainer)

    def on_test_start(self, trainer, pl_module) -> None:
        self._say_once(trainer)


# --------------------------------------------------------------------------------------------
# logging
@contextlib.contextmanager
def _visible_logging():
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
            for pattern in _QUIET_WARNINGS:
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


def _say(message: str) -> None:
    """A line for the user on stdout, and in the run's log file."""
    print(message, flush=True)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.emit(logging.LogRecord("sru_lightning", logging.INFO, __file__, 0, message, None, None))


# --------------------------------------------------------------------------------------------
# interruptions
def resume_command(command: str, overrides: list[str], output_dir: Path) -> str:
    """The command that continues this run, started as this run was (python, torchrun or srun)."""
    from .jobs import launcher_words

    launcher, note = launcher_words()
    kept = [item for item in overrides if not item.lstrip("+~").startswith(("ckpt_path=", "hydra.run.dir="))]
    words = [*launcher, command, *kept, f"hydra.run.dir={output_dir}", f"ckpt_path={output_dir}"]
    return " ".join(shlex.quote(word) for word in words) + note


def _interruption_message(command: str, overrides: list[str], output_dir: Path, step: int) -> str:
    newest = RunFolder(output_dir).latest if command == "fit" else None
    if newest is not None and newest.resumable:
        saved_step = newest.step
        where = "" if saved_step == step else f" from step {saved_step} ({newest.path.name})"
        return f"interrupted at step {step}; resume{where} with: {resume_command(command, overrides, output_dir)}"
    return f"interrupted at step {step}; nothing to resume (no checkpoint was written): run the command again"


# --------------------------------------------------------------------------------------------
# one run
@dataclass
class Attempt:
    """One attempt at a run: what was asked, its record so far, and its trainer once built."""

    command: str
    overrides: list[str]
    output_dir: Path
    multirun: bool
    record: dict[str, Any] = field(init=False)
    owner: dict[str, str] = field(init=False)
    parent_pid: int = field(init=False)
    started_at: float = field(init=False)
    rank0_gone: bool | None = field(init=False)
    started: float = field(default_factory=time.monotonic)
    trainer: Any = None

    def __post_init__(self) -> None:
        from .jobs import attempt_owner

        self.owner = attempt_owner(self.output_dir, self.multirun)
        self.parent_pid = os.getppid()  # rank 0, for a rank Lightning's launcher started
        self.started_at = time.time()
        self.rank0_gone: bool | None = None  # decided once, by rank 1, after a lost collective
        self.record = {
            "command": self.command,
            "overrides": self.overrides,
            "status": "running",
            "run_dir": str(self.output_dir),
            "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        }
        if self.owner:
            self.record["owner"] = self.owner

    @property
    def step(self) -> int:
        return self.trainer.global_step if self.trainer is not None else 0

    @property
    def writes_records(self) -> bool:
        """Only rank 0 writes the run's records and speaks (every rank before the trainer exists)."""
        return self.trainer is None or self.trainer.is_global_zero

    def finish(self, status: str, **fields: Any) -> None:
        self.record.update(
            status=status, **fields, optimizer_steps=self.step, wall_seconds=round(time.monotonic() - self.started, 1)
        )


def run(cfg, command: str, output_dir: Path, overrides: list[str], *, multirun: bool = False) -> dict[str, Any]:
    """Build everything from `cfg`, run `command`, record the result in `output_dir`; return the record.

    The outcomes: completed; refused (a configuration problem: a single run exits with status 2
    and leaves its directory as it was, a sweep job is recorded as failed and the others go on);
    interrupted (recorded with the command that resumes it; a sweep stops); failed (recorded; a
    single run exits with status 1 for a failure its message explains, such as a NaN loss, and
    with the traceback otherwise; a sweep job is logged and the others go on).
    """
    from sru_lightning.callbacks.signal_watch import watching_signals

    attempt = Attempt(command, overrides, Path(output_dir).absolute(), multirun)
    with _visible_logging(), watching_signals() as signals:  # no signal may hang a run
        try:
            metrics = _build_and_execute(cfg, attempt, signals)
        except BaseException as error:
            signals.release_launched_ranks()
            return _ended_early(error, attempt)
        signals.release_launched_ranks()
        return _completed(attempt, metrics)


def _build_and_execute(cfg, attempt: Attempt, signals) -> dict[str, float]:
    """The run itself: build, execute the command, check the final metric; the final metrics."""
    try:
        trainer, model, datamodule, start = build(
            cfg, attempt.command, attempt.output_dir, attempt.overrides, owner=attempt.owner
        )
    except Exception as error:
        if not is_usage_error(error):
            raise
        raise UsageError(describe(error, as_usage=True, cfg=cfg)) from error
    attempt.trainer = trainer
    signals.follow(trainer)
    _record_a_watchdog_exit(attempt)
    attempt.record["monitor"] = optimized_metric_name(start.cfg, model)
    ckpt_path = start.checkpoint
    if ckpt_path is not None:
        attempt.record.update(ckpt_path=str(ckpt_path), ckpt_step=start.step)
    if start.changes:
        attempt.record["changes"] = start.changes_record()
    final_checkpoint = None
    if attempt.command == "fit" and any(isinstance(cb, ModelCheckpoint) for cb in trainer.callbacks):
        final_checkpoint = attempt.output_dir / CHECKPOINTS_DIR / CHECKPOINT_NAME
    evaluated_with = None
    if attempt.command != "fit":
        evaluated_with = evaluation_settings(start, trainer, attempt.command)
        attempt.record["evaluated_with"] = evaluated_with
    try:
        metrics = execute(attempt.command, trainer, model, datamodule, ckpt_path, final_checkpoint, evaluated_with)
    except Exception as error:
        if _refused_before_training(error, trainer):
            raise UsageError(describe(error, as_usage=True)) from error
        raise
    _check_final_metric(metrics, bits_name(model, "test" if attempt.command == "test" else "val"))
    return metrics


def _record_a_watchdog_exit(attempt: Attempt) -> None:
    """A stop that cannot finish ends in the stop watchdog's `os._exit`, past every `finally`:
    the watchdog first calls back here, from its thread, to write the record and the log line."""
    from sru_lightning.callbacks.interrupts import GracefulInterrupt

    def record(message: str) -> None:
        if not attempt.writes_records:
            return
        attempt.finish("interrupted", error=f"ended by the stop watchdog: {message}")
        write_record(attempt.output_dir, attempt.record)
        for handler in list(logging.getLogger().handlers):  # no logging call: its locks may be held
            if isinstance(handler, logging.FileHandler):
                with open(handler.baseFilename, "a", encoding="utf-8") as log_file:
                    log_file.write(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}][sru_lightning][ERROR] - {message}\n")

    for callback in attempt.trainer.callbacks:
        if isinstance(callback, GracefulInterrupt):
            callback.before_watchdog_exit.append(record)


def _check_final_metric(metrics: dict[str, float], final_name: str) -> None:
    """Raise RunFailed when the final bits-per-token metric is not finite."""
    final = metrics.get(final_name, 0.0)
    if not math.isfinite(final):
        raise RunFailed(
            f"the final {final_name} is {final}: the model's outputs are "
            "not finite (see the training loss in the logs; a smaller learning rate or bf16 instead of "
            "fp16 usually helps)"
        )


def _completed(attempt: Attempt, metrics: dict[str, float]) -> dict[str, Any]:
    """Record a completed run and name its directory."""
    from sru_lightning.callbacks.throughput import TrainingThroughput

    record, trainer = attempt.record, attempt.trainer
    attempt.finish("completed", metrics=metrics)
    if attempt.multirun and record["monitor"] not in metrics:
        log.warning(
            "`optimized_metric` names %r, which this run did not log (it logged %s); the sweep gets nan for it",
            record["monitor"],
            ", ".join(sorted(metrics)),
        )
    throughput = next((cb for cb in trainer.callbacks if isinstance(cb, TrainingThroughput)), None)
    if throughput is not None and throughput.tokens:
        record.update(train_tokens=throughput.tokens, tokens_per_second=round(throughput.tokens_per_second, 1))
    if trainer.is_global_zero:
        write_record(attempt.output_dir, record)
        _say(f"run directory: {attempt.output_dir}")
    return record


def _ended_early(error: BaseException, attempt: Attempt) -> dict[str, Any]:
    """The attempt did not complete: refused (a usage error), interrupted, or failed."""
    from sru_lightning.callbacks.interrupts import interruption_cause

    if isinstance(error, UsageError) and not attempt.multirun:
        _refused(error, attempt)
    cause = interruption_cause(attempt.trainer, error)
    if cause is None:
        error = _name_a_lost_process(attempt, error)
    attempt.finish("interrupted" if cause is not None else "failed", error=cause or describe(error))
    requeue = cause is not None and _stopped_for_requeue(attempt)
    if requeue:
        attempt.record["requeue"] = "asked"  # written before asking: a requeue ends this process
    if attempt.writes_records or _rank0_is_gone(attempt, error):
        write_record(attempt.output_dir, attempt.record, keep_result=isinstance(error, UsageError))
    if cause is not None:
        return _interrupted(error, attempt, requeue)
    return _failed(error, attempt)


#: What a collective says when a peer process has gone (gloo, NCCL).
_PEER_LOST = (
    "Connection reset by peer",
    "Connection closed by peer",
    "Broken pipe",
    "Connection refused",
    "NCCL communicator was aborted",
    "remote process exited",
)


def _peer_lost(error: BaseException) -> bool:
    return any(words in str(error) for words in _PEER_LOST)


def _name_a_lost_process(attempt: Attempt, error: BaseException) -> BaseException:
    """A collective that failed because another process of the run died (killed, crashed) becomes
    one line naming that process, when this process launched it (rank 0 under Lightning's
    launcher), instead of the collective's traceback."""
    trainer = attempt.trainer
    if trainer is None or trainer.world_size < 2 or not isinstance(error, Exception) or not _peer_lost(error):
        return error
    said = next(words for words in _PEER_LOST if words in str(error))
    first_line = f"its collective said: {said}"
    if _rank0_is_gone(attempt, error):
        who = f"rank 0 (pid {attempt.parent_pid})" if os.getppid() != attempt.parent_pid else "rank 0"
        return RunFailed(
            f"{who} ended, so rank {trainer.global_rank} could not go on "
            f"({first_line}); rank {trainer.global_rank} wrote this record"
        )
    from sru_lightning.callbacks.signal_watch import SignalWatch

    launcher = getattr(trainer.strategy, "launcher", None)
    watch = SignalWatch.current
    launched = getattr(launcher, "procs", None) or (watch.released_ranks if watch is not None else [])
    for local_rank, process in enumerate(launched, start=1):
        try:
            code = process.wait(timeout=5)
        except Exception:  # noqa: BLE001 - still running (or not ours to wait for): not the lost one
            continue
        if code:
            how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with status {code}"
            return RunFailed(
                f"rank {local_rank} (pid {process.pid}) {how}, so rank {trainer.global_rank} could not "
                f"go on ({first_line})"
            )
    return RunFailed(f"another process of this run ended, so rank {trainer.global_rank} could not go on ({first_line})")


def _rank0_is_gone(attempt: Attempt, error: BaseException) -> bool:
    """Rank 0 writes the run's record; when it was killed, rank 1 writes it instead. Rank 0 is
    gone when the process that launched this rank is (Lightning's launcher), or when it has
    written no record of this attempt a few seconds after the collective failed."""
    trainer = attempt.trainer
    if trainer is None or trainer.global_rank != 1 or not _peer_lost(error):
        return False
    if attempt.rank0_gone is None:
        if os.getppid() != attempt.parent_pid:
            attempt.rank0_gone = True
        else:
            result = attempt.output_dir / "result.json"
            deadline = time.monotonic() + 3.0
            while time.monotonic() < deadline and not _written_since(result, attempt.started_at):
                time.sleep(0.2)
            attempt.rank0_gone = not _written_since(result, attempt.started_at)
    return attempt.rank0_gone


def _written_since(path: Path, moment: float) -> bool:
    try:
        return path.stat().st_mtime >= moment
    except OSError:
        return False


#: Signals a scheduler sends ahead of a preemption or time limit (`#SBATCH --signal=USR1@90`,
#: submitit's USR2): the job stops with a checkpoint and is requeued to continue the run.
REQUEUE_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)


def _stopped_for_requeue(attempt: Attempt) -> bool:
    from sru_lightning.callbacks.interrupts import GracefulInterrupt

    from .jobs import slurm_job

    graceful = next(
        (cb for cb in getattr(attempt.trainer, "callbacks", None) or [] if isinstance(cb, GracefulInterrupt)), None
    )
    return (
        graceful is not None
        and graceful.stop_signal in REQUEUE_SIGNALS
        and not graceful.aborted
        and slurm_job() is not None
    )


def _requeue(attempt: Attempt) -> None:
    """Rank 0 asks SLURM to requeue the job once the run's record is written; says what happened."""
    from .jobs import requeue_own_job

    outcome = requeue_own_job()
    _say(outcome)
    if not outcome.startswith("requeued"):
        attempt.record["requeue"] = outcome
        write_result(attempt.output_dir, attempt.record)


def _refused(error: UsageError, attempt: Attempt) -> NoReturn:
    """A single run refused before it started: the run directory is left as it was (or removed);
    exit status 2."""
    from .directories import restore_after_usage_error, usage_exit

    restore_after_usage_error(attempt.output_dir)
    raise usage_exit(str(error)) from None


def _interrupted(error: BaseException, attempt: Attempt, requeue: bool = False) -> dict[str, Any]:
    """Say how to resume (and requeue the job after a scheduler's warning signal); a single run
    returns its record, a sweep stops (the error goes on)."""
    if attempt.writes_records:
        _say(_interruption_message(attempt.command, attempt.overrides, attempt.output_dir, attempt.step))
        if requeue:
            _requeue(attempt)
    if attempt.multirun:
        raise error
    return attempt.record


def _failed(error: BaseException, attempt: Attempt) -> dict[str, Any]:
    """A sweep job's failure is logged and the sweep goes on; a single run's ends the command.
    Anything that is not an Exception (SystemExit, ...) goes on as it is."""
    from sru_lightning.callbacks.nonfinite_loss import NonFiniteLossError
    from sru_lightning.strategies import CheckpointWriteError

    if isinstance(error, (NonFiniteLossError, CheckpointWriteError)):
        error = RunFailed(str(error))
    if not isinstance(error, Exception):
        raise error
    if not isinstance(error, (UsageError, RunFailed)):
        _log_traceback_to_file(error)
    if not attempt.multirun:
        _single_run_failed(error, attempt)
    log.error("job in %s failed: %s", attempt.output_dir, describe(error))
    return attempt.record


def _single_run_failed(error: Exception, attempt: Attempt) -> NoReturn:
    """Keep the attempt's config beside the run's own and name the directory. A failure the
    message fully explains (RunFailed) exits with status 1 in one line; anything else goes on
    with its traceback."""
    from sru_lightning.app.usage import error_exit

    from .directories import keep_config_beside

    keep_config_beside(attempt.output_dir)
    _say(f"run directory: {attempt.output_dir} (failed)")
    if isinstance(error, RunFailed):
        raise error_exit(str(error), 1) from None
    raise error


def _refused_before_training(error: BaseException, trainer) -> bool:
    """Before any training step: the optimizer or schedule config refused by the class it builds
    (`model.optimizer.lr=abc`), or Lightning checking the settings against the data (a
    `val_check_interval` longer than the epoch). A usage error, not a failure."""
    from hydra.errors import InstantiationException
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    if trainer.global_step > 0:
        return False
    if isinstance(error, InstantiationException):
        return True
    if not isinstance(error, (ValueError, MisconfigurationException)):
        return False
    frames = traceback_frames(error)
    return bool(frames) and f"{os.sep}lightning{os.sep}" in frames[-1]


def traceback_frames(error: BaseException) -> list[str]:
    files = []
    trace = error.__traceback__
    while trace is not None:
        files.append(trace.tb_frame.f_code.co_filename)
        trace = trace.tb_next
    return files


def _log_traceback_to_file(error: BaseException) -> None:
    """The traceback of an unexpected failure, for the run's log file only (the console gets one line)."""
    import traceback

    text = "".join(traceback.format_exception(error))
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.emit(logging.LogRecord("sru_lightning", logging.ERROR, __file__, 0, text, None, None))


def optimized_metric_name(cfg, model) -> str:
    """The metric a sweep optimises: `optimized_metric`, else the checkpoint callback's monitor."""
    name = cfg.get("optimized_metric")
    if not name:
        checkpoint = (cfg.get("callbacks") or {}).get("model_checkpoint") or {}
        name = checkpoint.get("monitor") or "val_bpc"
    for stage in ("train", "val", "test"):  # val_bpc is val_bpw for word-level data
        name = name.replace(f"{stage}_bpc", bits_name(model, stage))
    return str(name)


def is_usage_error(error: BaseException) -> bool:
    from hydra.errors import InstantiationException
    from lightning.fabric.utilities.exceptions import MisconfigurationException
    from omegaconf.errors import OmegaConfBaseException

    return isinstance(
        error,
        (
            ValueError,
            TypeError,
            FileNotFoundError,
            PermissionError,
            UsageError,
            CheckpointError,
            InstantiationException,
            MisconfigurationException,
            OmegaConfBaseException,
            ImportError,
        ),
    )


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


# --------------------------------------------------------------------------------------------
# building
def build(cfg, command: str, output_dir: Path, overrides: list[str], owner: dict[str, str] | None = None):
    """Instantiate data, model, callbacks, loggers and trainer from `cfg`; `owner` is the job
    the run belongs to (:func:`.jobs.attempt_owner`)."""
    import lightning.pytorch as pl
    from hydra.utils import instantiate
    from lightning.pytorch.callbacks import Checkpoint, LearningRateMonitor, ModelCheckpoint, ProgressBar
    from omegaconf import OmegaConf

    from sru_lightning.callbacks import SRUPrecisionCallback
    from sru_lightning.callbacks.throughput import TrainingThroughput
    from sru_lightning.callbacks.validate_before_stop import ValidateBeforeStop
    from sru_lightning.nn.policy import iter_sru_cells

    from .directories import evaluated_run

    start = starting_point(cfg, command, output_dir, overrides, evaluated_run(output_dir), owner)
    cfg = start.cfg
    if start.checkpoint is not None:
        _say_where_it_starts(command, start)
        if start.config_source == "the settings saved with the checkpoint":
            _record_attempt_config(cfg, output_dir)
    seed = cfg.get("seed")
    if seed is not None:
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise UsageError(f"`seed` must be an integer or null, got {seed!r}")
        pl.seed_everything(seed, workers=True, verbose=False)
    if thread_setting_problem(cfg.get("threads")):
        raise UsageError(thread_setting_problem(cfg.get("threads")))
    trainer_settings = OmegaConf.to_container(cfg.trainer, resolve=True)
    check_trainer_settings(trainer_settings)
    ckpt_path = start.checkpoint
    model_config, data_config = cfg.model, cfg.data
    datamodule = instantiate(data_config)
    if command != "fit" and ckpt_path is not None:
        # Token ids mean what they meant in training.
        _encode_with_the_checkpoints_vocabulary(datamodule, ckpt_path)
    model_kwargs = {} if "vocab_size" in model_config and command != "fit" else {"vocab_size": datamodule.vocab_size}
    if hasattr(datamodule, "token_unit"):  # the data decides what a token is, and so the metric names
        model_kwargs["token_unit"] = datamodule.token_unit
    model = instantiate(model_config, **model_kwargs)
    if command == "fit" and ckpt_path is not None:
        check_fits_model(ckpt_path, model)
    if getattr(model.hparams, "vocab_size", datamodule.vocab_size) != datamodule.vocab_size:
        raise UsageError(
            f"the checkpoint {ckpt_path!r} was trained with a vocabulary of {model.hparams.vocab_size} tokens, but "
            f"the data ({data_config.get('_target_')}) has {datamodule.vocab_size}; evaluate it on the data it was "
            "trained on (see data: in its run directory's .hydra/config.yaml)"
        )
    callbacks = [
        instantiate(node, **metric_names_followed(node, model))
        for node in (cfg.get("callbacks") or {}).values()
        if node is not None
    ]
    if not any(True for _ in iter_sru_cells(model)):
        # An LSTM baseline has no SRU layer by design: the precision callback has nothing to do or say.
        callbacks = [cb for cb in callbacks if not isinstance(cb, SRUPrecisionCallback)]
    loggers = [instantiate(node) for node in (cfg.get("logger") or {}).values() if node is not None]
    if not loggers:
        monitors = [cb for cb in callbacks if isinstance(cb, LearningRateMonitor)]
        if monitors:
            log.info("logger=none: the learning-rate monitor has nowhere to log and is left out")
            callbacks = [cb for cb in callbacks if not isinstance(cb, LearningRateMonitor)]
    if trainer_settings.get("enable_progress_bar", True) is False:
        # +trainer.enable_progress_bar=false wins over the progress bar among the callbacks.
        callbacks = [cb for cb in callbacks if not isinstance(cb, ProgressBar)]
    if trainer_settings.get("enable_checkpointing", True) is False:
        # +trainer.enable_checkpointing=false wins over the checkpoint callbacks among the callbacks
        # (the interruption checkpoint too: such a run writes none).
        callbacks = [cb for cb in callbacks if not isinstance(cb, Checkpoint)]
    elif not any(isinstance(cb, ModelCheckpoint) for cb in callbacks):
        # Lightning's default would write under the logger's folder (csv/...); keep them in the run's.
        callbacks.append(
            ModelCheckpoint(dirpath=output_dir / CHECKPOINTS_DIR, save_last=True, enable_version_counter=False)
        )
    # Part of every run: validating the final weights of a max_steps stop, throughput, freshness.
    if not any(isinstance(cb, ValidateBeforeStop) for cb in callbacks):
        callbacks.append(ValidateBeforeStop())
    callbacks += [
        TrainingThroughput(),
        LastValidation(),
        AnnounceRunDirectory(output_dir),
        SaveRunConfig(plain_config(cfg), owner),
        *start.callbacks(),
    ]
    trainer = instantiate(cfg.trainer, callbacks=callbacks, logger=loggers or False, **_run_plugins(cfg))
    set_thread_count(cfg.get("threads"), trainer.num_devices)  # before Lightning launches the other ranks
    check_sizes = getattr(datamodule, "check_sizes", None)
    if check_sizes is not None:  # too little text for the batch layout: say so before training
        check_sizes(world_size=trainer.world_size)
    return trainer, model, datamodule, start


def _run_plugins(cfg) -> dict[str, Any]:
    """The Trainer plugins every run has (unless the config names its own `trainer.plugins`):

    * checkpoint files that are complete or absent, and a write failure naming its file
      (`AtomicCheckpointIO`; DeepSpeed writes its shard folders itself);
    * under SLURM, Lightning's own SIGUSR1 handling off: it saves a checkpoint inside the signal
      handler (a collective there can hang DDP) and restores its own `hpc_ckpt` files on a
      requeue, outside the run's checkpoints. The run's GracefulInterrupt stops on SIGUSR1 at an
      agreed batch boundary instead, and the run requeues the job (:func:`.jobs.requeue_own_job`).
    """
    from lightning.fabric.plugins.environments import SLURMEnvironment

    from sru_lightning.strategies import AtomicCheckpointIO

    if "plugins" in cfg.trainer:
        return {}
    plugins: list[Any] = []
    if "DeepSpeed" not in _strategy_name(cfg):
        plugins.append(AtomicCheckpointIO())
    if SLURMEnvironment.detect():
        try:
            plugins.append(SLURMEnvironment(auto_requeue=False))
        except RuntimeError as error:  # Lightning's check of the srun layout (`srun -n 2`)
            raise UsageError(
                f"the SLURM task layout does not fit a Lightning run: {str(error).strip()} (start one task per "
                "process with `srun --ntasks-per-node=N` and trainer.devices=N)"
            ) from None
    return {"plugins": plugins} if plugins else {}


def _strategy_name(cfg) -> str:
    strategy = cfg.trainer.get("strategy")
    return str(strategy.get("_target_", "")) if hasattr(strategy, "get") else str(strategy or "")


def _say_where_it_starts(command: str, start: StartingPoint) -> None:
    """Which checkpoint the attempt starts from, and every setting it changes against the run."""
    verb = "resuming" if command == "fit" else "evaluating"
    log.info("%s %s (step %d) with %s", verb, start.checkpoint, start.step, start.config_source)
    for change in start.changes:
        how = "not used by evaluation" if change.action == "unused" else "applied"
        log.info("changed setting: %s (%s)", change, how)


def _record_attempt_config(cfg, output_dir: Path) -> None:
    """`.hydra/config.yaml` of this attempt says what it runs with: the run's own settings and
    the command line's on top (Hydra wrote the composed config before the run was known)."""
    from omegaconf import OmegaConf

    from .directories import attempt_config_path

    path = attempt_config_path(output_dir)
    if path is not None and path.is_file():
        OmegaConf.save(cfg, path)


def _encode_with_the_checkpoints_vocabulary(datamodule, ckpt_path: str) -> None:
    """Token ids mean what they meant in training: evaluation data is encoded with the checkpoint's
    vocabulary (a character it lacks is an error; an unknown word is counted as the unknown word)."""
    codec = saved_codec(ckpt_path)
    adopt = getattr(datamodule, "adopt_vocabulary", None)
    if codec is None or adopt is None:
        return
    unknown = adopt(codec)
    if unknown:
        log.warning(
            "%d words of the evaluation data are not in the checkpoint's vocabulary of %d words; each counts as %r",
            unknown,
            codec.vocab_size,
            codec.unknown,
        )


def bits_name(model, stage: str) -> str:
    """The model's bits-per-token metric of `stage`: `val_bpc`, or `val_bpw` for word-level data."""
    name = getattr(model, "bits_name", None)
    return name(stage) if callable(name) else f"{stage}_bpc"


def metric_names_followed(node, model) -> dict[str, str]:
    """A callback's `monitor` / `filename` settings that name the character-level metrics
    (conf/callbacks/model_checkpoint.yaml: val_bpc), renamed to the ones the model logs."""
    renamed = {}
    for key in ("monitor", "filename"):
        value = node.get(key) if hasattr(node, "get") else None
        if not isinstance(value, str):
            continue
        new = value
        for stage in ("train", "val", "test"):
            new = new.replace(f"{stage}_bpc", bits_name(model, stage))
        if new != value:
            renamed[key] = new
    return renamed


# --------------------------------------------------------------------------------------------
# executing
def evaluation_settings(start: StartingPoint, trainer, command: str) -> dict[str, Any]:
    """What an evaluation's number depends on besides the weights: the checkpoint and its step,
    the data settings and the batch limit, and the settings changed against the run."""
    from omegaconf import OmegaConf

    data = OmegaConf.to_container(start.cfg.data, resolve=True)
    shown = {"data": str(data.get("_target_", "?")).rsplit(".", 1)[-1]}
    shown.update({key: value for key, value in data.items() if not key.startswith("_")})
    limit = trainer.limit_test_batches if command == "test" else trainer.limit_val_batches
    if limit not in (None, 1.0):
        shown[f"limit_{'test' if command == 'test' else 'val'}_batches"] = limit
    changed = [change.key for change in start.changes if change.key.startswith("data.")]
    return {
        "checkpoint": start.checkpoint,
        "step": start.step,
        "settings": shown,
        "settings_from": start.config_source,
        "changed": changed,
    }


def _evaluation_text(evaluated_with: dict[str, Any]) -> str:
    settings = " ".join(f"{key}={value}" for key, value in evaluated_with["settings"].items())
    changed = evaluated_with["changed"]
    origin = f"the run's settings except {', '.join(changed)}" if changed else evaluated_with["settings_from"]
    return f"; step {evaluated_with['step']} of {evaluated_with['checkpoint']}, {settings} ({origin})"


def execute(
    command: str,
    trainer,
    model,
    datamodule,
    ckpt_path: str | None = None,
    final_checkpoint: Path | None = None,
    evaluated_with: dict[str, Any] | None = None,
) -> dict[str, float]:
    """Run the trainer command; return the final metrics, and print the headline line.
    A fit whose last saved checkpoint is older than its final weights saves them as
    `final_checkpoint`, so the run's newest checkpoint is its final state."""
    split = "test" if command == "test" else "val"
    bits = bits_name(model, split)  # val_bpc, or val_bpw for word-level data
    unit = bits.split("_", 1)[1]
    training_metrics: dict[str, float] = {}
    if command == "fit":
        trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path, **_safe_loading(trainer.fit))
        if final_checkpoint is not None:
            _save_final_weights(trainer, final_checkpoint)
        # A validation of the final weights replaces the trainer's metrics; the training ones stay.
        training_metrics = _training_metrics(trainer)
        _validate_final_weights(trainer, model, datamodule, bits)
    elif command == "validate":
        trainer.validate(model, datamodule=datamodule, ckpt_path=ckpt_path, **_safe_loading(trainer.validate))
    else:
        trainer.test(model, datamodule=datamodule, ckpt_path=ckpt_path, **_safe_loading(trainer.test))
    metrics = _scalar_metrics(trainer)
    if command == "fit":
        metrics = {
            **training_metrics,
            **{name: value for name, value in metrics.items() if not name.startswith("train_")},
        }
    baseline = datamodule.unigram_bpc(split)  # bits per token, whatever the token is
    metrics[f"unigram_{unit}"] = baseline
    if trainer.is_global_zero:
        value = metrics.get(bits)
        if value is None:
            train_name = bits_name(model, "train")
            train = metrics.get(train_name)
            text = f"{train_name}={train:.4f}" if train is not None else "no metric"
            _say(f"final {text} (no validation: trainer.limit_val_batches=0; unigram baseline {unit}={baseline:.4f})")
        else:
            where = _evaluation_text(evaluated_with) if evaluated_with else ""
            _say(f"final {bits}={value:.4f} (unigram baseline {unit}={baseline:.4f}{where})")
    return metrics


def _save_final_weights(trainer, path: Path) -> None:
    """Save the fit's final state as `path` when no checkpoint of the run holds it yet (a stop by
    max_time or max_steps between validations). Rank 0 decides, every rank takes part in the save."""
    from sru_lightning.callbacks.interrupts import _put_in_place

    newest = RunFolder(path.parent.parent).latest if trainer.is_global_zero else None
    needed = newest is None or newest.step < trainer.global_step
    if not trainer.strategy.broadcast(needed and trainer.global_step > 0):
        return
    log.info(
        "Saving the final weights (step %d) as %s: the run's newest checkpoint was older", trainer.global_step, path
    )
    partial = f"{path}.partial"
    trainer.save_checkpoint(partial, weights_only=False)
    if trainer.is_global_zero and os.path.exists(partial):
        _put_in_place(partial, str(path))
    trainer.strategy.barrier("final-weights-saved")


def _scalar_metrics(trainer) -> dict[str, float]:
    return {
        name: float(value)
        for name, value in trainer.callback_metrics.items()
        if getattr(value, "numel", lambda: 1)() == 1
    }


def _training_metrics(trainer) -> dict[str, float]:
    """The fit's training metrics, named for what they cover: after a resume in the middle of an
    epoch, the epoch means cover only the batches since the resume (`train_bpc_since_resume`)."""
    tracker = next((cb for cb in trainer.callbacks if isinstance(cb, LastValidation)), None)
    # Epoch means are logged at each epoch's end: only the first one after a mid-epoch resume is partial.
    partial = tracker is not None and tracker.resumed_mid_epoch and tracker.epochs_ended <= 1
    metrics = {}
    for name, value in _scalar_metrics(trainer).items():
        if not name.startswith("train_"):
            continue
        if partial and name.endswith("_epoch"):
            name = name[: -len("_epoch")] + "_since_resume"
        metrics[name] = value
    return metrics


def _safe_loading(method) -> dict[str, bool]:
    """`weights_only=True` where this Lightning accepts it: checkpoints are untrusted input."""
    return {"weights_only": True} if "weights_only" in inspect.signature(method).parameters else {}


def _validate_final_weights(trainer, model, datamodule, final_metric: str) -> None:
    from sru_lightning.callbacks import SRUPrecisionCallback

    if trainer.limit_val_batches == 0:
        return
    tracker = next((cb for cb in trainer.callbacks if isinstance(cb, LastValidation)), None)
    last_step = tracker.step if tracker is not None else None
    if final_metric in trainer.callback_metrics and last_step == trainer.global_step:
        return
    if last_step is not None:
        where = f"the last validation ran at step {last_step}"
    elif tracker is not None and tracker.start_step in (None, trainer.global_step):
        where = f"the fit resumed at step {trainer.global_step} and trained no further"
    else:
        where = "no validation ran in this fit"
    log.info("Validating the final weights (step %d): %s", trainer.global_step, where)
    precision_reports = [cb for cb in trainer.callbacks if isinstance(cb, SRUPrecisionCallback)]
    verbose = [getattr(cb, "verbose", False) for cb in precision_reports]
    for callback in precision_reports:  # the fit already printed the precision table
        callback.verbose = False
    try:
        trainer.validate(model, datamodule=datamodule, verbose=False)
    finally:
        for callback, was in zip(precision_reports, verbose):
            callback.verbose = was
