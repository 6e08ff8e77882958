"""The settings of a run that are neither data, model, callbacks nor Trainer: its seed and thread
count, and the Trainer's settings checked before anything is built with them."""

from __future__ import annotations

from typing import Any

from sru_lightning.app.usage import UsageError

from .threads import thread_setting_problem
from .trainer_args import check_trainer_settings

__all__ = ["apply_run_settings"]


def apply_run_settings(cfg) -> dict[str, Any]:
    """Seed everything (`seed`), check `threads` and the trainer settings; the trainer settings."""
    import lightning.pytorch as pl
    from omegaconf import OmegaConf

    seed = cfg.get("seed")
    if seed is not None:
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise UsageError(f"`seed` must be an integer or null, got {seed!r}")
        pl.seed_everything(seed, workers=True, verbose=False)
    problem = thread_setting_problem(cfg.get("threads"))
    if problem:
        raise UsageError(problem)
    trainer_settings = OmegaConf.to_container(cfg.trainer, resolve=True)
    check_trainer_settings(trainer_settings)
    return trainer_settings
