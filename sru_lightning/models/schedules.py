"""The language model's default learning-rate schedule, valid for any length of run.

`torch.optim.lr_scheduler.OneCycleLR` divides by the length of its warm-up phase, which
rounds to zero steps for short runs (10 steps at 10% warm-up), and it needs the total number
of steps up front, which a run bounded by `max_time` or `max_epochs=-1` does not know.
:class:`WarmupCosineLR` keeps OneCycle's shape (linear warm-up, then cosine decay to a small
floor) for every total from 1 step up, and falls back to warm-up then a constant rate when
the total is unknown.
"""

from __future__ import annotations

import math

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

__all__ = ["WarmupCosineLR", "FALLBACK_WARMUP_STEPS"]

#: Warm-up length when the total number of steps is unknown.
FALLBACK_WARMUP_STEPS = 100


class WarmupCosineLR(LRScheduler):
    """Linear warm-up to each group's `lr`, then cosine decay to `final_lr_fraction` of it.

    Args:
        optimizer: the optimizer whose groups' `lr` is the peak rate.
        total_steps: optimizer steps in the run, or None when unknown (`max_time`,
            `max_epochs=-1`): then the rate warms up over `fallback_warmup_steps` and stays
            at the peak.
        warmup_fraction: share of `total_steps` spent warming up (rounded, at least one step
            when the run has two or more steps; a one-step run uses the peak rate).
        final_lr_fraction: the rate at the last step, as a fraction of the peak.
        fallback_warmup_steps: warm-up length when `total_steps` is None.

    Step `s` (0-based, one per optimizer step) uses the peak rate times:
    `(s + 1) / (w + 1)` while `s < w`, then
    `f + (1 - f) * (1 + cos(pi * (s - w) / max(1, T - 1 - w))) / 2` up to the last step T - 1.
    """

    def __init__(
        self,
        optimizer: Optimizer,
        total_steps: int | None = None,
        warmup_fraction: float = 0.1,
        final_lr_fraction: float = 0.04,
        fallback_warmup_steps: int = FALLBACK_WARMUP_STEPS,
        last_epoch: int = -1,
    ) -> None:
        if total_steps is not None and (
            isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 1
        ):
            raise ValueError(f"WarmupCosineLR: `total_steps` must be a positive integer or None, got {total_steps!r}")
        if not 0.0 <= warmup_fraction < 1.0:
            raise ValueError(f"WarmupCosineLR: `warmup_fraction` must be in [0, 1), got {warmup_fraction!r}")
        if not 0.0 <= final_lr_fraction <= 1.0:
            raise ValueError(f"WarmupCosineLR: `final_lr_fraction` must be in [0, 1], got {final_lr_fraction!r}")
        if (
            isinstance(fallback_warmup_steps, bool)
            or not isinstance(fallback_warmup_steps, int)
            or fallback_warmup_steps < 0
        ):
            raise ValueError(
                f"WarmupCosineLR: `fallback_warmup_steps` must be a non-negative integer, got {fallback_warmup_steps!r}"
            )
        self.total_steps = total_steps
        self.warmup_fraction = float(warmup_fraction)
        self.final_lr_fraction = float(final_lr_fraction)
        self.fallback_warmup_steps = fallback_warmup_steps
        super().__init__(optimizer, last_epoch)

    @property
    def warmup_steps(self) -> int:
        if self.total_steps is None:
            return self.fallback_warmup_steps
        if self.total_steps < 2:
            return 0
        # Leave at least one step after the warm-up, so the peak is reached.
        return (
            min(max(1, round(self.warmup_fraction * self.total_steps)), self.total_steps - 1)
            if self.warmup_fraction > 0
            else 0
        )

    def factor(self, step: int) -> float:
        """Multiplier of the peak rate at optimizer step `step` (0-based)."""
        warmup = self.warmup_steps
        if step < warmup:
            return (step + 1) / (warmup + 1)
        if self.total_steps is None:
            return 1.0
        decay_steps = max(1, self.total_steps - 1 - warmup)
        progress = min(1.0, (step - warmup) / decay_steps)
        floor = self.final_lr_fraction
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))

    def get_lr(self) -> list[float]:
        scale = self.factor(max(0, self.last_epoch))
        return [base_lr * scale for base_lr in self.base_lrs]
