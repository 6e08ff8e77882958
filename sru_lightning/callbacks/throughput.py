"""Training throughput: tokens per second over the training batches.

The time counted is each training batch's forward, backward and optimizer step; data loading
and validation are excluded. The run record of the application reads it
(``tokens``, ``tokens_per_second``).
"""

from __future__ import annotations

import math
import time
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.types import STEP_OUTPUT
from typing_extensions import override

__all__ = ["TrainingThroughput"]


class TrainingThroughput(Callback):
    """Count training tokens (the batch's target elements) and the time spent on them.

    `tokens_per_second` is tokens / seconds between each training batch's start and end.
    State is kept per fit; it is not checkpointed (a resumed fit measures itself).

    Lightning's ``ThroughputMonitor`` is not the same measurement, so it is not used here:
    its clock runs from the start of training to the end of each batch (validation time is
    taken out, but fetching every batch from the dataloader stays in), where this callback
    counts only the time between a batch's start and end hooks (forward, backward and
    optimizer step); it synchronises CUDA after every batch, which slows the run it measures;
    it reports averages over its last ``window_size`` batches, through the logger, every
    ``log_every_n_steps`` as extra metrics (``train|device/...``), which would change what a
    run logs, and leaves nothing to read in a run without a logger (the run record needs a
    whole-fit figure either way); and it warns on every model without a ``flops_per_batch``
    attribute.
    """

    def __init__(self) -> None:
        super().__init__()
        self.tokens = 0
        self.seconds = 0.0
        self._batch_started: float | None = None

    @property
    def tokens_per_second(self) -> float:
        """Tokens over seconds since the fit started; NaN before the first training batch ends."""
        return self.tokens / self.seconds if self.seconds > 0 else math.nan

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.tokens, self.seconds, self._batch_started = 0, 0.0, None

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._batch_started = time.perf_counter()

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: STEP_OUTPUT, batch: Any, batch_idx: int
    ) -> None:
        if self._batch_started is None:
            return
        self.seconds += time.perf_counter() - self._batch_started
        self._batch_started = None
        targets = batch[-1] if isinstance(batch, (tuple, list)) else batch
        if isinstance(targets, torch.Tensor):
            self.tokens += targets.numel() * trainer.world_size
