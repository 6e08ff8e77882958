"""Training that survives interruption and resumes exactly where it stopped.

Lightning already does most of the work; this module supplies the three pieces it leaves
to the user, so that `fit(ckpt_path=...)` after a SIGTERM or Ctrl+C reproduces the losses
the uninterrupted run would have produced:

* **A checkpoint when the run is stopped.** :class:`GracefulInterrupt` turns SIGTERM and the
  first Ctrl+C (SIGINT) into a stop at a batch boundary that every process agrees on (one
  collective at a fixed point, never inside the signal handler), and Lightning then calls
  every callback's ``on_exception``, where :class:`InterruptionCheckpoint` saves the
  checkpoint. A second Ctrl+C aborts at once; a watchdog ends a stop that cannot complete.
* **The data position.** Lightning 2.x stores the ``state_dict()`` of every training
  dataloader that has one in the checkpoint (``loops.fit_loop.state_dict.combined_loader``)
  and hands it back through ``load_state_dict()`` before it restarts the epoch; a plain
  ``DataLoader`` has neither, so a mid-epoch resume would start the epoch over.
  :class:`ResumableDataLoader` counts the batches it has handed out and skips them after a
  resume; with ``shuffle=True`` its order depends only on (seed, epoch)
  (:class:`EpochSeededRandomSampler`), the same permutation Lightning's ``DistributedSampler``
  draws, so a one-process run and a DDP run see the same global batches. Lightning 2.6 hands
  the state back only when the dataloader is first set up after the restore; a model whose
  ``configure_optimizers`` reads ``trainer.estimated_stepping_batches`` (as step-based
  schedules such as OneCycleLR often do; with ``max_epochs`` set this loads the dataloader)
  sets it up earlier, and the state is silently dropped.
  :class:`RestoreDataPosition` applies it before the first batch in that case.
* **The random numbers.** Lightning does not checkpoint RNG states, and the data pipeline
  draws from the global generator at unpredictable moments (every ``iter(DataLoader)`` draws
  a worker seed). :class:`SeedEveryBatch` reseeds the generators before every training batch
  from (seed, batch index, rank), so dropout after a resume is the dropout the
  uninterrupted run used.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import os
import random
import signal
import shutil
import threading
import warnings
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback, OnExceptionCheckpoint
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import SIGTERMException

from sru_lightning.callbacks.signal_watch import HANDLED_SIGNALS, SignalWatch, signal_name
from torch.utils.data import DataLoader, RandomSampler

log = logging.getLogger(__name__)

__all__ = [
    "EpochSeededRandomSampler",
    "GracefulInterrupt",
    "InterruptionCheckpoint",
    "RestoreDataPosition",
    "ResumableDataLoader",
    "SeedEveryBatch",
    "global_seed",
]


def global_seed(seed: int | None = None) -> int:
    """``seed`` when given, else the seed `lightning.seed_everything` recorded, else 0.

    ``PL_GLOBAL_SEED`` is also what Lightning seeds its ``DistributedSampler`` with, so
    defaulting to it keeps one-process and DDP data orders identical.
    """
    if seed is not None:
        return int(seed)
    return int(os.environ.get("PL_GLOBAL_SEED", 0))


class EpochSeededRandomSampler(RandomSampler):
    """A random permutation that depends only on ``seed + epoch``.

    Lightning calls ``set_epoch`` at the start of every epoch. The permutation is the one
    ``torch.utils.data.DistributedSampler(shuffle=True, seed=seed)`` draws before it splits
    it between ranks, so under DDP (where Lightning swaps this sampler for a
    ``DistributedSampler``, because it is a ``RandomSampler``) the union of the ranks'
    batches equals this sampler's batch of the global size.
    """

    def __init__(self, data_source, seed: int | None = None) -> None:
        super().__init__(data_source)
        self.seed = global_seed(seed)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __iter__(self):
        generator = torch.Generator()
        generator.manual_seed(self.seed + self.epoch)
        yield from torch.randperm(len(self.data_source), generator=generator).tolist()

    def __len__(self) -> int:
        return len(self.data_source)


class ResumableDataLoader(DataLoader):
    """A ``DataLoader`` whose position inside the epoch survives a checkpoint.

    Takes every ``DataLoader`` argument, plus ``seed`` for the shuffled order
    (default: the seed given to `lightning.seed_everything`). After ``load_state_dict``
    the next ``iter()`` skips the batches the checkpointed run had already consumed.
    Skipped batches are still loaded (then dropped), which is cheap for in-memory
    datasets; the sampler's order is untouched, so it works with any sampler, including
    the ``DistributedSampler`` Lightning injects under DDP.
    """

    def __init__(self, dataset, *args: Any, shuffle: bool | None = None, seed: int | None = None,
                 **kwargs: Any) -> None:
        self.seed = global_seed(seed)
        if shuffle and kwargs.get("sampler") is None and kwargs.get("batch_sampler") is None:
            kwargs["sampler"] = EpochSeededRandomSampler(dataset, seed=self.seed)
            shuffle = None
        super().__init__(dataset, *args, shuffle=shuffle, **kwargs)
        self._batches_yielded = 0
        self._resume_position = 0

    def __iter__(self):
        # A generator: nothing runs until the first batch is requested, which Lightning
        # does only after it has called `set_epoch` on the sampler.
        start, self._resume_position = self._resume_position, 0
        self._batches_yielded = start
        batches = super().__iter__()
        if start:
            batches = itertools.islice(batches, start, None)
        for batch in batches:
            self._batches_yielded += 1
            yield batch

    def state_dict(self) -> dict[str, int]:
        """Position in the current epoch: how many batches have been handed out."""
        num_batches = len(self) if _has_len(self) else -1
        return {"batches_yielded": self._batches_yielded, "num_batches": num_batches}

    def load_state_dict(self, state_dict: dict[str, int]) -> None:
        """Resume the next epoch iteration after ``state_dict["batches_yielded"]`` batches."""
        if "batches_yielded" not in state_dict:
            raise ValueError(
                "ResumableDataLoader.load_state_dict: `state_dict` must have key 'batches_yielded', "
                f"got keys {sorted(state_dict)}"
            )
        position = int(state_dict["batches_yielded"])
        saved_length = int(state_dict.get("num_batches", -1))
        length = len(self) if _has_len(self) else -1
        if saved_length >= 0 and length >= 0 and saved_length != length:
            warnings.warn(
                f"ResumableDataLoader: the checkpoint was taken with {saved_length} batches per "
                f"epoch, this loader has {length}; resuming at batch {min(position, length)} "
                "will not reproduce the interrupted run (dataset, batch_size or device count changed)",
                stacklevel=2,
            )
            position = min(position, length)
        self._resume_position = position


def _has_len(loader: DataLoader) -> bool:
    try:
        len(loader)
    except TypeError:
        return False
    return True


class RestoreDataPosition(Callback):
    """Hand the checkpointed dataloader position to the training dataloaders, if Lightning did not.

    Lightning loads the states of stateful training dataloaders while it sets them up, but
    only when the checkpoint has already been restored. ``trainer.estimated_stepping_batches``
    (read by ``configure_optimizers`` for step-based schedules) sets the dataloaders up
    before that, and Lightning then never loads the states. ``on_train_start`` runs after
    the restore and before the first batch is fetched, so loading them here still takes
    effect for a :class:`ResumableDataLoader` (it reads its position on the first batch).
    """

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        fit_loop = trainer.fit_loop
        # Lightning's own restore consumes (empties) this list; anything left was skipped.
        if fit_loop.restarting and getattr(fit_loop, "_combined_loader_states_to_load", None):
            fit_loop._load_combined_loader_states()


class GracefulInterrupt(Callback):
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

    def __getstate__(self) -> dict[str, Any]:
        # Spawn-based strategies pickle the callbacks: threads, locks and handlers stay here.
        state = self.__dict__.copy()
        state.update(_trainer=None, _previous_handlers={}, _active=False, _watchdog=None, _watchdog_lock=None,
                     _stop_finished=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._watchdog_lock = threading.Lock()

    # -- handlers ----------------------------------------------------------------------------
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        # Before Lightning registers its handler (and before the checkpoint restore), so a
        # signal from here on is recorded rather than acted on inside whatever code runs.
        self._trainer = trainer
        self._install()
        watch = SignalWatch.current
        if watch is not None:
            watch.take_over(self)

    def on_sanity_check_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._install()  # Lightning has just put its own SIGTERM handler in place

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._install()

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._install()

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
                if self._stopped:
                    log.warning("[rank %d] Ctrl+C again: exiting at once", rank)
                else:
                    self.aborted = True
                    log.warning("[rank %d] Ctrl+C again: aborting at once, without a checkpoint", rank)
                raise KeyboardInterrupt
            return  # already stopping; SLURM and launchers may repeat SIGTERM
        self.received_signal = signum
        if self._trainer is not None and self._trainer.world_size == 1:
            # One process: no peer to agree with, and Lightning reads this flag only at safe points.
            self._agreed(signum)
        log.warning(
            "[rank %d] Received %s: stopping after the current batch and saving a checkpoint%s",
            rank, signal_name(signum), " (press Ctrl+C again to abort at once)" if signum == signal.SIGINT else "",
        )
        self.start_watchdog(signum)

    # -- agreement ---------------------------------------------------------------------------
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any,
                           batch: Any, batch_idx: int) -> None:
        self._agree(trainer)

    def on_validation_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any,
                                batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
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
        # Lightning's loops raise SIGTERMException at their next safe point once this is set.
        self._trainer._signal_connector.received_sigterm = True

    # -- watchdog ----------------------------------------------------------------------------
    def start_watchdog(self, signum: int) -> None:
        """End the process with a message if it is still running `stop_timeout` seconds from now.

        Called by the signal handler and, when the main thread is blocked where Python cannot
        run the handler, by :class:`~sru_lightning.callbacks.signal_watch.SignalWatch`'s thread.
        """
        with self._watchdog_lock:
            if self._watchdog is not None:
                return
            rank = self._trainer.global_rank if self._trainer is not None else 0
            self._stop_finished = threading.Event()
            self._watchdog = threading.Thread(target=self._watch, args=(signum, rank, self._stop_finished),
                                              name="stop-watchdog", daemon=True)
            self._watchdog.start()

    def _watch(self, signum: int, rank: int, stop_finished: threading.Event) -> None:
        if stop_finished.wait(self.stop_timeout) or not _main_thread_in_a_trainer_call():
            # The fit ended (teardown ran, or the main thread has left trainer.fit after the
            # interruption, where Lightning calls no teardown hook): the process goes on, and a
            # script, a notebook or a test may continue.
            return
        several = self._trainer is not None and self._trainer.world_size > 1
        why = ("another process of this run is gone or stuck, so the ranks cannot agree on a checkpoint"
               if several else "the current step or checkpoint write is stuck")
        message = (
            f"sru_lightning: rank {rank} received {signal_name(signum)} {self.stop_timeout:g} s ago and has not "
            f"finished stopping: {why} (callbacks.graceful_interrupt.stop_timeout={self.stop_timeout:g}); "
            "exiting with status 1\n"
        )
        # No logging or flushing here: the main thread may hold their locks.
        os.write(2, message.encode())
        os._exit(1)

    # -- end of the fit ----------------------------------------------------------------------
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._restore_handlers()

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                     exception: BaseException) -> None:
        if self.stop_signal is None:
            self._restore_handlers()
        self._stopped = True
        # After an agreed stop the handlers stay until the process ends: a repeated SIGTERM must
        # not kill the checkpoint being written, and a second Ctrl+C still aborts.

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._restore_handlers()
        if self._stop_finished is not None:
            self._stop_finished.set()
        self._watchdog = None  # a later signal in a later fit starts its own


def _main_thread_in_a_trainer_call() -> bool:
    """True while the main thread is inside a Trainer entry point (fit, validate, test, predict):
    Lightning runs each through ``lightning.pytorch.trainer.call._call_and_handle_interrupt``,
    its exception handling (the interruption checkpoint) included."""
    import sys

    frame = sys._current_frames().get(threading.main_thread().ident)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "_call_and_handle_interrupt" and code.co_filename.replace("\\", "/").endswith(
            "lightning/pytorch/trainer/call.py"
        ):
            return True
        frame = frame.f_back
    return False


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
        return (f"stopped by {signal_name(graceful.received_signal)}; another process ended before the ranks "
                f"agreed on a checkpoint ({type(exception).__name__}: {str(exception).strip()[:200]})")
    if isinstance(exception, KeyboardInterrupt):
        return "stopped by SIGINT (Ctrl+C)"
    if isinstance(exception, SIGTERMException):
        return "stopped by SIGTERM"
    return None


class InterruptionCheckpoint(OnExceptionCheckpoint):
    """`OnExceptionCheckpoint` that saves only what is worth resuming.

    It writes the checkpoint when the fit is stopped at a batch boundary by SIGTERM or the
    first Ctrl+C (Lightning's ``SIGTERMException``) after at least one optimizer step. A
    crash, a diverged loss (see :mod:`sru_lightning.callbacks.guards`) or an abort (a second Ctrl+C,
    ``KeyboardInterrupt``, which may land half way through a step) leaves no new checkpoint:
    its weights may be NaN or half-updated, and a file named like a resumable one would
    invite a requeue to continue from them. The file appears complete or not at all (written
    under a temporary name, then renamed). The run's epoch-end and periodic checkpoints
    stay where they are.
    """

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        if not isinstance(exception, SIGTERMException):
            why = "aborted" if isinstance(exception, KeyboardInterrupt) else f"failed ({type(exception).__name__})"
            log.info("No %s written: the fit %s, it was not stopped at a batch boundary", self.ckpt_path, why)
            return
        if trainer.state.fn != TrainerFn.FITTING:
            log.info("No %s written: %s was interrupted, not training", self.ckpt_path, trainer.state.fn)
            return
        if trainer.global_step < 1:
            log.info("No %s written: the fit was interrupted before its first optimizer step", self.ckpt_path)
            return
        # A full checkpoint (optimizer, schedulers, loops), as the epoch-end ones. Every rank
        # takes part (the model gathers the ranks' carried states); rank 0 writes the file.
        partial = f"{self.ckpt_path}.partial"
        trainer.save_checkpoint(partial, weights_only=False)
        if trainer.is_global_zero and os.path.exists(partial):
            _put_in_place(partial, self.ckpt_path)


def _put_in_place(source: str, target: str) -> None:
    """Rename `source` to `target`; a file atomically, a sharded checkpoint folder after removing the old one."""
    if os.path.isdir(target):
        shutil.rmtree(target)  # os.replace cannot put anything over a folder
    elif os.path.isdir(source) and os.path.exists(target):
        os.remove(target)
    os.replace(source, target)


class SeedEveryBatch(Callback):
    """Reseed Python, NumPy and torch (CPU and every GPU) before each training batch.

    The seed is derived from (``seed``, the batch index counted over the whole fit, the
    global rank), all of which Lightning restores from a checkpoint; a resumed run therefore
    draws the same dropout masks as the uninterrupted one, whatever else consumed random
    numbers in between. ``seed`` defaults to the seed given to `lightning.seed_everything`.
    """

    def __init__(self, seed: int | None = None) -> None:
        super().__init__()
        self.seed = seed

    @staticmethod
    def batch_seed(seed: int, batch_index: int, rank: int) -> int:
        """A well-mixed 63-bit seed for one (seed, batch, rank) triple."""
        digest = hashlib.blake2b(f"{seed}/{batch_index}/{rank}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little") >> 1

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                             batch: Any, batch_idx: int) -> None:
        batch_index = trainer.fit_loop.epoch_loop.total_batch_idx
        value = self.batch_seed(global_seed(self.seed), batch_index, trainer.global_rank)
        random.seed(value)
        torch.manual_seed(value)  # also seeds every CUDA device
        try:
            import numpy
        except ImportError:
            return
        numpy.random.seed(value % 2**32)
