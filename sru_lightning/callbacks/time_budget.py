"""A fit bounded by `trainer.max_time`: the learning rate decays over the budget, and the last
validation fits in it.

Lightning's Timer (which `trainer.max_time` adds) stops a fit once its time is up, wherever that
lands: the learning-rate schedule never learns how long the run is, and the last validation
comes long before the last step, or after the budget. :class:`TimeBudget` reads the Timer's
clock after every training batch and
- tells the schedule (every scheduler with a `set_progress(fraction)` method, such as
  :class:`sru_lightning.models.schedules.WarmupCosineLR` with no step count) which fraction of
  the training time is used, so its warm-up and decay span the budget;
- stops the fit early enough for one more validation (and its checkpoint) within the budget.

Rank 0 measures and decides; every rank uses its numbers (the strategy's broadcast).
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback, Timer
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.types import STEP_OUTPUT
from typing_extensions import override

from .validate_before_stop import record_epoch_as_running

__all__ = ["TimeBudget"]


class TimeBudget(Callback):
    """Fit the learning-rate schedule and a final validation into the fit's time budget.

    Does nothing in a fit without a time limit (no Timer with a duration among the callbacks).

    Args:
        validation_margin: the longest validation measured so far (from its start to the next
            training batch, so the checkpoints it writes are included) is multiplied by this
            to reserve the time of the final one.
        step_window: the time of a training step is the mean of this many latest ones.

    Training ends by `end = max_time - validation_margin * validation - step`. The schedule's
    progress for the next step is `(elapsed + ahead) / (end - step)`, where `elapsed` is the
    Timer's training time and `ahead` the time until the next step ends (a step, plus a
    validation when one is due first); it is at most 1 and never decreases within a fit. The
    last step that fits thus runs at progress 1, the schedule's final rate, and the fit stops
    after it, or earlier if the next step would end after `end` (a step or a validation took
    longer than measured so far). Lightning then validates before the fit ends (a stop
    requested through `trainer.should_stop` validates), so the final checkpoint and metrics
    describe the final weights. Before the first validation its time is estimated from the
    sanity check (scaled to the number of validation batches) or, without one, as one
    training step per batch.
    """

    def __init__(self, validation_margin: float = 1.25, step_window: int = 20) -> None:
        if isinstance(validation_margin, bool) or not (
            isinstance(validation_margin, (int, float)) and validation_margin >= 1.0
        ):
            raise ValueError(f"TimeBudget: `validation_margin` must be a number >= 1, got {validation_margin!r}")
        if isinstance(step_window, bool) or not isinstance(step_window, int) or step_window < 1:
            raise ValueError(f"TimeBudget: `step_window` must be a positive integer, got {step_window!r}")
        self.validation_margin = float(validation_margin)
        self.step_window = step_window
        self._reset()

    def _reset(self) -> None:
        self._timer: Timer | None = None
        self._batch_seconds: deque[float] = deque(maxlen=self.step_window)
        self._last_batch_end: float | None = None
        self._validation_started: float | None = None
        self._validation_seconds: float | None = None  # longest measured in this fit
        self._sanity_seconds_per_batch: float | None = None
        self._started = 0.0  # the clock when this fit's training started (the restored time on a resume)
        self._validation_ended: float | None = None
        self._first_batch_seconds = 0.0
        self._fraction = 0.0
        self._stopped_inside_epoch = False

    @property
    def fraction(self) -> float:
        """The fraction of the training time used, as last given to the schedule."""
        return self._fraction

    @staticmethod
    def _budget_timer(trainer: pl.Trainer) -> Timer | None:
        timers = (callback for callback in trainer.callbacks if isinstance(callback, Timer))
        return next((timer for timer in timers if timer.time_remaining() is not None), None)

    def _clock(self) -> float:
        assert self._timer is not None
        return self._timer.time_elapsed("train")

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._reset()
        self._timer = self._budget_timer(trainer)
        if self._timer is None:
            return
        self._started = self._clock()
        sanity_batches = _finite_sum(trainer.num_sanity_val_batches)
        sanity_seconds = self._timer.time_elapsed("validate")
        if sanity_batches and sanity_seconds > 0:
            self._sanity_seconds_per_batch = sanity_seconds / sanity_batches
        # The first step's rate follows the time used so far (0, or the restored elapsed time).
        fraction, _ = self._measure(trainer, step_seconds=0.0, ahead=0.0)
        following = self._give_progress(trainer, fraction)
        if following:
            budget = self._clock() + self._timer.time_remaining()
            rank_zero_info(
                f"TimeBudget: the learning rate of {', '.join(following)} follows the {budget:g} s time budget "
                f"({fraction:.0%} used so far)"
            )

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._timer is not None and not trainer.sanity_checking:
            self._validation_started = self._clock()

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._timer is None or self._validation_started is None:
            return
        self._validation_ended = self._clock()
        seconds = self._validation_ended - self._validation_started
        self._validation_seconds = max(seconds, self._validation_seconds or 0.0)
        self._validation_started = None
        self._last_batch_end = None  # the interval since then held a validation, not a step

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: STEP_OUTPUT, batch: Any, batch_idx: int
    ) -> None:
        if self._timer is None:
            return
        now = self._clock()
        if self._last_batch_end is not None:
            self._batch_seconds.append(now - self._last_batch_end)
        else:
            # The first batch of the fit or after a validation: its time includes starting up, a
            # worst case the next measured steps replace.
            self._first_batch_seconds = now - (self._validation_ended or self._started)
        self._last_batch_end = now
        batch_seconds = (
            sum(self._batch_seconds) / len(self._batch_seconds) if self._batch_seconds else self._first_batch_seconds
        )
        step_seconds = trainer.accumulate_grad_batches * batch_seconds
        is_last_batch = trainer.fit_loop.epoch_loop.batch_progress.is_last_batch
        # Before the next step can end: that step, and a validation if one is due after this batch.
        ahead = step_seconds
        if self._validation_due(trainer, batch_idx, is_last_batch):
            ahead += self._validation_estimate(trainer, step_seconds)
        ran_at_the_end = self._fraction >= 1.0  # the step just made was the last one planned
        fraction, stop = self._measure(trainer, step_seconds, ahead)
        stop = stop or ran_at_the_end
        self._give_progress(trainer, fraction)
        steps_now = (batch_idx + 1) % trainer.accumulate_grad_batches == 0 or is_last_batch
        if stop and steps_now and not trainer.should_stop:
            trainer.should_stop = True
            self._stopped_inside_epoch = not is_last_batch
            remaining = self._timer.time_remaining()
            validation = self._validation_estimate(trainer, step_seconds)
            rank_zero_info(
                f"TimeBudget: stopping at step {trainer.global_step} to validate once more within the time budget "
                f"({remaining:.1f} s left, a validation takes about {validation:.1f} s)"
            )

    def _measure(self, trainer: pl.Trainer, step_seconds: float, ahead: float) -> tuple[float, bool]:
        """Rank 0's (fraction of the training time used, whether to stop now), on every rank.

        `ahead`: seconds from now until the next step can end."""
        assert self._timer is not None
        elapsed = self._clock()
        budget = elapsed + self._timer.time_remaining()
        reserve = self.validation_margin * self._validation_estimate(trainer, step_seconds) + step_seconds
        training_end = budget - reserve
        # The progress where the next step ends, over where the last step that fits starts: that
        # last step runs at progress 1 (the schedule's final rate).
        last_step_start = training_end - step_seconds
        fraction = min(1.0, (elapsed + ahead) / last_step_start) if last_step_start > 0 else 1.0
        stop = elapsed + ahead >= training_end
        fraction, stop = trainer.strategy.broadcast((fraction, stop), src=0)
        return float(fraction), bool(stop)

    @staticmethod
    def _validation_due(trainer: pl.Trainer, batch_idx: int, is_last_batch: bool) -> bool:
        """Whether Lightning validates after this training batch (epoch ends, `val_check_interval`)."""
        if not trainer.enable_validation:
            return False
        every_n_epochs = trainer.check_val_every_n_epoch
        if every_n_epochs is not None and (trainer.current_epoch + 1) % every_n_epochs != 0:
            return False
        if is_last_batch:
            return True
        interval = trainer.val_check_batch
        if interval is None or not math.isfinite(interval) or interval < 1:
            return False
        index = batch_idx if every_n_epochs is not None else trainer.fit_loop.epoch_loop.total_batch_idx
        return (index + 1) % int(interval) == 0

    def _validation_estimate(self, trainer: pl.Trainer, step_seconds: float) -> float:
        """Seconds the final validation is expected to take (0 when the fit does not validate)."""
        if not trainer.enable_validation:
            return 0.0
        if self._validation_seconds is not None:
            return self._validation_seconds
        batches = _finite_sum(trainer.num_val_batches) or 1
        if self._sanity_seconds_per_batch is not None:
            return self._sanity_seconds_per_batch * batches
        return step_seconds * batches

    def _give_progress(self, trainer: pl.Trainer, fraction: float) -> list[str]:
        """Give the schedules the fraction used; the names of those that follow it."""
        self._fraction = max(self._fraction, fraction)
        following = []
        for config in trainer.lr_scheduler_configs:
            set_progress = getattr(config.scheduler, "set_progress", None)
            if callable(set_progress):
                set_progress(self._fraction)
                if getattr(config.scheduler, "follows_progress", True):
                    following.append(type(config.scheduler).__name__)
        return following

    @override
    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        if self._stopped_inside_epoch and trainer.should_stop:
            record_epoch_as_running(checkpoint)


def _finite_sum(counts: list[int | float]) -> int:
    total = sum(counts) if counts else 0
    return int(total) if math.isfinite(total) else 0
