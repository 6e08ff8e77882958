"""How one attempt at a run ends, one exit per outcome: completed, refused (a usage error),
interrupted (with the command that resumes it, and a requeue after a scheduler's warning
signal), or failed (a lost peer process named, the traceback of anything unexpected in the
run's log). Only rank 0 writes the run's records, unless rank 0 is gone.
"""

from __future__ import annotations

import logging
import math
import os
import re
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from sru_lightning.app.signal_watch import WARNING_SIGNALS
from sru_lightning.app.usage import UsageError

from .console import RunFailed, describe, interruption_message, log_traceback_to_file, say
from .context import RunContext
from .folder import RunFolder

log = logging.getLogger("sru_lightning")


@dataclass
class Attempt:
    """One attempt at a run: what was asked, its record so far, and its trainer once built."""

    command: str
    overrides: list[str]
    output_dir: Path
    multirun: bool
    context: RunContext
    record: dict[str, Any] = field(init=False)
    owner: dict[str, str] = field(init=False)
    parent_pid: int = field(init=False)
    started_at: float = field(init=False)
    rank0_gone: bool | None = field(init=False)
    started: float = field(default_factory=time.monotonic)
    trainer: Any = None
    signal_watch: Any = None  # the process's SignalWatch, which keeps the ranks it released

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


def record_a_watchdog_exit(attempt: Attempt) -> None:
    """A stop that cannot finish ends in the stop watchdog's `os._exit`, past every `finally`:
    the watchdog first calls back here, from its thread, to write the record and the log line."""
    from sru_lightning.callbacks import GracefulInterrupt

    def record(message: str) -> None:
        if not attempt.writes_records:
            return
        attempt.finish("interrupted", error=f"ended by the stop watchdog: {message}")
        RunFolder(attempt.output_dir).write_record(attempt.record)
        for handler in list(logging.getLogger().handlers):  # no logging call: its locks may be held
            if isinstance(handler, logging.FileHandler):
                with open(handler.baseFilename, "a", encoding="utf-8") as log_file:
                    log_file.write(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}][sru_lightning][ERROR] - {message}\n")

    for callback in attempt.trainer.callbacks:
        if isinstance(callback, GracefulInterrupt):
            callback.before_watchdog_exit.append(record)


def throughput_record(throughput) -> dict[str, Any]:
    """What a run records of its training throughput: what was measured, nothing else (a fit
    of one batch times none; FLOPs are not counted under torch.compile; MFU needs a known peak)."""
    figures: dict[str, Any] = {"train_tokens": throughput.tokens}
    if math.isfinite(throughput.tokens_per_second):
        figures["tokens_per_second"] = round(throughput.tokens_per_second, 1)
    if throughput.flops_per_batch is not None:
        figures["flops_per_batch"] = throughput.flops_per_batch
    if throughput.flops_per_second is not None:
        figures["flops_per_second"] = float(f"{throughput.flops_per_second:.4g}")
    if throughput.mfu is not None:
        figures["mfu"] = round(throughput.mfu, 4)
    return figures


def completed(attempt: Attempt, metrics: dict[str, float]) -> dict[str, Any]:
    """Record a completed run and name its directory."""
    from sru_lightning.callbacks import TrainingThroughput

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
        record.update(throughput_record(throughput))
    if trainer.is_global_zero:
        RunFolder(attempt.output_dir).write_record(record)
        say(f"run directory: {attempt.output_dir}")
    return record


def ended_early(error: BaseException, attempt: Attempt) -> dict[str, Any]:
    """The attempt did not complete: refused (a usage error), interrupted, or failed."""
    from sru_lightning.callbacks.graceful_interrupt import interruption_cause

    if isinstance(error, UsageError) and not attempt.multirun:
        _refused(error, attempt)
    cause = interruption_cause(attempt.trainer, error)
    if cause is None:
        error = _name_an_unformed_group(attempt, _name_a_lost_process(attempt, error))
    attempt.finish("interrupted" if cause is not None else "failed", error=cause or describe(error))
    requeue = cause is not None and _stopped_for_requeue(attempt)
    if requeue:
        attempt.record["requeue"] = "asked"  # written before asking: a requeue ends this process
    if attempt.writes_records or _rank0_is_gone(attempt, error):
        RunFolder(attempt.output_dir).write_record(attempt.record, keep_result=isinstance(error, UsageError))
    if cause is not None:
        return _interrupted(error, attempt, requeue)
    return _failed(error, attempt)


