"""Notice SIGTERM and Ctrl+C even while the main thread is blocked, so no signal hangs a run.

The application's supervisor of the process; the library's callbacks know it only through the
small protocol of :mod:`sru_lightning.callbacks.stop_signals`.

Python runs a signal handler only when the main thread returns to the interpreter. A rank
blocked in a collective whose peer is gone, or in the process-group rendezvous waiting for a
rank that has already died, never returns there, so a handler alone can neither stop it nor
start a timer. The C-level handler does write the signal number to the wakeup file
descriptor (`signal.set_wakeup_fd`) at once; :class:`SignalWatch` reads it in a thread:

* before training has set up (imports, data, launching the other ranks, the rendezvous) there
  is nothing to save, so the process says so, passes the signal on to the ranks it launched,
  and exits with status 128 + the signal number (as it does at any time in a run without a
  GracefulInterrupt callback, saying so);
* once a callback that stops the fit itself (a
  :class:`~sru_lightning.callbacks.stop_signals.StopsOnSignal`, such as
  :class:`~sru_lightning.callbacks.graceful_interrupt.GracefulInterrupt`) runs the fit, that
  callback stops every rank at an agreed batch boundary, and the watch only starts its watchdog,
  which ends a stop that cannot complete within ``stop_timeout`` seconds.

While training has not set up yet, the watch also notices a launched rank that has died
(killed alone, or failed at start-up), which would leave this process waiting for it in the
rendezvous, and exits with a message naming it.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

from sru_lightning.callbacks.stop_signals import HANDLED_SIGNALS, StopsOnSignal, signal_name

__all__ = ["WARNING_SIGNALS", "SignalWatch", "watching_signals"]

_POLL_SECONDS = 0.5


class SignalWatch:
    """Process-wide watch over SIGTERM/SIGINT for one run (see the module docstring).

    ``start()`` from the main thread as early as possible, ``follow(trainer)`` once the
    trainer exists (before ``trainer.fit``, which launches the other ranks), ``stop()`` when
    the run is over; or ``with watching_signals() as watch: ...``. ``follow`` makes the watch
    the supervisor of the trainer's StopsOnSignal callbacks; a GracefulInterrupt then takes
    over with ``take_over(callback)`` from its ``setup`` hook, once its handlers are in place.
    """

    def __init__(self, release_holds: Callable[[], None] | None = None) -> None:
        #: Gives back the run's folders before the process ends at once (os._exit runs no atexit).
        self._release_holds = release_holds
        self._trainer: Any = None
        self._owner: StopsOnSignal | None = None
        self._supervised: list[StopsOnSignal] = []
        self._read_fd = self._write_fd = -1
        self._previous_wakeup_fd = -1
        self._previous_handlers: dict[int, Any] = {}
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        self.released_ranks: list[Any] = []  # the launched ranks' processes, once released

    # -- life cycle --------------------------------------------------------------------------
    def start(self) -> SignalWatch:
        if threading.current_thread() is not threading.main_thread():
            return self  # signal handlers can only be set from the main thread
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._write_fd, False)
        self._previous_wakeup_fd = signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
        for signum in HANDLED_SIGNALS:
            # A Python-level handler is what makes the C handler write to the wakeup fd; until a
            # GracefulInterrupt takes over, the thread decides what a signal means.
            self._previous_handlers[signum] = signal.getsignal(signum)
            signal.signal(signum, _ignore_until_watched)
        self._thread = threading.Thread(target=self._run, name="signal-watch", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        for callback in self._supervised:  # a later fit in this process is not this run's
            if callback.supervisor is self:
                callback.supervisor = None
        self._supervised = []
        if self._thread is None:
            return
        self._closed.set()
        try:  # wakes the thread from its select at once (0 is no signal's number) instead of at its next poll
            os.write(self._write_fd, b"\0")
        except OSError:  # the pipe is full of signal numbers: the thread is awake already
            pass
        signal.set_wakeup_fd(self._previous_wakeup_fd)
        for signum, handler in self._previous_handlers.items():
            if signal.getsignal(signum) is _ignore_until_watched:
                signal.signal(signum, _after_the_run(signum, handler))
        self._thread.join(timeout=2 * _POLL_SECONDS)
        for fd in (self._read_fd, self._write_fd):
            os.close(fd)
        self._thread = None

    def follow(self, trainer: Any) -> None:
        """The trainer whose launched ranks a signal is passed on to, and whose deaths are noticed;
        the watch supervises its callbacks that stop the fit on a signal themselves."""
        self._trainer = trainer
        if self._thread is None:
            return  # not started (not the main thread): nothing to hand over from
        self._supervised = [cb for cb in getattr(trainer, "callbacks", None) or [] if isinstance(cb, StopsOnSignal)]
        for callback in self._supervised:
            callback.supervisor = self

    def take_over(self, owner: StopsOnSignal) -> None:
        """From now on `owner` (a GracefulInterrupt) decides how to stop; the watch keeps time."""
        self._owner = owner

    # -- the thread --------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._closed.is_set():
            ready, _, _ = select.select([self._read_fd], [], [], _POLL_SECONDS)
            if self._closed.is_set():
                return
            if ready:
                try:
                    received = os.read(self._read_fd, 64)
                except OSError:
                    return
                for signum in received:
                    if signum in HANDLED_SIGNALS:
                        self._on_signal(signum)
            elif self._owner is None:
                self._check_launched_ranks()

    def _on_signal(self, signum: int) -> None:
        owner = self._owner
        if owner is not None:
            owner.start_watchdog(signum)
            return
        callbacks = getattr(self._trainer, "callbacks", None)
        if callbacks is not None and not any(isinstance(callback, StopsOnSignal) for callback in callbacks):
            self._forward_to_launched_ranks(signum)
            self._exit(
                f"received {signal_name(signum)}; exiting at once without a checkpoint (this run has no "
                "GracefulInterrupt callback: callbacks=default includes it)",
                128 + signum,
            )
        # Before training a launched rank may still be starting its interpreter, where SIGINT
        # would print a KeyboardInterrupt traceback: SIGTERM ends it quietly there, and once its
        # own watch runs it ends the same way as on any signal.
        self._forward_to_launched_ranks(signal.SIGTERM)
        requeue = _requeue_before_training() if signum in WARNING_SIGNALS else ""
        self._exit(
            f"received {signal_name(signum)} before training started; exiting (nothing to save yet){requeue}",
            128 + signum,
        )

    def release_launched_ranks(self) -> None:
        """The Trainer call has ended on this process: the launched ranks end on their own now.

        Lightning's watcher thread of the ranks it launched would SIGKILL this process, within
        its 5 s period, once a rank has exited with a non-zero status: a rank stopped by a signal
        exits with 1, and one that Lightning itself killed on an abort with -9. This process may
        still be writing its record and its message then, so the watcher is given nothing more to
        watch (it then ends quietly), as after a run in which every rank completed.
        """
        launcher = getattr(getattr(self._trainer, "strategy", None), "launcher", None)
        watched = getattr(launcher, "procs", None)
        if isinstance(watched, list):
            self.released_ranks = [*self.released_ranks, *watched]  # still there to tell which one died
            watched.clear()

    def _exit(self, message: str, status: int) -> None:
        if self._release_holds is not None:
            self._release_holds()  # the run folder is given back here
        _exit(message, status)

    def _launched_ranks(self) -> list[Any]:
        launcher = getattr(getattr(self._trainer, "strategy", None), "launcher", None)
        return list(getattr(launcher, "procs", None) or [])

    def _forward_to_launched_ranks(self, signum: int) -> None:
        # The launcher's list may not hold a rank it is starting at this very moment; on Linux
        # the kernel's list of this process's children does.
        pids = {process.pid for process in self._launched_ranks() if process.poll() is None} | _child_pids()
        for pid in pids:
            try:
                os.kill(pid, signum)
            except OSError:
                pass

    def _check_launched_ranks(self) -> None:
        for rank, process in enumerate(self._launched_ranks(), start=1):
            status = process.poll()
            if status is not None and status != 0:
                self._forward_to_launched_ranks(signal.SIGTERM)
                self._exit(
                    f"rank {rank} (process {process.pid}) ended with status {status} before training started; "
                    "exiting instead of waiting for it",
                    1,
                )


@contextlib.contextmanager
def watching_signals(release_holds: Callable[[], None] | None = None) -> Iterator[SignalWatch]:
    """A :class:`SignalWatch` for the duration of the block (`release_holds`: see SignalWatch)."""
    watch = SignalWatch(release_holds).start()
    try:
        yield watch
    finally:
        watch.stop()


def _child_pids() -> set[int]:
    pids: set[int] = set()
    try:
        threads = os.listdir(f"/proc/{os.getpid()}/task")
    except OSError:
        return pids
    for thread in threads:
        try:
            with open(f"/proc/{os.getpid()}/task/{thread}/children") as children:
                pids.update(int(pid) for pid in children.read().split())
        except (OSError, ValueError):
            continue
    return pids


#: Signals a scheduler sends ahead of a preemption or time limit (`#SBATCH --signal=USR1@90`,
#: submitit's USR2): their default action (ending the process) is never what it means.
WARNING_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)


def _after_the_run(signum: int, previous: Any) -> Any:
    """The handler `signum` gets back once the run is over.

    The previous one, except that a scheduler's warning signal (SIGUSR1/SIGUSR2: `--signal=USR1@90`,
    `scancel --signal=USR1`) whose previous action was the default one is ignored from now on:
    arriving while the process writes its last lines, the default action would end it with
    "User defined signal 1", and SLURM would count a completed run as a failed job.
    """
    if previous is None:
        previous = signal.SIG_DFL
    if signum in WARNING_SIGNALS and previous == signal.SIG_DFL:
        return signal.SIG_IGN
    return previous


def _requeue_before_training() -> str:
    """A scheduler's warning (SIGUSR1/SIGUSR2) before training started: there is nothing to save,
    but the job is still about to be preempted or to reach its time limit, so the job's first
    process asks SLURM to requeue it, as after a stop during training; the requeued job starts
    the run again from its newest checkpoint, if any (`ckpt_path=auto` in a job). What happened,
    as the end of the exit message; nothing outside a SLURM job or on another process."""
    from sru_lightning.app.runs.jobs import requeue_own_job, slurm_job

    first_process = os.environ.get("SLURM_PROCID", "0") == "0" and os.environ.get("LOCAL_RANK", "0") == "0"
    if slurm_job() is None or not first_process:
        return ""
    return f"; {requeue_own_job()}"


def _ignore_until_watched(signum: int, frame: Any) -> None:
    """Placeholder handler: the SignalWatch thread acts on the signal."""


def _exit(message: str, status: int) -> None:
    # From a thread while the main thread may hold the logging and stdio locks: write directly.
    os.write(2, f"sru_lightning: {message}\n".encode())
    os._exit(status)
