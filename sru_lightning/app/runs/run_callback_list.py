"""Every callback a run's Trainer gets: the config's (`callbacks:`) and the ones a run adds."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from .folder import RunFolder
from .metric_names import metric_names_followed, optimized_metric_name
from .refusals import instantiate_setting
from .run_callbacks import AnnounceRunDirectory, LastValidation
from .save_run_config import SaveRunConfig, plain_config
from .starting_point import StartingPoint

log = logging.getLogger("sru_lightning")

__all__ = ["run_callbacks"]


def run_callbacks(
    cfg,
    model,
    trainer_settings: dict[str, Any],
    has_loggers: bool,
    output_dir: Path,
    owner: dict[str, str] | None,
    start: StartingPoint,
) -> list:
    """The config's callbacks (`callbacks:`, conf/callbacks/; `fit --cfg job` shows them), less the
    ones a setting turns off, and those every run adds; the run logs the list it trains with
    (`callbacks: ...`). What this function adds or drops, why, and how to turn it off:

    - SRUPrecisionCallback (config): dropped for a model without SRU layers (the LSTM
      baseline), which has nothing to map. Off: `~callbacks.sru_precision`.
    - LearningRateMonitor (config): dropped with `logger=none`: nowhere to log.
      Off: `~callbacks.lr_monitor`.
    - a progress bar, the checkpoint callbacks (config): dropped by
      `+trainer.enable_progress_bar=false`, `+trainer.enable_checkpointing=false` (the
      interruption checkpoint too).
    - ModelSummary / RichModelSummary (depth 2): the network is one attribute (`net`), so its
      layers are shown too. Off: `+trainer.enable_model_summary=false`.
    - FolderModelCheckpoint (`checkpoints/last.ckpt`): when the config has no ModelCheckpoint,
      since Lightning's default would write under the logger's folder.
      Off: `+trainer.enable_checkpointing=false`.
    - ValidateBeforeStop: a `max_steps` stop validates the final weights. Always on.
    - TrainingThroughput: tokens per second for the run's record. Always on.
    - LastValidation: tells whether the final metrics are stale. Always on.
    - AnnounceRunDirectory: names the run directory once the run is under way. Always on.
    - SaveRunConfig: every checkpoint carries the run's config, identity and owner. Always on.
    - ApplyResumeChanges: optimizer settings changed on resume applied to the restored state.
      Only with such changes.
    - TrialPruning: a trial of a pruned search (`hydra.sweeper` = `PrunedOptunaSweeper`, e.g.
      `hparams_search=speedrun`) reports its validation metric and stops when pruned. Only in
      such a search's jobs (`search.trial` set by the sweeper).
    """
    from lightning.pytorch.callbacks import (
        Checkpoint,
        ModelCheckpoint,
        ModelSummary,
        RichModelSummary,
        RichProgressBar,
    )

    from sru_lightning.callbacks import FolderModelCheckpoint, TrainingThroughput, ValidateBeforeStop

    configured = [
        instantiate_setting(node, **metric_names_followed(node, model))
        for node in (cfg.get("callbacks") or {}).values()
        if node is not None
    ]
    dropped = _dropped(configured, model, trainer_settings, has_loggers)
    callbacks = [cb for cb in configured if not isinstance(cb, tuple(dropped))]
    if ModelSummary not in dropped and not any(isinstance(cb, ModelSummary) for cb in callbacks):
        rich = any(isinstance(cb, RichProgressBar) for cb in callbacks)
        callbacks.append(RichModelSummary(max_depth=2) if rich else ModelSummary(max_depth=2))
    if Checkpoint not in dropped and not any(isinstance(cb, ModelCheckpoint) for cb in callbacks):
        folder = output_dir / RunFolder.CHECKPOINTS_DIR
        callbacks.append(FolderModelCheckpoint(dirpath=folder, save_last=True, enable_version_counter=False))
    if not any(isinstance(cb, ValidateBeforeStop) for cb in callbacks):
        callbacks.append(ValidateBeforeStop())
    callbacks += [
        TrainingThroughput(),
        LastValidation(),
        AnnounceRunDirectory(output_dir),
        SaveRunConfig(plain_config(cfg), owner, start.run_id),
        *start.callbacks(),
        *_trial_pruning(cfg, model),
    ]
    log.info("callbacks: %s", ", ".join(type(callback).__name__ for callback in callbacks))
    return callbacks


def _dropped(configured: list, model, trainer_settings: dict[str, Any], has_loggers: bool) -> list[type]:
    """The kinds of configured callbacks a run leaves out, by the rules of :func:`run_callbacks`."""
    from lightning.pytorch.callbacks import Checkpoint, LearningRateMonitor, ModelSummary, ProgressBar

    from sru_lightning.callbacks import SRUPrecisionCallback
    from sru_lightning.nn.policy import iter_sru_cells

    dropped: list[type] = []
    if not any(True for _ in iter_sru_cells(model)):
        dropped.append(SRUPrecisionCallback)
    if not has_loggers and any(isinstance(cb, LearningRateMonitor) for cb in configured):
        log.info("logger=none: the learning-rate monitor has nowhere to log and is left out")
        dropped.append(LearningRateMonitor)
    if trainer_settings.get("enable_progress_bar", True) is False:
        dropped.append(ProgressBar)
    if trainer_settings.get("enable_model_summary", True) is False:
        dropped.append(ModelSummary)
    if trainer_settings.get("enable_checkpointing", True) is False:
        dropped.append(Checkpoint)
    return dropped


def _trial_pruning(cfg, model) -> list:
    """The search trial's reporter, in a job of a pruned search (its `search.trial`), else nothing."""
    search = cfg.get("search")
    if not search or search.get("trial") is None:
        return []
    from sru_lightning.app.search import job_trial
    from sru_lightning.callbacks import TrialPruning

    return [TrialPruning(job_trial(search), optimized_metric_name(cfg, model))]
