"""A fit that is one trial of a search reports its validation metric as it goes, and stops when
the search's pruner says the trial cannot win.

The trial is any object with Optuna's trial methods `report(value, step)`, `should_prune()` and
`set_user_attr(key, value)` (:class:`optuna.trial.Trial`), so this module needs no Optuna. Steps
are the percentage of the fit's budget used when the validation ran (0-100): of
`trainer.max_time` when the fit has one (a Timer among the callbacks), else of
`trainer.max_steps`. Trials of different sizes and speeds are thereby compared at the same share
of their budget, which is what a pruner on time (successive halving, Hyperband) needs.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback, Timer
from lightning.pytorch.utilities import rank_zero_info
from typing_extensions import override

__all__ = ["TrialPruning", "budget_percent"]


class SearchTrial(Protocol):
    def report(self, value: float, step: int) -> None: ...
    def should_prune(self) -> bool: ...
    def set_user_attr(self, key: str, value: Any) -> None: ...


def budget_percent(trainer: pl.Trainer) -> int | None:
    """The share of the fit's budget used so far, in whole percent (None: the fit has no budget)."""
    timers = (callback for callback in trainer.callbacks if isinstance(callback, Timer))
    timer = next((timer for timer in timers if timer.time_remaining() is not None), None)
    if timer is not None:
        elapsed, remaining = timer.time_elapsed("train"), timer.time_remaining("train")
        total = elapsed + max(remaining, 0.0)
        return min(100, round(100 * elapsed / total)) if total > 0 else None
    if trainer.max_steps and trainer.max_steps > 0:
        return min(100, round(100 * trainer.global_step / trainer.max_steps))
    return None


class TrialPruning(Callback):
    """Report `monitor` after every validation to `trial` and stop the fit when it is pruned.

    Args:
        trial: the search's trial (Optuna's :class:`~optuna.trial.Trial` or the same methods).
        monitor: the logged metric the search optimises, e.g. `val_bpc`.

    Only rank 0 speaks to the trial; every rank follows its decision. A pruned fit stops at the
    next batch boundary (its weights are those just validated) and the trial gets the user
    attribute `pruned_at` (the percentage), which the search reads to record the trial as pruned.
    A validation without the metric, or a non-finite one, is not reported (a non-finite loss
    stops the fit by itself).
    """

    def __init__(self, trial: SearchTrial, monitor: str) -> None:
        if not isinstance(monitor, str) or not monitor:
            raise ValueError(f"TrialPruning: `monitor` must be a metric name, got {monitor!r}")
        self.trial = trial
        self.monitor = monitor
        self.pruned_at: int | None = None

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or self.pruned_at is not None:
            return
        prune_at: int | None = None
        if trainer.is_global_zero:
            prune_at = self._report(trainer)
        prune_at = trainer.strategy.broadcast(prune_at, src=0)
        if prune_at is not None:
            self.pruned_at = prune_at
            trainer.should_stop = True
            rank_zero_info(f"the search pruned this trial at {prune_at}% of its budget: it stops here")

    def _report(self, trainer: pl.Trainer) -> int | None:
        value = trainer.callback_metrics.get(self.monitor)
        step = budget_percent(trainer)
        if value is None or step is None or not math.isfinite(float(value)):
            return None
        self.trial.report(float(value), step)
        if not self.trial.should_prune():
            return None
        self.trial.set_user_attr("pruned_at", step)
        return step
