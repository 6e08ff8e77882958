"""A CSV logger that keeps the metrics of earlier attempts of the same run.

Lightning's `CSVLogger` deletes an existing `metrics.csv` when it opens its directory
("Previous log files in this directory will be deleted"). A run resumed into its own
directory (a requeued job, `fit ckpt_path=last`) would then lose every row logged before the
interruption. :class:`AppendingCSVLogger` appends to the file instead, widening its header
when new columns appear.
"""

from __future__ import annotations

import csv

from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter

__all__ = ["AppendingCSVLogger"]


class _AppendingExperimentWriter(ExperimentWriter):
    def _check_log_dir_exists(self) -> None:
        # Instead of deleting an earlier metrics.csv, adopt its columns so new rows line up.
        if not self._fs.isfile(self.metrics_file_path):
            return
        with self._fs.open(self.metrics_file_path, "r", newline="") as file:
            header = next(csv.reader(file), [])
        self.metrics_keys = sorted(set(header))


class AppendingCSVLogger(CSVLogger):
    """`lightning.pytorch.loggers.CSVLogger` that appends to an existing `metrics.csv`."""

    @property
    @rank_zero_experiment
    def experiment(self) -> _AppendingExperimentWriter:
        if self._experiment is not None:
            return self._experiment
        self._fs.makedirs(self.root_dir, exist_ok=True)
        self._experiment = _AppendingExperimentWriter(log_dir=self.log_dir)
        return self._experiment
