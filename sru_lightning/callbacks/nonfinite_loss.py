"""Stop a fit the moment its training loss stops being a number.

torchmetrics' means skip NaN, so without :class:`StopOnNonFiniteLoss` a diverged run can end
with finite-looking numbers and exit status 0; with it, a NaN or Inf training loss stops the
fit at once with :class:`NonFiniteLossError`, whose message names the step and the likely
causes.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.types import STEP_OUTPUT
from typing_extensions import override

__all__ = ["NonFiniteLossError", "StopOnNonFiniteLoss"]


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or infinite."""


def _likely_causes(trainer: pl.Trainer) -> str:
    """The usual reasons for a non-finite loss under this trainer's settings, most likely first."""
    causes = ["the learning rate is too high for this model (lower model.optimizer.lr)"]
    precision = str(getattr(trainer, "precision", ""))
    if precision.startswith("16"):
        causes.insert(
            0,
            "float16's range: activations or gradients overflowed (bf16-true / bf16-mixed have "
            "float32's range; 16-mixed scales the loss)",
        )
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

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: STEP_OUTPUT, batch: Any, batch_idx: int
    ) -> None:
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
