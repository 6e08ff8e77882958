"""Training that survives interruption and resumes exactly where it stopped.

Lightning already does most of the work; this module supplies the three pieces it leaves
to the user, so that `fit(ckpt_path=...)` after a SIGTERM or Ctrl+C reproduces the losses
the uninterrupted run would have produced:

* **A checkpoint when the run is stopped.** Lightning turns SIGTERM into a clean stop at the
  next batch boundary and calls every callback's ``on_exception``;
  :class:`lightning.pytorch.callbacks.OnExceptionCheckpoint` saves the checkpoint there.
  :class:`GracefulInterrupt` gives the first Ctrl+C (SIGINT) the same clean stop instead of a
  ``KeyboardInterrupt`` that may land half way through an optimizer step; a second Ctrl+C
  aborts at once.
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
import threading
import warnings
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback, OnExceptionCheckpoint
from lightning.pytorch.utilities.exceptions import SIGTERMException
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
    """Make the first Ctrl+C (SIGINT) stop training the way SIGTERM does.

    Lightning's SIGTERM handler lets the current batch finish, then raises at a clean
    boundary, so ``on_exception`` callbacks (``OnExceptionCheckpoint``) save a consistent
    checkpoint. A ``KeyboardInterrupt`` instead lands wherever Python happens to be, possibly
    between two parameter updates. This callback, while training runs in the main thread,
    turns the first SIGINT into that SIGTERM stop; a second SIGINT raises
    ``KeyboardInterrupt`` at once (Lightning still runs ``on_exception``). The previous
    handler is put back when training ends.
    """

    def __init__(self) -> None:
        super().__init__()
        self._previous_handler: Any = None
        self._installed = False
        self.stop_requested = False

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # on_train_start runs after the Trainer has installed its own SIGTERM handler, whose
        # clean-stop behaviour the first Ctrl+C borrows.
        if threading.current_thread() is not threading.main_thread():
            return
        self.stop_requested = False
        self._previous_handler = signal.getsignal(signal.SIGINT)
        signal.signal(signal.SIGINT, self._handle_sigint)
        self._installed = True

    def _handle_sigint(self, signum, frame) -> None:
        if self.stop_requested:
            raise KeyboardInterrupt
        self.stop_requested = True
        log.warning(
            "Interrupted: stopping after the current batch and saving a checkpoint "
            "(press Ctrl+C again to abort at once)"
        )
        signal.raise_signal(signal.SIGTERM)

    def _restore_handler(self) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._previous_handler or signal.default_int_handler)
            self._installed = False

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._restore_handler()

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                     exception: BaseException) -> None:
        self._restore_handler()

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._restore_handler()


def is_interruption(exception: BaseException) -> bool:
    """True for a stop the user or the scheduler asked for: SIGTERM, Ctrl+C."""
    return isinstance(exception, (SIGTERMException, KeyboardInterrupt))


class InterruptionCheckpoint(OnExceptionCheckpoint):
    """`OnExceptionCheckpoint` that saves only what is worth resuming.

    It writes the checkpoint when the fit is interrupted (SIGTERM, Ctrl+C) after at least one
    optimizer step. A crash or a diverged loss (see :mod:`sru_lightning.guards`) leaves no
    new checkpoint: its weights may be NaN or half-updated, and a file named like a resumable
    one would invite a requeue to continue from them. The run's epoch-end and periodic
    checkpoints stay where they are.
    """

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        if not is_interruption(exception):
            log.info("No %s written: the fit failed (%s), it was not interrupted", self.ckpt_path,
                     type(exception).__name__)
            return
        if trainer.global_step < 1:
            log.info("No %s written: the fit was interrupted before its first optimizer step", self.ckpt_path)
            return
        # A full checkpoint (optimizer, schedulers, loops), as the epoch-end ones.
        trainer.save_checkpoint(self.ckpt_path, weights_only=False)


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