# --------------------------------------------------------------------------------------------
# a lost process
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
    launcher = getattr(trainer.strategy, "launcher", None)
    watch = attempt.signal_watch
    launched = getattr(launcher, "procs", None) or (watch.released_ranks if watch is not None else [])
    for local_rank, process in enumerate(launched, start=1):
        try:
            code = process.wait(timeout=5)
        except Exception:  # still running (or not ours to wait for): not the lost one
            continue
        if code:
            how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with status {code}"
            return RunFailed(
                f"rank {local_rank} (pid {process.pid}) {how}, so rank {trainer.global_rank} could not "
                f"go on ({first_line})"
            )
    return RunFailed(f"another process of this run ended, so rank {trainer.global_rank} could not go on ({first_line})")


#: torch's TCPStore when the processes of a run did not all join before the timeout.
_NOT_ALL_JOINED = re.compile(r"Timed out after (\d+) seconds waiting for clients\. (\d+)/(\d+) clients joined")


def _name_an_unformed_group(attempt: Attempt, error: BaseException) -> BaseException:
    """Rank 0 gave up waiting for the other processes of the run to join the process group (a
    node that never started): one line saying how many joined and how to start the rest,
    instead of the rendezvous' traceback."""
    found = _NOT_ALL_JOINED.search(str(error)) if isinstance(error, Exception) else None
    if found is None:
        return error
    seconds, joined, expected = (int(group) for group in found.groups())
    trainer = attempt.trainer
    nodes = getattr(trainer, "num_nodes", 1) if trainer is not None else 1
    how = (
        f"with trainer.num_nodes={nodes}, start the same command on every node with its NODE_RANK "
        "(0 to num_nodes - 1) and the same MASTER_ADDR and MASTER_PORT"
        if nodes > 1
        else "every process of the run must start"
    )
    return RunFailed(
        f"the processes of this run did not all start: {joined} of {expected} joined within {seconds} s; {how} "
        "(`trainer.strategy.timeout`, a datetime.timedelta, sets how long to wait)"
    )


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
            result = attempt.output_dir / RunFolder.RESULT_FILE
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


# --------------------------------------------------------------------------------------------
# the exits
def _stopped_for_requeue(attempt: Attempt) -> bool:
    """Stopped by a scheduler's warning signal ahead of a preemption or time limit, inside a SLURM
    job: the job is requeued to continue the run from the checkpoint it just wrote."""
    from sru_lightning.callbacks import GracefulInterrupt

    from .jobs import slurm_job

    graceful = next(
        (cb for cb in getattr(attempt.trainer, "callbacks", None) or [] if isinstance(cb, GracefulInterrupt)), None
    )
    return (
        graceful is not None
        and graceful.stop_signal in WARNING_SIGNALS
        and not graceful.aborted
        and slurm_job() is not None
    )


def _requeue(attempt: Attempt) -> None:
    """Rank 0 asks SLURM to requeue the job once the run's record is written; says what happened."""
    from .jobs import requeue_own_job

    outcome = requeue_own_job()
    say(outcome)
    if not outcome.startswith("requeued"):
        attempt.record["requeue"] = outcome
        RunFolder(attempt.output_dir).write_result(attempt.record)


def _refused(error: UsageError, attempt: Attempt) -> NoReturn:
    """A single run refused before it started: the run directory is left as it was (or removed);
    exit status 2."""
    from .directories import restore_after_usage_error, usage_exit

    restore_after_usage_error(attempt.context, attempt.output_dir)
    raise usage_exit(str(error)) from None


def _interrupted(error: BaseException, attempt: Attempt, requeue: bool = False) -> dict[str, Any]:
    """Say how to resume (and requeue the job after a scheduler's warning signal); a single run
    returns its record, a sweep stops (the error goes on)."""
    if attempt.writes_records:
        say(interruption_message(attempt.command, attempt.overrides, attempt.output_dir, attempt.step))
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
        log_traceback_to_file(error)
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

    keep_config_beside(attempt.context, attempt.output_dir)
    say(f"run directory: {attempt.output_dir} (failed)")
    if isinstance(error, RunFailed):
        raise error_exit(str(error), 1) from None
    raise error
