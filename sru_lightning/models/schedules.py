"""The language model's default learning-rate schedule, valid for any length of run.

`torch.optim.lr_scheduler.OneCycleLR` divides by the length of its warm-up phase, which
rounds to zero steps for short runs (10 steps at 10% warm-up), and it needs the total number
of steps up front, which a run bounded by `max_time` or `max_epochs=-1` does not know.
:class:`WarmupCosineLR` keeps OneCycle's shape (linear warm-up, then cosine decay to a small
floor) for every total from 1 step up. A run bounded by time instead of steps reports the
fraction of its budget used (:meth:`WarmupCosineLR.set_progress`, fed by
:class:`sru_lightning.callbacks.TimeBudget`) and the same shape follows that fraction; a run
bounded by neither warms up, then holds the peak rate.
"""

from __future__ import annotations

import math

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

__all__ = ["WarmupCosineLR", "FALLBACK_WARMUP_STEPS", "SHAPES"]

#: Warm-up length when neither the total number of steps nor the progress is known.
FALLBACK_WARMUP_STEPS = 100

#: What follows the warm-up: a cosine decay over the rest of the run, or warm-up-stable-decay
#: (the peak rate, then a linear decay over the last `decay_fraction` of the run).
SHAPES = ("cosine", "wsd")


class WarmupCosineLR(LRScheduler):
    """Linear warm-up to each group's `lr`, then a decay to `final_lr_fraction` of it.

    Args:
        optimizer: the optimizer whose groups' `lr` is the peak rate.
        total_steps: optimizer steps in the run, or None when unknown (`max_time`,
            `max_epochs=-1`): then the schedule follows the fraction of the run done, as
            reported by :meth:`set_progress` (a time budget); with no report, the rate warms
            up over `fallback_warmup_steps` and stays at the peak.
        warmup_fraction: share of the run spent warming up (of `total_steps`, rounded, at
            least one step when the run has two or more steps, a one-step run using the peak
            rate; or of the reported progress).
        final_lr_fraction: the rate at the end of the run, as a fraction of the peak.
        fallback_warmup_steps: warm-up length when neither `total_steps` nor progress is known.
        shape: "cosine" (decay over all the run after the warm-up) or "wsd" (warm-up, stable
            at the peak, then a linear decay over the last `decay_fraction` of the run).
        decay_fraction: share of the run the "wsd" decay takes, in (0, 1 - warmup_fraction]
            (unused by "cosine").

    With `total_steps` T, step `s` (0-based, one per optimizer step) uses the peak rate times
    `(s + 1) / (w + 1)` while `s < w`, then `decay(q)` with `q = (s - w) / max(1, T - 1 - w)`.
    With progress `p` (0 to 1), it uses `p / warmup_fraction` while `p < warmup_fraction`, then
    `decay(q)` with `q = (p - warmup_fraction) / (1 - warmup_fraction)`. For "cosine",
    `decay(q) = f + (1 - f) * (1 + cos(pi * q)) / 2`; for "wsd", `decay(q)` is 1 up to
    `q0 = 1 - decay_fraction / (1 - warmup_fraction)`, then falls linearly to `f` at `q = 1`.
    """

    def __init__(
        self,
        optimizer: Optimizer,
        total_steps: int | None = None,
        warmup_fraction: float = 0.1,
        final_lr_fraction: float = 0.04,
        fallback_warmup_steps: int = FALLBACK_WARMUP_STEPS,
        shape: str = "cosine",
        decay_fraction: float = 0.2,
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
        if shape not in SHAPES:
            raise ValueError(f"WarmupCosineLR: `shape` must be one of {SHAPES}, got {shape!r}")
        # The wsd decay fits in the run after the warm-up.
        longest_decay = 1.0 - warmup_fraction if shape == "wsd" else 1.0
        if not 0.0 < decay_fraction <= longest_decay:
            raise ValueError(
                f"WarmupCosineLR: `decay_fraction` must be in (0, {longest_decay:g}], got {decay_fraction!r}"
            )
        self.total_steps = total_steps
        self.warmup_fraction = float(warmup_fraction)
        self.final_lr_fraction = float(final_lr_fraction)
        self.fallback_warmup_steps = fallback_warmup_steps
        self.shape = shape
        self.decay_fraction = float(decay_fraction)
        #: Fraction of the run done (0 to 1) as last reported, or None: the schedule follows it
        #: while `total_steps` is None. Part of the state_dict, so a resumed run continues.
        self.progress: float | None = None
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

    @property
    def follows_progress(self) -> bool:
        """Whether the rate follows the reported progress (no step count, progress reported)."""
        return self.total_steps is None and self.progress is not None

    def set_progress(self, fraction: float) -> None:
        """Report the fraction of the run done (0 to 1) and apply its rate to the optimizer now.

        The rate applies from the next optimizer step on. Ignored (but kept) when the run has a
        step count: the step schedule then wins.
        """
        fraction = float(fraction)
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"WarmupCosineLR.set_progress: `fraction` must be in [0, 1], got {fraction!r}")
        self.progress = fraction
        if not self.follows_progress:
            return
        for group, lr in zip(self.optimizer.param_groups, self.get_lr()):
            group["lr"] = lr
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def factor(self, step: int) -> float:
        """Multiplier of the peak rate at optimizer step `step` (0-based)."""
        if self.follows_progress:
            return self.factor_at_progress(self.progress)
        warmup = self.warmup_steps
        if step < warmup:
            return (step + 1) / (warmup + 1)
        if self.total_steps is None:
            return 1.0
        decay_steps = max(1, self.total_steps - 1 - warmup)
        return self._decay(min(1.0, (step - warmup) / decay_steps))

    def factor_at_progress(self, progress: float) -> float:
        """Multiplier of the peak rate once `progress` (0 to 1) of the run is done."""
        warmup = self.warmup_fraction
        if progress < warmup:
            return progress / warmup
        return self._decay(min(1.0, (progress - warmup) / (1.0 - warmup)))

    def _decay(self, done: float) -> float:
        """The multiplier after the warm-up, `done` (0 to 1) of the way to the end."""
        floor = self.final_lr_fraction
        if self.shape == "wsd":
            start = max(0.0, 1.0 - self.decay_fraction / (1.0 - self.warmup_fraction))
            if done <= start:
                return 1.0
            return 1.0 - (1.0 - floor) * (done - start) / (1.0 - start)
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * done))

    def get_lr(self) -> list[float]:
        scale = self.factor(max(0, self.last_epoch))
        return [base_lr * scale for base_lr in self.base_lrs]
