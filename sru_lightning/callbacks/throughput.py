"""Training throughput: tokens per second over the training batches, FLOPs and MFU.

The time counted is each training batch's forward, backward and optimizer step; data loading
and validation are excluded. The FLOPs of a training batch are counted once, on the first
one, by ``torch.utils.flop_counter.FlopCounterMode`` (which counts the SRU recurrence through
the formulas of :mod:`sru_lightning.ops.flops`); that batch is left out of the timing, so the
counter's own cost is not in any rate. The run record of the application reads it
(``train_tokens``, ``tokens_per_second``, ``flops_per_batch``, ``flops_per_second``, ``mfu``).
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

from sru_lightning._lightning_compat import compiled_by_lightning

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
    whole-fit figure either way); and it needs the model to carry its ``flops_per_batch``,
    which this callback counts itself on the first training batch.

    MFU is the FLOPs per second of one process over the peak of its device for the matmul
    dtype of the run's precision (``lightning.fabric.utilities.throughput.get_available_flops``,
    known for CUDA GPUs; None elsewhere, e.g. on CPU). The FLOPs are not counted for a model
    compiled with ``torch.compile`` (the counter would run the compiled graph's fallback), nor
    with ``count_flops=False``.
    """

    def __init__(self, count_flops: bool = True) -> None:
        super().__init__()
        self.count_flops = bool(count_flops)
        self.tokens = 0
        self.seconds = 0.0
        self.timed_tokens = 0
        self.timed_batches = 0
        self.flops_per_batch: int | None = None
        self.peak_flops: float | None = None
        self._batch_started: float | None = None
        self._counter: Any = None

    @property
    def tokens_per_second(self) -> float:
        """Timed tokens over their seconds; NaN before a timed training batch has ended."""
        return self.timed_tokens / self.seconds if self.seconds > 0 else math.nan

    @property
    def flops_per_second(self) -> float | None:
        """FLOPs per second of this process over the timed batches, None when not counted."""
        if self.flops_per_batch is None or self.seconds <= 0:
            return None
        return self.flops_per_batch * self.timed_batches / self.seconds

    @property
    def mfu(self) -> float | None:
        """Model FLOPs utilization of this process's device, None where its peak is unknown."""
        rate = self.flops_per_second
        if rate is None or not self.peak_flops:
            return None
        return rate / self.peak_flops

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.tokens, self.seconds, self._batch_started = 0, 0.0, None
        self.timed_tokens, self.timed_batches, self.flops_per_batch, self._counter = 0, 0, None, None
        self.peak_flops = _peak_flops(trainer)

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self.count_flops and self.flops_per_batch is None and not compiled_by_lightning(pl_module):
            from torch.utils.flop_counter import FlopCounterMode

            self._counter = FlopCounterMode(display=False)
            self._counter.__enter__()
            return
        self._batch_started = time.perf_counter()

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: STEP_OUTPUT, batch: Any, batch_idx: int
    ) -> None:
        # (inputs, targets) or (inputs, targets, reset): the targets are the second element
        targets = batch[1] if isinstance(batch, (tuple, list)) and len(batch) > 1 else batch
        tokens = targets.numel() * trainer.world_size if isinstance(targets, torch.Tensor) else 0
        if self._counter is not None:
            self._stop_counting()
            self.tokens += tokens
            return
        if self._batch_started is None:
            return
        self.seconds += time.perf_counter() - self._batch_started
        self._batch_started = None
        self.tokens += tokens
        self.timed_tokens += tokens
        self.timed_batches += 1

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        if self._counter is not None:
            self._counter.__exit__(None, None, None)
            self._counter = None

    def _stop_counting(self) -> None:
        counter, self._counter = self._counter, None
        counter.__exit__(None, None, None)
        self.flops_per_batch = int(counter.get_total_flops())


def _peak_flops(trainer: pl.Trainer) -> float | None:
    """The device's peak FLOPs for the run's matmul dtype (Lightning's table of GPUs), or None."""
    from lightning.fabric.utilities.throughput import get_available_flops

    from sru_lightning.precision import detect_regime

    device = trainer.strategy.root_device
    if device.type != "cuda":
        return None
    peak = get_available_flops(device, detect_regime(trainer).u_dtype)
    return float(peak) if peak else None
