"""Stopping a fit on SIGTERM or Ctrl+C at a batch boundary that every process agrees on.

:class:`GracefulInterrupt` turns SIGTERM and the first Ctrl+C (SIGINT) into a stop at a batch
boundary that every process agrees on (one collective at a fixed point, never inside the
signal handler), and Lightning then calls every callback's ``on_exception``, where
:class:`~sru_lightning.callbacks.interruption_checkpoint.InterruptionCheckpoint` saves the
checkpoint. A second Ctrl+C aborts at once; a watchdog ends a stop that cannot complete.
:func:`interruption_cause` says afterwards why a fit stopped. Resuming exactly (the data
position, the random numbers) is the job of
:class:`~sru_lightning.callbacks.restore_data_position.RestoreDataPosition`,
:class:`~sru_lightning.callbacks.seed_every_batch.SeedEveryBatch` and
:class:`sru_lightning.data.ResumableDataLoader`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import SIGTERMException
from typing_extensions import override

from sru_lightning._lightning_compat import is_trainer_call_frame, set_received_sigterm
from sru_lightning.callbacks.stop_signals import HANDLED_SIGNALS, StopsOnSignal, signal_name

log = logging.getLogger(__name__)

__all__ = ["GracefulInterrupt", "interruption_cause", "is_interruption"]


class GracefulInterrupt(StopsOnSignal, Callback):
    """Stop on SIGTERM or Ctrl+C (SIGINT) at a batch boundary that every process agrees on.

    Lightning's own SIGTERM handler runs a collective (a broadcast) inside the signal handler,
    which Python runs wherever the main thread happens to be: inside a backward pass while
    the other ranks wait in DDP's gradient all-reduce, the collectives no longer match and
    every rank waits forever. Here the handler only records the signal. After every training
    (and validation) batch, all ranks reduce what they recorded in one small collective at
    that fixed point; if any rank was signalled, they all tell Lightning to stop, which it
    does at the end of that batch on every rank, so ``on_exception`` callbacks
    (:class:`InterruptionCheckpoint`) save one consistent checkpoint. A signal sent to one
    rank stops them all the same way.

    A stop that lands on a step due for validation, or during a fit's validation, lets that
    validation finish first and stops right after it, so the resumed fit logs every
    validation the uninterrupted one does.

    A second Ctrl+C aborts at once with ``KeyboardInterrupt`` (no checkpoint: the state may
    be half way through a step). Repeated SIGTERMs are ignored.

    The first signal also starts a watchdog: if the process is still running
    ``stop_timeout`` seconds later (a peer process is gone or stuck, so a collective never
    completes), it prints why and exits with status 1 instead of hanging.
    """

    def __init__(self, stop_timeout: float = 300.0) -> None:
        super().__init__()
        if isinstance(stop_timeout, bool) or not isinstance(stop_timeout, (int, float)) or not stop_timeout > 0:
            raise ValueError(
                f"GracefulInterrupt: `stop_timeout` must be a positive number of seconds, got {stop_timeout!r}"
            )
        self.stop_timeout = float(stop_timeout)
        self.received_signal: int | None = None  # the first signal this process received
        self.stop_signal: int | None = None  # the signal all ranks agreed to stop on
        self.aborted = False  # a second Ctrl+C
        self._stopped = False  # on_exception has run: the checkpoint, if any, is being or was written
        self._trainer: pl.Trainer | None = None
        self._previous_handlers: dict[int, Any] = {}
        self._active = False
        self._watchdog: threading.Thread | None = None
        self._watchdog_lock = threading.Lock()
        self._stop_finished: threading.Event | None = None  # set at teardown: the watchdog stands down
        self._stop_after_validation = False  # a stop agreed during a fit's validation waits for its end
        # Called with the message from the watchdog's thread just before it ends the process
        # (the application writes the run's record there); no logging locks may be taken.
        self.before_watchdog_exit: list[Any] = []

    def __getstate__(self) -> dict[str, Any]:
        # Spawn-based strategies pickle the callbacks: threads, locks, handlers and the supervisor stay here.
        state = self.__dict__.copy()
        state.update(
            _trainer=None,
            _previous_handlers={},
            _active=False,
            _watchdog=None,
            _watchdog_lock=None,
            _stop_finished=None,
            before_watchdog_exit=[],
            supervisor=None,
        )
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._watchdog_lock = threading.Lock()

    # -- handlers ----------------------------------------------------------------------------
    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        # Before Lightning registers its handler (and before the checkpoint restore), so a
        # signal from here on is recorded rather than acted on inside whatever code runs.
        self._trainer = trainer
        self._install()
        self.notify_supervisor()

    @override
    def on_sanity_check_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._install()  # Lightning has just put its own SIGTERM handler in place

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._install()

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._install()
        if self.stop_signal is not None and _validating_inside_fit(trainer) and trainer.received_sigterm:
            # The stop came on a step due for validation: finish it first (see `_agreed`).
            set_received_sigterm(trainer, False)
            self._stop_after_validation = True

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._stop_after_validation:
            self._stop_after_validation = False
            set_received_sigterm(trainer, True)
            # Stop here, where Lightning's own end-of-validation checkpoints are taken: the
            # interruption checkpoint then has the state Lightning resumes from without running
            # this validation again or counting this step twice. (Its metrics are logged already.)
            raise SIGTERMException()

    @override
    def on_test_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._install()

    def _install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in HANDLED_SIGNALS:
            current = signal.getsignal(signum)
            if current == self._handle_signal:
                continue
            if not self._active and signum not in self._previous_handlers:
                self._previous_handlers[signum] = current
            signal.signal(signum, self._handle_signal)
        self._active = True

    def _restore_handlers(self) -> None:
        # Also after Lightning's teardown, which puts back the handlers it found (ours).
        self._active = False
        if threading.current_thread() is not threading.main_thread():
            return
        for signum, handler in self._previous_handlers.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)

    def _handle_signal(self, signum: int, frame: Any) -> None:
        if not self._active:
            # Lightning put this handler back after the fit: behave as the previous one would.
            signal.signal(signum, self._previous_handlers.get(signum, signal.SIG_DFL) or signal.SIG_DFL)
            signal.raise_signal(signum)
            return
        rank = self._trainer.global_rank if self._trainer is not None else 0
        if self.received_signal is not None:
            if signum == signal.SIGINT:
                if self._stopped and _main_thread_trainer_call() is None:
                    # The Trainer call has ended: its checkpoint is written (or was not due) and
                    # what is left is the run's record, which an abort would lose.
                    log.warning("[rank %d] Ctrl+C again: the fit has already stopped; finishing its record", rank)
                    return
                self.aborted = True
                while_saving = " (the checkpoint being written is dropped)" if self._stopped else ""
                log.warning(
                    "[rank %d] Ctrl+C again: aborting at once, without a checkpoint of the current step%s",
                    rank,
                    while_saving,
                )
                raise KeyboardInterrupt
            return  # already stopping; SLURM and launchers may repeat SIGTERM
        self.received_signal = signum
        if self._trainer is not None and self._trainer.world_size == 1:
            # One process: no peer to agree with, and Lightning reads this flag only at safe points.
            self._agreed(signum)
        log.warning(
            "[rank %d] Received %s: stopping after the current batch and saving a checkpoint%s",
            rank,
            signal_name(signum),
            " (press Ctrl+C again to abort at once)" if signum == signal.SIGINT else "",
        )
        self.start_watchdog(signum)

    # -- agreement ---------------------------------------------------------------------------
    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._agree(trainer)

    @override
    def on_validation_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._agree(trainer)

    def _agree(self, trainer: pl.Trainer) -> None:
        """One collective at a fixed point of every rank: stop if any rank was signalled."""
        if self.stop_signal is not None or trainer.world_size == 1:
            return
        # SIGTERM (15) outranks SIGINT (2) when ranks received different signals.
        received = torch.tensor([self.received_signal or 0], device=trainer.strategy.root_device)
        agreed = int(trainer.strategy.reduce(received, reduce_op="max").item())
        if agreed:
            self._agreed(agreed)

    def _agreed(self, signum: int) -> None:
        self.stop_signal = signum
        if self._trainer is not None and _validating_inside_fit(self._trainer):
            # A fit's validation is allowed to finish: stopped in the middle, its result would be
            # lost, and the resumed fit would not run it again (Lightning counts the step's
            # validation as done), so the resumed run would miss that step's validation.
            self._stop_after_validation = True
            return
        # Lightning's loops raise SIGTERMException at their next safe point once this is set.
        set_received_sigterm(self._trainer, True)

    # -- watchdog ----------------------------------------------------------------------------
    @override
    def start_watchdog(self, signum: int) -> None:
        """End the process with a message if it is still running `stop_timeout` seconds from now.

        Called by the signal handler and, when the main thread is blocked where Python cannot
        run the handler, by the thread of the process's supervisor (:attr:`supervisor`).
        """
        with self._watchdog_lock:
            if self._watchdog is not None:
                return
            rank = self._trainer.global_rank if self._trainer is not None else 0
            self._stop_finished = threading.Event()
            # The Trainer call this signal interrupts: only a process still inside that very call
            # is ended (a script or a test process may have gone on to another fit).
            call = _main_thread_trainer_call()
            self._watchdog = threading.Thread(
                target=self._watch, args=(signum, rank, self._stop_finished, call), name="stop-watchdog", daemon=True
            )
            self._watchdog.start()

    def _watch(self, signum: int, rank: int, stop_finished: threading.Event, call) -> None:
        if stop_finished.wait(self.stop_timeout) or not _main_thread_still_in(call):
            # The fit ended (teardown ran, or the main thread has left trainer.fit after the
            # interruption, where Lightning calls no teardown hook): the process goes on, and a
            # script, a notebook or a test may continue.
            return
        several = self._trainer is not None and self._trainer.world_size > 1
        why = (
            "another process of this run is gone or stuck, so the ranks cannot agree on a checkpoint"
            if several
            else "the current step or checkpoint write is stuck"
        )
        message = (
            f"sru_lightning: rank {rank} received {signal_name(signum)} {self.stop_timeout:g} s ago and has not "
            f"finished stopping: {why} (callbacks.graceful_interrupt.stop_timeout={self.stop_timeout:g}); "
            "exiting with status 1\n"
        )
        # No logging or flushing here: the main thread may hold their locks.
        os.write(2, message.encode())
        for hook in list(self.before_watchdog_exit):
            try:
                hook(message.strip())
            except Exception:  # the exit goes ahead whatever a hook does
                pass
        self._end_launched_ranks()
        os._exit(1)

    def _end_launched_ranks(self) -> None:
        """SIGKILL the ranks this process launched (Lightning's launcher), so none is left behind:
        a frozen (SIGSTOP) or stuck rank would otherwise outlive the run."""
        launcher = getattr(getattr(self._trainer, "strategy", None), "launcher", None)
        for process in getattr(launcher, "procs", None) or []:
            with contextlib.suppress(Exception):
                if process.poll() is None:
                    process.kill()

    # -- end of the fit ----------------------------------------------------------------------
    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._restore_handlers()

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        if self.stop_signal is None:
            self._restore_handlers()
        self._stopped = True
        # After an agreed stop the handlers stay until the process ends: a repeated SIGTERM must
        # not kill the checkpoint being written, and a second Ctrl+C still aborts.

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._restore_handlers()
        if self._stop_finished is not None:
            self._stop_finished.set()
        self._watchdog = None  # a later signal in a later fit starts its own


def _validating_inside_fit(trainer: pl.Trainer) -> bool:
    return trainer.state.fn == TrainerFn.FITTING and trainer.validating and not trainer.sanity_checking


def _main_thread_frames():
    frame = sys._current_frames().get(threading.main_thread().ident)
    while frame is not None:
        yield frame
        frame = frame.f_back


def _main_thread_trainer_call():
    """The frame of the Trainer entry point (fit, validate, test, predict) the main thread is
    inside, None outside one: Lightning runs each through
    ``lightning.pytorch.trainer.call._call_and_handle_interrupt``, its exception handling (the
    interruption checkpoint) included."""
    for frame in _main_thread_frames():
        if is_trainer_call_frame(frame.f_code):
            return frame
    return None


def _main_thread_still_in(call) -> bool:
    """True while the main thread is inside the Trainer call `call` (any Trainer call when the
    signal came outside one)."""
    if call is None:
        return _main_thread_trainer_call() is not None
    return any(frame is call for frame in _main_thread_frames())


def is_interruption(exception: BaseException) -> bool:
    """True for a stop the user or the scheduler asked for: SIGTERM, Ctrl+C."""
    return isinstance(exception, (SIGTERMException, KeyboardInterrupt))


def interruption_cause(trainer: pl.Trainer | None, exception: BaseException) -> str | None:
    """Why the fit stopped, when a signal stopped it ("stopped by SIGINT (Ctrl+C)", ...), else None.

    A second Ctrl+C ends in Lightning's ``sys.exit(1)``; :class:`GracefulInterrupt` remembers
    it, so the abort is still told apart from a failure.
    """
    graceful = next((cb for cb in getattr(trainer, "callbacks", None) or [] if isinstance(cb, GracefulInterrupt)), None)
    if graceful is not None and graceful.aborted:
        return "aborted by a second Ctrl+C (SIGINT), without a checkpoint of the current step"
    if graceful is not None and graceful.stop_signal is not None and is_interruption(exception):
        return f"stopped by {signal_name(graceful.stop_signal)}"
    if graceful is not None and graceful.received_signal is not None:
        # Signalled, then a peer ended first (it aborted, or was killed): the ranks never agreed.
        return (
            f"stopped by {signal_name(graceful.received_signal)}; another process ended before the ranks "
            f"agreed on a checkpoint ({type(exception).__name__}: {str(exception).strip()[:200]})"
        )
    if isinstance(exception, KeyboardInterrupt):
        return "stopped by SIGINT (Ctrl+C)"
    if isinstance(exception, SIGTERMException):
        return "stopped by SIGTERM"
    return None
