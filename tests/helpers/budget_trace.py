"""A callback recording what a time-budgeted fit did, per rank, for the time-budget tests.

Used in-process or through the CLI as an extra callback (the tests put tests/helpers on PYTHONPATH):

    +callbacks.budget_trace._target_=budget_trace.BudgetTrace +callbacks.budget_trace.dirpath=<dir>

At the end of training each rank writes `<dirpath>/budget_trace_rank<r>.json`: the learning rate
of every training step (as the optimizer holds it when the step starts), the Timer's elapsed
training time at the end of every step and every validation (sanity check left out), and the
budget.
"""

from __future__ import annotations

import json
from pathlib import Path

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Timer


class BudgetTrace(pl.Callback):
    def __init__(self, dirpath: str | None = None) -> None:
        self.dirpath = dirpath
        self.lrs: list[tuple[int, float]] = []  # (global step, lr)
        self.step_ends: list[tuple[int, float]] = []  # (global step after it, elapsed)
        self.validation_ends: list[tuple[int, float]] = []
        self.budget: float | None = None

    @staticmethod
    def _timer(trainer: pl.Trainer) -> Timer:
        return next(callback for callback in trainer.callbacks if isinstance(callback, Timer))

    def on_train_start(self, trainer, pl_module):
        timer = self._timer(trainer)
        self.budget = timer.time_elapsed() + timer.time_remaining()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.lrs.append((trainer.global_step, trainer.optimizers[0].param_groups[0]["lr"]))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.step_ends.append((trainer.global_step, self._timer(trainer).time_elapsed()))

    def on_validation_end(self, trainer, pl_module):
        if not trainer.sanity_checking:
            self.validation_ends.append((trainer.global_step, self._timer(trainer).time_elapsed()))

    def on_train_end(self, trainer, pl_module):
        if self.dirpath is None:
            return
        record = {
            "lrs": self.lrs,
            "step_ends": self.step_ends,
            "validation_ends": self.validation_ends,
            "budget": self.budget,
        }
        Path(self.dirpath, f"budget_trace_rank{trainer.global_rank}.json").write_text(json.dumps(record))
