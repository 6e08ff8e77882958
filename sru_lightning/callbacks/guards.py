"""Callbacks that keep a training run honest: it stops on a non-finite loss, it validates the
weights it ends with, and it measures its own throughput.

* :class:`StopOnNonFiniteLoss`: a NaN or Inf training loss stops the fit at once with an
  error naming the step and the likely causes (torchmetrics' means skip NaN, so without it a
  diverged run can end with finite-looking numbers and exit status 0).
* :class:`ValidateBeforeStop`: a run that ends on `max_steps` in the middle of an epoch
  validates on its last step, inside the fit, so `ModelCheckpoint` keeps its best and last
  checkpoints and the final metrics describe the final weights.
* :class:`TrainingThroughput`: tokens per second over the training batches (forward,
  backward and optimizer step; data loading and validation excluded).
"""

from __future__ import annotations

import math
import time
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback

__all__ = ["NonFiniteLossError", "StopOnNonFiniteLoss", "TrainingThroughput", "ValidateBeforeStop"]


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or infinite."""


def _likely_causes(trainer: pl.Trainer) -> str:
    causes = ["the learning rate is too high for this model (lower model.optimizer.lr)"]
    precision = str(getattr(trainer, "precision", ""))
    if precision.startswith("16"):
        causes.insert(0, "float16's range: activations or gradients overflowed (bf16-true / bf16-mixed have "
                         "float32's range; 16-mixed scales the loss)")
    if not trainer.gradient_clip_val:
        causes.append("exploding gradients (set trainer.gradient_clip_val, e.g. 1.0)")
    causes.append("NaN or Inf in the input data")
    return "; ".join(causes)


class StopOnNonFiniteLoss(Callback):
    """Stop training with :class:`NonFiniteLossError` when the training loss is NaN or Inf.

    Args:
        check_every_n_steps: look at the loss every this many training batches (1: every
            batch; reading the loss waits for the device, which costs a little on GPUs).
    """

    def __init__(self, check_every_n_steps: int = 1) -> None:
        super().__init__()
        if isinstance(check_every_n_steps, bool) or not isinstance(check_every_n_steps, int) or check_every_n_steps < 1:
            raise ValueError(
                f"StopOnNonFiniteLoss: `check_every_n_steps` must be a positive integer, got {check_every_n_steps!r}"
            )
        self.check_every_n_steps = check_every_n_steps

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any,
                           batch: Any, batch_idx: int) -> None:
        if batch_idx % self.check_every_n_steps:
            return
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if not isinstance(loss, torch.Tensor) or bool(torch.isfinite(loss.detach()).all()):
            return
        value = float(loss.detach().float().reshape(-1)[0])
        raise NonFiniteLossError(
            f"the training loss is {value} at optimizer step {trainer.global_step} "
            f"(epoch {trainer.current_epoch}, batch {batch_idx}); training stopped. Likely causes: "
            f"{_likely_causes(trainer)}"
        )


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
    such as :class:`sru_lightning.callbacks.fault_tolerance.ResumableDataLoader`).
    """

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any,
                           batch: Any, batch_idx: int) -> None:
        if self._cut_by_max_steps(trainer):
            trainer.should_stop = True

    @staticmethod
    def _cut_by_max_steps(trainer: pl.Trainer) -> bool:
        return (trainer.max_steps is not None and 0 < trainer.max_steps <= trainer.global_step
                and not trainer.fit_loop.epoch_loop.batch_progress.is_last_batch)

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        if not self._cut_by_max_steps(trainer):
            return
        progress = checkpoint.get("loops", {}).get("fit_loop", {}).get("epoch_progress")
        if not progress:
            return
        for counts in (progress["total"], progress["current"]):
            # "started but not processed": the state of a checkpoint taken mid-epoch.
            if counts["processed"] == counts["started"] and counts["completed"] == counts["processed"] - 1:
                counts["processed"] -= 1


class TrainingThroughput(Callback):
    """Count training tokens (the batch's target elements) and the time spent on them.

    `tokens_per_second` is tokens / seconds between each training batch's start and end.
    State is kept per fit; it is not checkpointed (a resumed fit measures itself).
    """

    def __init__(self) -> None:
        super().__init__()
        self.tokens = 0
        self.seconds = 0.0
        self._batch_started: float | None = None

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else math.nan

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.tokens, self.seconds, self._batch_started = 0, 0.0, None

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        self._batch_started = time.perf_counter()

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any,
                           batch: Any, batch_idx: int) -> None:
        if self._batch_started is None:
            return
        self.seconds += time.perf_counter() - self._batch_started
        self._batch_started = None
        targets = batch[-1] if isinstance(batch, (tuple, list)) else batch
        if isinstance(targets, torch.Tensor):
            self.tokens += targets.numel() * trainer.world_size
