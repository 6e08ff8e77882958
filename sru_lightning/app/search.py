"""A hyperparameter search whose weak trials stop early: Optuna's ask-and-tell loop with a pruner,
as a Hydra sweeper (`hydra.sweeper._target_: sru_lightning.app.search.PrunedOptunaSweeper`).

Hydra's Optuna sweeper runs every trial to its end. This one keeps its search-space grammar
(`choice(...)`, `interval(...)`, `tag(log, ...)` under `hydra.sweeper.params`), and adds:

- a **pruner** (`hydra.sweeper.pruner`, any :mod:`optuna.pruners` class, e.g. successive
  halving): each trial's fit reports its validation metric at the share of its budget it has
  used (:class:`sru_lightning.callbacks.TrialPruning`), and stops when the pruner says so; the
  trial is then recorded as pruned, with its last value.
- **storage that survives**: by default `sqlite:///<hydra.sweep.dir>/search.db`; the same command
  with `hydra.sweep.dir=<that folder> ckpt_path=auto` continues the search: `n_trials` counts
  the trials already finished, and a trial cut by the interruption runs again in its own folder
  from its checkpoint, with the same settings.
- **one folder per trial**: job number = trial number, so `<sweep>/<n>/` is trial n, and
  `trials.csv` in the sweep folder lists every trial's number, state, value, pruning point and
  settings when the search ends.

Jobs learn their trial through three settings the sweeper adds to their overrides,
`++search.storage`, `++search.study_name` and `++search.trial` (:func:`job_trial` reads them);
the pruner's settings are saved with the study, so a job on another machine (a SLURM launcher
with the storage on a shared filesystem) builds the same pruner.

The search-space parsing is the Optuna sweeper plugin's (hydra-optuna-sweeper 1.3, its last
release; the `sweepers` extra pins it).
"""

from __future__ import annotations

import csv
import logging
import math
import re
from pathlib import Path
from typing import Any

from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

log = logging.getLogger("sru_lightning")

__all__ = ["PrunedOptunaSweeper", "job_trial", "register_sweeper", "write_trials_table"]

PRUNER_ATTR = "pruner"
STORAGE_FILE = "search.db"
TRIALS_TABLE = "trials.csv"


class PrunedOptunaSweeper(Sweeper):
    """Optuna's ask-and-tell search with a pruner, one trial per Hydra job.

    Args (`hydra.sweeper.*`): `sampler` (an :mod:`optuna.samplers` config), `direction`
    (`minimize` or `maximize`), `storage` (an Optuna storage URL; null: `search.db` in the sweep
    folder), `study_name`, `n_trials` (trials in all, those of earlier attempts included),
    `n_jobs` (trials launched together), `max_failure_rate` (the share of failed trials that
    stops the search), `params` (the search space, the Optuna sweeper's grammar), `pruner` (an
    :mod:`optuna.pruners` config; null: none).
    """

    def __init__(
        self,
        sampler: Any,
        direction: str,
        storage: str | None,
        study_name: str,
        n_trials: int,
        n_jobs: int,
        max_failure_rate: float,
        params: DictConfig | None,
        pruner: DictConfig | None = None,
    ) -> None:
        for name, value in (("n_trials", n_trials), ("n_jobs", n_jobs)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"hydra.sweeper.{name} must be a positive integer, got {value!r}")
        if direction not in ("minimize", "maximize"):
            raise ValueError(f"hydra.sweeper.direction must be 'minimize' or 'maximize', got {direction!r}")
        if not 0.0 <= float(max_failure_rate) <= 1.0:
            raise ValueError(f"hydra.sweeper.max_failure_rate must be within [0, 1], got {max_failure_rate!r}")
        self.sampler = instantiate(sampler) if isinstance(sampler, DictConfig) else sampler
        self.direction = direction
        self.storage = storage
        self.study_name = study_name
        self.n_trials = n_trials
        self.n_jobs = n_jobs
        self.max_failure_rate = float(max_failure_rate)
        self.params = params
        self.pruner_config = OmegaConf.to_container(pruner, resolve=True) if pruner is not None else None
        self.launcher: Any = None
        self.sweep_dir: Path | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        from hydra.core.plugins import Plugins

        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )
        self.sweep_dir = Path(config.hydra.sweep.dir)

    def sweep(self, arguments: list[str]) -> None:
        import optuna
        from hydra_plugins.hydra_optuna_sweeper._impl import create_params_from_overrides

        space = [f"{key}={value}" for key, value in (self.params or {}).items()] + list(arguments)
        distributions, fixed = create_params_from_overrides(space)
        for name in fixed:
            distributions.pop(name, None)
        self.url = self.storage or f"sqlite:///{(self.sweep_dir / STORAGE_FILE).resolve()}"
        logging.getLogger("alembic").setLevel(logging.WARNING)  # the storage's schema set-up, line by line
        self.sweep_dir.mkdir(parents=True, exist_ok=True)
        study = optuna.create_study(
            study_name=self.study_name, storage=self.url, direction=self.direction, load_if_exists=True
        )
        study.set_user_attr(PRUNER_ATTR, self.pruner_config)
        job = _JobSettings(self.url, study.study_name, fixed)
        cut = [trial for trial in study.trials if trial.state == optuna.trial.TrialState.RUNNING]
        if cut:  # this folder's hold says no other search is running: these were cut by an interruption
            log.info("continuing trial(s) %s of the interrupted search", ", ".join(str(t.number) for t in cut))
            for trial in cut:
                self._run([(optuna.trial.Trial(study, trial._trial_id), dict(trial.params))], job)
        while (left := self.n_trials - _finished(self._study())) > 0:
            study = self._study()
            trials = [study.ask(distributions) for _ in range(min(self.n_jobs, left))]
            self._run([(trial, dict(trial.params)) for trial in trials], job)
        study = self._study()
        write_trials_table(study, self.sweep_dir / TRIALS_TABLE)
        _log_best(study)

    def _study(self):
        """The study as the storage has it now. A study object caches the trials it created, while
        their jobs write reports and pruning into the storage: each step reads it afresh."""
        import optuna

        return optuna.load_study(
            study_name=self.study_name, storage=self.url, sampler=self.sampler, pruner=_pruner(self.pruner_config)
        )

    def _run(self, trials: list[tuple[Any, dict[str, Any]]], job: _JobSettings) -> None:
        """Launch `trials` (consecutive numbers: job number = trial number) and record their outcomes."""
        import optuna

        overrides = [job.overrides(trial.number, params) for trial, params in trials]
        results = self.launcher.launch(overrides, initial_job_idx=trials[0][0].number)
        study = self._study()
        failed = 0
        for (trial, _), result in zip(trials, results):
            state, value = _outcome(study, trial, result)
            study.tell(trial, value, state=state)
            failed += state == optuna.trial.TrialState.FAIL
        finished = _finished(study)
        failures = sum(t.state == optuna.trial.TrialState.FAIL for t in study.trials)
        if failed and failures / max(finished, 1) > self.max_failure_rate:
            raise RuntimeError(
                f"{failures} of {finished} trials failed, more than hydra.sweeper.max_failure_rate="
                f"{self.max_failure_rate}; each failed job's log is in its folder under {self.sweep_dir}"
            )


