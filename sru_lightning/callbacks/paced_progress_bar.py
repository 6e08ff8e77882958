"""Lightning's Rich progress bar, its training bar updated only as often as it is drawn.

Lightning's ``RichProgressBar`` draws from a thread at most ``refresh_rate`` times a second (100
by default), once after each update, and updates the training bar's count and metrics after
every batch: a Rich task update, the progress-bar metrics gathered from the trainer and the
metrics column rebuilt, about 0.17 ms a step plus the drawing, which competes with training for
the interpreter. :class:`PacedRichProgressBar` makes that update at most ``refresh_rate`` times a
second, and always at the last batch of an epoch, before a validation and when training ends, so
what stays on the screen is what Lightning's bar shows. The run configs set ``refresh_rate`` to
10 (Rich's own default): a bar redrawn ten times a second looks no different.
"""

from __future__ import annotations

import time
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import RichProgressBar
from typing_extensions import override


class PacedRichProgressBar(RichProgressBar):
    """``RichProgressBar`` whose training bar is updated at most ``refresh_rate`` times a second
    (and at an epoch's last batch, and when training ends); every argument is Lightning's."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._last_update = float("-inf")
        self._pending: tuple[int, Any] | None = None  # (batch_idx, pl_module) not shown yet

    def _interval(self) -> float:
        return 1.0 / self.refresh_rate if self.refresh_rate > 0 else 0.0

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        now = time.monotonic()
        last_of_epoch = batch_idx + 1 >= trainer.num_training_batches
        if now - self._last_update < self._interval() and not last_of_epoch and not trainer.should_stop:
            self._pending = (batch_idx, pl_module)
            return
        self._pending, self._last_update = None, now
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def _show_pending(self, trainer: pl.Trainer) -> None:
        if self._pending is None:
            return
        batch_idx, pl_module = self._pending
        self._pending = None
        super().on_train_batch_end(trainer, pl_module, None, None, batch_idx)

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._show_pending(trainer)
        super().on_train_epoch_end(trainer, pl_module)

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._show_pending(trainer)  # the training bar stays on screen, still, while validating
        super().on_validation_start(trainer, pl_module)

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._show_pending(trainer)
        super().on_train_end(trainer, pl_module)

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._show_pending(trainer)
        super().on_exception(trainer, pl_module, exception)
