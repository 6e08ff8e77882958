"""Validate the weights a `max_steps` fit ends with, and keep that fit resumable.

A run that ends on `max_steps` in the middle of an epoch validates on its last step, inside the
fit, so `ModelCheckpoint` keeps its best and last checkpoints and the final metrics describe
the final weights. A fit bounded by `max_time` gets the same from
:class:`sru_lightning.callbacks.TimeBudget`, which stops it early enough to validate within the
budget.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.types import STEP_OUTPUT
from typing_extensions import override

__all__ = ["ValidateBeforeStop", "record_epoch_as_running"]


class ValidateBeforeStop(Callback):
    """A `max_steps` limit that lands inside an epoch: validate there, and stay resumable there.

    Lightning validates at epoch ends and every `val_check_interval`; a `max_steps` limit that
    lands between two of those ends the fit with a stale validation. Asking the trainer to
    stop on that step makes Lightning run the validation loop there, before the fit ends,
    so checkpoint callbacks see the final metrics.

    Lightning then records the cut epoch as finished, so a fit extended from that checkpoint
    (a larger `max_steps`) would start the next epoch and skip the rest of this one. The
    checkpoints written after the cut record the epoch as still running instead: the
    extended fit continues at the next batch (with a dataloader that restores its position,
    such as :class:`sru_lightning.data.ResumableDataLoader`).
    """

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: STEP_OUTPUT, batch: Any, batch_idx: int
    ) -> None:
        if self._cut_by_max_steps(trainer):
            trainer.should_stop = True

    @staticmethod
    def _cut_by_max_steps(trainer: pl.Trainer) -> bool:
        return (
            trainer.max_steps is not None
            and 0 < trainer.max_steps <= trainer.global_step
            and not trainer.fit_loop.epoch_loop.batch_progress.is_last_batch
        )

    @override
    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        if self._cut_by_max_steps(trainer):
            record_epoch_as_running(checkpoint)


def record_epoch_as_running(checkpoint: dict[str, Any]) -> None:
    """Make a checkpoint written after a stop inside an epoch record that epoch as still running.

    Lightning counts the cut epoch as processed; a fit resumed from the checkpoint would then
    start the next epoch and skip the rest of this one.
    """
    progress = checkpoint.get("loops", {}).get("fit_loop", {}).get("epoch_progress")
    if not progress:
        return
    for counts in (progress["total"], progress["current"]):
        # "started but not processed": the state of a checkpoint taken mid-epoch.
        if counts["processed"] == counts["started"] and counts["completed"] == counts["processed"] - 1:
            counts["processed"] -= 1
