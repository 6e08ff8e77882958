"""Callbacks every run of the command line adds to its trainer: where its training started and
when it last validated (:class:`LastValidation`, read when the final metrics are taken), and
the line naming its directory once it is under way (:class:`AnnounceRunDirectory`).
"""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from .console import say

__all__ = ["AnnounceRunDirectory", "LastValidation"]


class LastValidation(Callback):
    """Remembers the optimizer step of the fit's most recent validation, and where its training
    started: the optimizer step and whether it resumed in the middle of an epoch."""

    def __init__(self) -> None:
        super().__init__()
        self.step: int | None = None
        self.start_step: int | None = None
        self.resumed_mid_epoch = False
        self.epochs_ended = 0

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Not called when a resumed fit has nothing left to train (start_step stays None).
        self.start_step = trainer.global_step
        self.resumed_mid_epoch = trainer.fit_loop.epoch_loop.batch_progress.current.completed > 0
        self.epochs_ended = 0

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.epochs_ended += 1

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.sanity_checking and trainer.state.fn == "fit":
            self.step = trainer.global_step


class AnnounceRunDirectory(Callback):
    """Prints the run directory once the run is under way: after Lightning has checked the
    settings against the data, so a run refused as a usage error never names a directory."""

    def __init__(self, output_dir: Path) -> None:
        super().__init__()
        self.output_dir = output_dir
        self.said = False

    def _say_once(self, trainer: pl.Trainer) -> None:
        if not self.said and trainer.is_global_zero and not trainer.sanity_checking:
            self.said = True
            say(f"run directory: {self.output_dir}")

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._say_once(trainer)

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._say_once(trainer)

    @override
    def on_test_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._say_once(trainer)
