"""A resumed fit continues at the checkpointed batch of the epoch.

A :class:`sru_lightning.data.ResumableDataLoader` keeps its place in the epoch through the
checkpoint, but Lightning 2.6 hands the saved state to the dataloader only when it is first set
up after the restore; a model whose ``configure_optimizers`` reads
``trainer.estimated_stepping_batches`` (as step-based schedules such as OneCycleLR often do;
with ``max_epochs`` set this loads the dataloader) sets it up earlier, and the state is
silently dropped. :class:`RestoreDataPosition` applies it before the first batch in that case.
"""

from __future__ import annotations

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from sru_lightning._lightning_compat import load_skipped_dataloader_states

__all__ = ["RestoreDataPosition"]


class RestoreDataPosition(Callback):
    """Hand the checkpointed dataloader position to the training dataloaders, if Lightning did not.

    Lightning loads the states of stateful training dataloaders while it sets them up, but
    only when the checkpoint has already been restored. ``trainer.estimated_stepping_batches``
    (read by ``configure_optimizers`` for step-based schedules) sets the dataloaders up
    before that, and Lightning then never loads the states. ``on_train_start`` runs after
    the restore and before the first batch is fetched, so loading them here still takes
    effect for a :class:`~sru_lightning.data.ResumableDataLoader` (it reads its position on
    the first batch).
    """

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Lightning's own restore consumes the saved states; anything left was skipped.
        load_skipped_dataloader_states(trainer.fit_loop)
