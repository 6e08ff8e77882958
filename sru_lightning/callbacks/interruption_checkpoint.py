"""A checkpoint written when a fit is stopped by SIGTERM or Ctrl+C, and only then.

:class:`InterruptionCheckpoint` saves the fit's full state when
:class:`~sru_lightning.callbacks.graceful_interrupt.GracefulInterrupt` has stopped it at a
batch boundary; a failure or an abort leaves no checkpoint that would look resumable.
The file (or a sharded checkpoint's folder) is written beside its name and renamed into place
(:func:`sru_lightning._atomic.put_in_place`).
"""

from __future__ import annotations

import logging
import os

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Checkpoint
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import SIGTERMException
from typing_extensions import override

from sru_lightning._atomic import PARTIAL_SUFFIX, discard, put_in_place

log = logging.getLogger(__name__)

__all__ = ["InterruptionCheckpoint"]


class InterruptionCheckpoint(Checkpoint):
    """Saves, on an interruption, only what is worth resuming; resuming is the caller's choice.

    It writes the checkpoint when the fit is stopped at a batch boundary by SIGTERM or the
    first Ctrl+C (Lightning's ``SIGTERMException``) after at least one optimizer step. A
    crash, a diverged loss (see :mod:`sru_lightning.callbacks.nonfinite_loss`) or an abort (a second Ctrl+C,
    ``KeyboardInterrupt``, which may land half way through a step) leaves no new checkpoint:
    its weights may be NaN or half-updated, and a file named like a resumable one would
    invite a requeue to continue from them. The file appears complete or not at all (written
    under a temporary name, then renamed). The run's epoch-end and periodic checkpoints
    stay where they are. A fit that resumes from the file and completes removes it: what it
    held is superseded. Any other Trainer call leaves it, unlike Lightning's
    ``OnExceptionCheckpoint``, which removes it after every completed call: a fresh fit into the
    same folder has not read it (it may hold another run's interruption, never resumed).

    It is a plain :class:`~lightning.pytorch.callbacks.Checkpoint`, not Lightning's
    ``OnExceptionCheckpoint``, on purpose: Lightning turns ``fit(model)`` into
    ``fit(model, ckpt_path="last")`` whenever one of those is among the callbacks, so a new
    model fitted by the same script would silently continue from an old run's weights (and
    every fit would warn that it "was called without a model"). A fit resumes from this file
    only when its caller passes ``ckpt_path=`` (the command line does, from its own setting).

    Args:
        dirpath: the folder of the checkpoint; fixed here, since an interruption may come
            before ``setup``.
        filename: its name without the ``.ckpt`` extension.
    """

    FILE_EXTENSION = ".ckpt"

    def __init__(self, dirpath: str | os.PathLike[str], filename: str = "on_exception") -> None:
        super().__init__()
        if not isinstance(filename, str) or not filename:
            raise ValueError(f"InterruptionCheckpoint: `filename` must be a non-empty name, got {filename!r}")
        self.dirpath = dirpath
        self.filename = filename

    @property
    def ckpt_path(self) -> str:
        """Where the checkpoint is written: ``<dirpath>/<filename>.ckpt``."""
        return os.path.join(self.dirpath, self.filename + self.FILE_EXTENSION)

    @override
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
        partial = self.ckpt_path + PARTIAL_SUFFIX
        try:
            trainer.save_checkpoint(partial, weights_only=False)
        except BaseException:
            # An abort (a second Ctrl+C) or a failure half way through: nothing may look resumable.
            if trainer.is_global_zero:
                discard(partial)
            raise
        if trainer.is_global_zero and os.path.exists(partial):
            put_in_place(partial, self.ckpt_path)

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        # Lightning calls teardown only when a Trainer call completed (an interrupted one goes
        # through on_exception instead). A completed fit that resumed from the file supersedes
        # it; any other call leaves it: a fresh fit never read it (it may be another run's that
        # was never resumed), and an evaluation changes no training state.
        if trainer.state.fn == TrainerFn.FITTING and _same_file(trainer.ckpt_path, self.ckpt_path):
            trainer.strategy.remove_checkpoint(self.ckpt_path)


def _same_file(resumed: str | os.PathLike[str] | None, own: str) -> bool:
    return resumed is not None and os.path.realpath(resumed) == os.path.realpath(own)
