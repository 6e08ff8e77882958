"""Ends a submitit sweep on SLURM whose jobs ended without a result: each such job is closed as
`lost`, so the launcher stops waiting for it and the summary says what happened.

Why: Hydra's submitit launcher waits for every job with `job.results()`, and submitit learns that
a job ended from `sacct`. On a cluster without accounting `sacct` fails on every call (submitit
only logs "Bypassing sacct error"), so a job that never writes its result file, such as one
cancelled with `scancel` or killed with its node, is waited for forever. (With accounting the
first such job raises out of the launcher, and the other jobs' results are dropped with it.)

How: :class:`LostJobWatchdog`, a Hydra callback (conf/hydra/default.yaml), runs only in a sweep
launched by submitit on SLURM. While the sweep runs, a thread looks every `POLL_S` seconds at
the jobs submitit submitted (their `<id>_submitted.pkl` in the submitit folder) and asks the
controller with `squeue`, which needs no accounting, about those without a result. A job the
controller says has ended, or no longer knows (it forgets ended jobs after `MinJobAge`), and
whose result has still not appeared `GRACE_S` seconds later, is lost. The watchdog then

* writes `lost.json` with the reason into the job's folder (sru_lightning.app.sweep lists the
  job as `lost` unless the run recorded how it ended), and
* writes the job's result file with what the job's own task returns for a run that did not
  complete: nan for Hydra's basic sweeper, a `JobFailed` for sweepers that count failed jobs
  (Optuna's), so the launcher collects it like any other job and the sweep ends.

A controller that does not answer never makes a job lost: the watchdog asks again. Nothing is
changed in submitit or in Hydra's launcher; the watchdog only adds the result a dead job could
not write (submitit's format: `("success", JobReturn)`, pickled).
"""

from __future__ import annotations

import logging
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, open_dict

log = logging.getLogger(__name__)

#: Seconds between the watchdog's looks at the jobs still out.
POLL_S = 2.0
#: Seconds a job's result may still take to appear once the controller says the job has ended
#: (a slow shared file system). Submitit itself, told by sacct that a job ended, waits 15 s for
#: the result before it raises; the watchdog answers within POLL_S + GRACE_S of the end.
GRACE_S = 6.0
#: Job states after which a job never runs again. COMPLETING (processes still ending: the job may
#: yet write its result) is not one; PREEMPTED is not either, a preempted job may be requeued.
ENDED_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
        "SPECIAL_EXIT",
        "REVOKED",
    }
)
SLURM_LAUNCHER = "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"