class _JobSettings:
    """The overrides of one trial's job: its settings, the fixed ones, and where its trial is."""

    def __init__(self, storage: str, study_name: str, fixed: dict[str, Any]) -> None:
        self.search = [
            f"++search.storage={_override_value(storage)}",
            f"++search.study_name={_override_value(study_name)}",
        ]
        self.fixed = fixed

    def overrides(self, number: int, params: dict[str, Any]) -> tuple[str, ...]:
        settings = {**params, **self.fixed}
        return (*(f"{name}={value}" for name, value in settings.items()), *self.search, f"++search.trial={number}")


def _override_value(text: str) -> str:
    """`text` as a Hydra override value: quoted only when it has characters the grammar reads."""
    if re.fullmatch(r"[\w/.:@+-]+", text):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _pruner(config: dict[str, Any] | None):
    import optuna

    return instantiate(config) if config else optuna.pruners.NopPruner()


def _finished(study) -> int:
    return sum(trial.state.is_finished() for trial in study.trials)


def _outcome(study, trial, result) -> tuple[Any, float | None]:
    """A job's trial state and value: pruned (its `pruned_at` set by the job), complete with a
    finite value, or failed (the job raised or returned no number)."""
    import optuna

    try:
        value = float(result.return_value)
    except Exception as error:  # the job raised: Hydra re-raises it here
        log.warning("trial %d failed: %s", trial.number, error)
        return optuna.trial.TrialState.FAIL, None
    record = next(frozen for frozen in study.trials if frozen.number == trial.number)
    if "pruned_at" in record.user_attrs:
        return optuna.trial.TrialState.PRUNED, None
    if not math.isfinite(value):
        log.warning("trial %d failed: its job returned %s", trial.number, value)
        return optuna.trial.TrialState.FAIL, None
    return optuna.trial.TrialState.COMPLETE, value


def _log_best(study) -> None:
    import optuna

    complete = [trial for trial in study.trials if trial.state == optuna.trial.TrialState.COMPLETE]
    if complete:
        log.info("best trial %d: %s = %s", study.best_trial.number, study.best_trial.params, study.best_value)
    else:
        log.info("no trial completed yet")


def write_trials_table(study, path: Path) -> None:
    """Every trial of `study` as one CSV row: number, state, value, pruned at (%), seconds, settings."""
    trials = study.trials
    names = sorted({name for trial in trials for name in trial.params})
    with path.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["trial", "state", "value", "pruned_at_percent", "seconds", *names])
        for trial in trials:
            seconds = (
                round((trial.datetime_complete - trial.datetime_start).total_seconds(), 1)
                if trial.datetime_complete and trial.datetime_start
                else ""
            )
            value = trial.value if trial.value is not None else ""
            pruned = trial.user_attrs.get("pruned_at", "")
            writer.writerow(
                [
                    trial.number,
                    trial.state.name.lower(),
                    value,
                    pruned,
                    seconds,
                    *(trial.params.get(n, "") for n in names),
                ]
            )


def job_trial(search: DictConfig | None):
    """The Optuna trial a sweep job runs (from its `search.*` settings), or None outside a search."""
    if not search or search.get("trial") is None:
        return None
    import optuna

    study = optuna.load_study(study_name=str(search.study_name), storage=str(search.storage), sampler=None)
    study.pruner = _pruner(study.user_attrs.get(PRUNER_ATTR))
    frozen = next(trial for trial in study.trials if trial.number == int(search.trial))
    return optuna.trial.Trial(study, frozen._trial_id)


def register_sweeper() -> None:
    """Make the search known to Hydra, which finds plugins by scanning the `hydra_plugins`
    namespace package: an editable install of this package is not on that scan's path."""
    from hydra.core.plugins import Plugins

    from hydra_plugins.sru_lightning_search import PrunedOptunaSweeper as Registered

    Plugins.instance().register(Registered)
