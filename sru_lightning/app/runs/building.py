"""Build one run from its Hydra config, as a list of steps, each a module of its own:

1. where it starts (:mod:`.starting_point`): the checkpoint and the settings it runs with;
2. the run's own settings (:mod:`.run_settings`): seed, threads, the Trainer's settings checked;
3. its data (:mod:`.run_data`) and 4. its model (:mod:`.run_model`), started from trained
   weights when `model.init_from` names them (:mod:`.init_from`);
5. its callbacks (:mod:`.run_callback_list`, whose docstring lists the ones a run adds) and loggers;
6. its Trainer (:mod:`.run_trainer`).

Every call that applies one of the user's settings goes through :mod:`.refusals`, so that its
refusal is a usage error; anything else that goes wrong here is a failure of the run.
"""

from __future__ import annotations

from pathlib import Path

from .context import RunContext
from .init_from import initial_weights
from .run_callback_list import run_callbacks
from .run_data import build_data
from .run_model import build_model
from .run_settings import apply_run_settings
from .run_trainer import build_loggers, build_trainer
from .starting_point import start_attempt

__all__ = ["build"]


def build(
    cfg,
    command: str,
    output_dir: Path,
    overrides: list[str],
    owner: dict[str, str] | None = None,
    context: RunContext | None = None,
):
    """Instantiate data, model, callbacks, loggers and trainer from `cfg`; `owner` is the job
    the run belongs to (:func:`.jobs.attempt_owner`), `context` the command's (what Hydra's
    callbacks found). Returns the trainer, the model, the data module and the
    :class:`~.starting_point.StartingPoint`."""
    start = start_attempt(cfg, command, output_dir, overrides, owner, context or RunContext(command))
    cfg = start.cfg
    trainer_settings = apply_run_settings(cfg)
    initial = initial_weights(cfg, command, start)  # model.init_from: a new fit from trained weights
    datamodule, vocab_size = build_data(cfg, command, start, initial)
    model = build_model(cfg, command, datamodule, vocab_size, start, initial)
    loggers = build_loggers(cfg)
    callbacks = run_callbacks(cfg, model, trainer_settings, bool(loggers), output_dir, owner, start)
    trainer = build_trainer(cfg, command, model, datamodule, callbacks, loggers)
    return trainer, model, datamodule, start