def scheduler_states(job_ids: Sequence[str]) -> dict[str, str] | None:
    """{job id: state} of the jobs the controller still knows among `job_ids` (submitit's ids,
    `<array job>_<task>`); None when the controller could not be asked. A job missing from the
    answer has ended and been forgotten."""
    arrays = sorted({job_id.split("_")[0] for job_id in job_ids})
    if not arrays:
        return {}
    command = ["squeue", "--noheader", "--array", "--states=all", "--format=%i|%T", "--jobs=" + ",".join(arrays)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as error:
        log.warning("Cannot ask SLURM about jobs %s: %s", ",".join(arrays), error)
        return None
    if done.returncode != 0:
        if "Invalid job id" in done.stderr:  # none of them is known any more
            return {}
        log.warning("Cannot ask SLURM about jobs %s: %s", ",".join(arrays), done.stderr.strip())
        return None
    states = {}
    for line in done.stdout.splitlines():
        job_id, _, state = line.strip().partition("|")
        if job_id:
            states[job_id] = state.strip()
    return states


class LostJobWatchdog(Callback):
    """Hydra callback: in a submitit SLURM sweep, close the jobs that ended without a result."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # Submitit pickles the launcher, Hydra's callbacks with it, into every job: without the thread.
    def __getstate__(self) -> dict[str, Any]:
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if str(config.hydra.launcher.get("_target_", "")) != SLURM_LAUNCHER:
            return
        from sru_lightning.app.runs.context import active_context

        folder = str(config.hydra.launcher.submitit_folder)
        typed = list(active_context().overrides)  # the thread runs outside the command's context
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._watch, args=(folder, config, typed), name="lost-job-watchdog", daemon=True
        )
        self._thread.start()

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=30)
            self._thread = None

    # --- the watching thread ------------------------------------------------------------------

    def _watch(self, folder: str, config: DictConfig, typed: list[str]) -> None:
        ended: dict[str, tuple[float, str]] = {}  # job id -> (when first seen ended, state)
        closed: set[str] = set()
        while not self._stop.wait(POLL_S):
            try:
                out = {
                    job_id: paths
                    for job_id, paths in submitted_jobs(folder).items()
                    if job_id not in closed and not paths.result_pickle.exists()
                }
                states = scheduler_states(list(out)) if out else {}
                if states is None:
                    continue
                now = time.monotonic()
                for job_id, paths in out.items():
                    state = states.get(job_id)
                    if state is not None and state.split()[0] not in ENDED_STATES:
                        ended.pop(job_id, None)  # pending, running, completing, requeued
                        continue
                    since, seen = ended.setdefault(job_id, (now, state or "no longer known to the controller"))
                    if now - since >= GRACE_S and not paths.result_pickle.exists():
                        close_lost_job(paths, job_id, seen, config, typed)
                        closed.add(job_id)
            except Exception:  # the watchdog must outlive a surprise; it says what
                log.exception("The lost-job watchdog failed to check the sweep's jobs; it tries again")


def submitted_jobs(folder: str) -> dict[str, Any]:
    """{job id: submitit's JobPaths} of every job submitit submitted into `folder` (a pattern with
    %j, the job id)."""
    from submitit.core.utils import JobPaths

    pattern = Path(folder.replace("%j", "*")) / "*_submitted.pkl"
    found = {}
    for pickle in Path(pattern.anchor).glob(str(pattern.relative_to(pattern.anchor))):
        job_id = pickle.name[: -len("_submitted.pkl")]
        found[job_id] = JobPaths(folder, job_id=job_id, task_id=0)
    return found


def close_lost_job(paths, job_id: str, state: str, config: DictConfig, typed: Sequence[str] = ()) -> None:
    """Record the job as lost in its folder and give the launcher the result the job could not;
    `typed`: the sweep's overrides as the user typed them."""
    from hydra.core.utils import JobReturn, JobStatus
    from submitit.core.utils import DelayedSubmission, cloudpickle_dump

    from sru_lightning._atomic import written_beside
    from sru_lightning.app.sweep import JobFailed, as_typed, record_lost_job, sweeper_counts_failures

    reason = (
        f"SLURM job {job_id} ended ({state}) without a result"
        if state.isupper()
        else f"SLURM job {job_id} ended without a result ({state})"
    )
    delayed = DelayedSubmission.load(paths.submitted_pickle)
    overrides, number = list(delayed.args[0]), int(delayed.args[2])
    job_dir = _job_dir(delayed.function, overrides, number, job_id, config)
    log.error("Sweep job #%d (%s) lost: %s", number, " ".join(overrides), reason)
    # As the user typed them, like a run's own record.
    record_lost_job(job_dir, as_typed(overrides, list(typed)), reason, job_id)
    if sweeper_counts_failures(config.hydra):
        result = JobReturn(
            overrides=overrides,
            working_dir=str(job_dir),
            status=JobStatus.FAILED,
            _return_value=JobFailed(f"job {job_dir} lost: {reason}"),
        )
    else:  # what the task returns for a run that did not complete
        result = JobReturn(
            overrides=overrides, working_dir=str(job_dir), status=JobStatus.COMPLETED, _return_value=float("nan")
        )
    result.task_name = str(config.hydra.job.name)
    with written_beside(paths.result_pickle, suffix=".lost") as partial:  # whole, or not at all
        cloudpickle_dump(("success", result), partial)


def _job_dir(launcher, overrides: list[str], number: int, job_id: str, config: DictConfig) -> Path:
    """The folder Hydra gives the job (hydra.sweep.dir / hydra.sweep.subdir, composed as the job
    composes them); `<sweep dir>/<number>` when that cannot be worked out here."""
    try:
        job_config = launcher.hydra_context.config_loader.load_sweep_config(launcher.config, overrides)
        with open_dict(job_config.hydra.job):
            job_config.hydra.job.num = number
            job_config.hydra.job.id = job_id
        return Path(str(job_config.hydra.sweep.dir)) / str(job_config.hydra.sweep.subdir)
    except Exception as error:
        log.warning(
            "Cannot compose sweep job #%d's folder (%s); using %s/%d", number, error, config.hydra.sweep.dir, number
        )
        return Path(str(config.hydra.sweep.dir)) / str(number)
