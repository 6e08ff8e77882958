"""Sweeps (`fit -m ...`): what a job hands its sweeper, which jobs a sweep ran, and the
end-of-sweep summary table (markdown + CSV).

The CLI calls this module's public functions: :func:`as_typed` and :func:`job_return` in each
job's task, and, when Hydra returns, :func:`report_incomplete` or :func:`summarise_stopped_sweep`
with :func:`ended_by_a_plugin`, each with the command's :class:`~.runs.context.RunContext`, in
which `SweepSummary` records the sweep under way. Whether a run is a sweep job, and whether its sweeper counts failed
jobs itself (Optuna's), is read from Hydra's own config (`hydra.mode`, `hydra.sweeper`).

Every run writes `result.json` into its own output directory. After a multirun, the
`SweepSummary` Hydra callback reads the result of each job directory (whatever launcher ran
it: local, joblib, submitit on SLURM) and writes `summary.md` and `summary.csv` next to them.
A job that died without writing its result is listed as `missing`, and one its launcher gave up
on (`lost.json` in its folder, written by sru_lightning.app.sweep_watchdog) as `lost`, with the
launcher's reason. When a job did not complete, the callback ends the command with
:class:`SweepIncomplete`, which carries those rows to the command line.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from sru_lightning.app.runs.context import RunContext, active_context
from sru_lightning.app.runs.folder import RunFolder
from sru_lightning.app.runs.jobs import sweep_job_order
from sru_lightning.app.runs.records import RecordFormatError, check_record_format
from sru_lightning.app.summary_table import write_summary
from sru_lightning.app.usage import PROG

log = logging.getLogger(__name__)

# Written into a job's folder by a launcher that gave up on the job (it ended without a result).
LOST_FILE = "lost.json"
# How a run ends on its own terms. A lost job whose run recorded anything else (`running`, no
# record at all, or `interrupted`: stopped by the scheduler's SIGTERM, a stop the sweep will not
# come back to) is listed as lost, with the launcher's reason and the run's.
SETTLED_STATUSES = ("completed", "failed")


class SweepIncomplete(SystemExit):
    """Ends a sweep in which some jobs did not complete, with exit status 1 (Hydra lets
    SystemExit pass its callbacks); `rows` are the summary rows of those jobs, `total` the
    number of jobs in the summary."""

    def __init__(self, rows: list[dict[str, Any]], total: int) -> None:
        super().__init__(1)
        self.rows = rows
        self.total = total


#: Where Hydra's own sweeper and launcher live; any other is a plugin (Optuna's sweeper, the
#: joblib and submitit launchers), which may end a sweep by raising.
HYDRA_CORE_PLUGINS = "hydra._internal.core_plugins."


# --------------------------------------------------------------------------------------------
# a job of a sweep
class JobFailed(Exception):
    """A sweep job did not complete (raised for sweepers that record failed trials themselves)."""


def is_multirun(hydra_config) -> bool:
    """Whether Hydra runs this job as part of a sweep (`hydra_config`: the `hydra` node)."""
    from hydra.types import RunMode

    return hydra_config.mode == RunMode.MULTIRUN


def sweeper_counts_failures(hydra_config) -> bool:
    """True for sweepers other than Hydra's basic one (Optuna's): they take a failed job as an
    exception; the basic sweeper would stop at the first one, so its jobs return instead."""
    target = str(hydra_config.sweeper.get("_target_", ""))
    return is_multirun(hydra_config) and bool(target) and not target.startswith(HYDRA_CORE_PLUGINS)


def optimized_value(record: dict[str, Any]) -> float:
    """What the task returns to Hydra's sweeper: the monitored metric of a completed run, nan otherwise
    (the Optuna sweeper records a nan trial as failed and goes on)."""
    value = record.get("metrics", {}).get(record.get("monitor")) if record.get("status") == "completed" else None
    return float(value) if isinstance(value, (int, float)) else float("nan")


def job_return(record: dict[str, Any], hydra_config) -> float:
    """What a job's task hands its sweeper for the run `record`: :func:`optimized_value`, or, for a
    run that did not complete under a sweeper that counts failed jobs, :class:`JobFailed`."""
    if record["status"] != "completed" and sweeper_counts_failures(hydra_config):
        # Optuna's sweeper marks a trial failed when its job raises (a nan it cannot take).
        raise JobFailed(f"job {record['run_dir']} {record['status']}: {record.get('error', '')}")
    return optimized_value(record)


def _override_key(override: str) -> str:
    return override.lstrip("+~").split("=", 1)[0]


def as_typed(job_overrides: list[str], typed: list[str]) -> list[str]:
    """A job's overrides as the user typed them: Hydra hands a sweep's jobs its own spelling of the
    fixed ones (`~key=null`, `False`); a swept key keeps the job's value."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    fixed = {}
    for item in typed:
        if item.startswith("-") or ("=" not in item and not item.startswith("~")):
            continue
        try:
            if not parser.parse_override(item).is_sweep_override():
                fixed[_override_key(item)] = item
        except Exception:  # unparsable overrides were refused before Hydra ran
            continue
    return [fixed.get(_override_key(item), item) for item in job_overrides]


# --------------------------------------------------------------------------------------------
# the jobs a sweep ran
#: A job folder's records of what happened to the job: Hydra writes the first when it starts the
#: job, the run the second, a launcher that gave up on the job the third.
JOB_RECORDS = (os.path.join(RunFolder.HYDRA_DIR, RunFolder.OVERRIDES_FILE), RunFolder.RESULT_FILE, LOST_FILE)


def job_records(sweep_dir: str | Path) -> dict[str, tuple]:
    """{job folder name: what each of its records is (inode, modification, size; None if absent)}
    for the job folders under `sweep_dir` now. Taken when a sweep begins, it tells the jobs this
    sweep writes from those an earlier sweep left, by comparison alone (no clock is read)."""
    found: dict[str, tuple] = {}
    folder = Path(sweep_dir)
    if not folder.is_dir():
        return found
    for job_dir in folder.iterdir():
        if job_dir.is_dir():
            found[job_dir.name] = tuple(_stamp(job_dir / name) for name in JOB_RECORDS)
    return found


def _stamp(file: Path) -> tuple[int, int, int] | None:
    try:
        status = file.stat()
    except OSError:
        return None
    return (status.st_ino, status.st_mtime_ns, status.st_size)


def collect_results(sweep_dir: str | Path, before: dict[str, tuple] | None = None) -> list[dict[str, Any]]:
    """One row per job directory under `sweep_dir`, in the order of Hydra's job numbers: job,
    status, overrides, metrics, error.

    With `before` (:func:`job_records` when the sweep began), only the jobs this sweep started or
    ended: a job folder whose records are as they were belongs to an earlier sweep.
    """
    rows = []
    now = job_records(sweep_dir)
    for job_dir in sorted((Path(sweep_dir) / name for name in now), key=sweep_job_order):
        overrides_file = job_dir / RunFolder.HYDRA_DIR / RunFolder.OVERRIDES_FILE
        result_file = job_dir / RunFolder.RESULT_FILE
        records = now[job_dir.name]
        if not any(records) or (before is not None and before.get(job_dir.name) == records):
            continue
        record: dict[str, Any] = latest_attempt(job_dir) or {}
        source = job_dir / RunFolder.HISTORY_FILE
        if not record and result_file.exists():
            source = result_file
            try:
                record = json.loads(result_file.read_text())
            except (OSError, ValueError) as error:
                record = {"status": "unreadable", "error": f"{result_file}: {error}"}
        if record and record.get("status") != "unreadable":
            try:
                check_record_format(record, source)
            except RecordFormatError as error:
                record = {"status": "unreadable", "error": str(error)}
        lost = _lost_record(job_dir)
        if lost is not None and record.get("status") not in SETTLED_STATUSES:
            reason = lost.get("reason") or "lost by its launcher"
            if record.get("status"):
                reason += f"; the run was {record['status']}" + (f": {record['error']}" if record.get("error") else "")
            record = {**record, "status": "lost", "error": reason}
        overrides = record.get("overrides")
        if overrides is None and overrides_file.exists():
            overrides = list(OmegaConf.load(overrides_file))
        if overrides is None and lost is not None:
            overrides = lost.get("overrides")
        rows.append(
            {
                "job": job_dir.name,
                "status": record.get("status", "missing"),
                "overrides": shlex.join(str(item) for item in overrides or []),
                "metrics": record.get("metrics", {}),
                "optimizer_steps": record.get("optimizer_steps"),
                "tokens_per_second": record.get("tokens_per_second"),
                "wall_seconds": record.get("wall_seconds", record.get("seconds")),
                "error": record.get("error", ""),
                "dir": str(job_dir),
            }
        )
    return rows


def latest_attempt(job_dir: Path) -> dict[str, Any] | None:
    """The record of the job's latest attempt (the last line of history.jsonl), which a sweep's
    row describes: result.json keeps an earlier completed attempt's outcome when a later attempt
    was refused before it started, and that row would show the earlier attempt's settings."""
    try:
        lines = (job_dir / RunFolder.HISTORY_FILE).read_text().splitlines()
        record = json.loads(lines[-1]) if lines else None
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def record_lost_job(job_dir: Path, overrides: list[str], reason: str, slurm_job: str | None = None) -> Path:
    """Note in the job's folder (made if the job never started) that its launcher gave up on it
    and why; the summary lists the job as `lost` unless the run recorded how it ended."""
    job_dir.mkdir(parents=True, exist_ok=True)
    note = {
        "status": "lost",
        "reason": reason,
        "overrides": list(overrides),
        "slurm_job": slurm_job,
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    path = job_dir / LOST_FILE
    path.write_text(json.dumps(note, indent=2) + "\n")
    return path


def _lost_record(job_dir: Path) -> dict[str, Any] | None:
    try:
        note = json.loads((job_dir / LOST_FILE).read_text())
    except (OSError, ValueError):
        return None
    return note if isinstance(note, dict) else None


class SweepSummary(Callback):
    """Hydra callback: after a multirun, tabulate the overrides and final metrics of every job
    this sweep ran (a sweep continued in the folder of an earlier one lists only its own jobs)."""

    def __init__(self) -> None:
        self.before: dict[str, tuple] | None = None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir))
        self.before = job_records(sweep_dir)
        targets = [str(config.hydra[part].get("_target_", "")) for part in ("sweeper", "launcher")]
        active_context().found.sweep = SweepUnderWay(sweep_dir, self.before, tuple(targets))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        active_context().found.sweep = None
        rows = summarise(Path(str(config.hydra.sweep.dir)), self.before)
        incomplete = [row for row in rows if row["status"] != "completed"]
        if incomplete:
            raise SweepIncomplete(incomplete, len(rows))


@dataclass(frozen=True)
class SweepUnderWay:
    """A sweep whose summary is not written yet: its folder, its job folders' records when it
    began (:func:`job_records`), and its plugins."""

    folder: Path
    before: dict[str, tuple]
    #: `hydra.sweeper._target_` and `hydra.launcher._target_` of the sweep's config.
    plugins: tuple[str, ...]


def ended_by_a_plugin(context: RunContext) -> bool:
    """Whether the sweep under way (an error came out of Hydra before its summary was written) is
    run by a sweeper or launcher other than Hydra's own, as its config says: such a plugin ends a
    sweep by raising (Optuna's sweeper after no trial completed, submitit's launcher giving up on a
    job), which the command reports in one line. Under Hydra's basic sweeper and launcher, the
    jobs report their own failures, so an error out of the sweep is a fault, shown in full."""
    under_way = context.found.sweep
    return under_way is not None and any(
        target and not target.startswith(HYDRA_CORE_PLUGINS) for target in under_way.plugins
    )


def summarise(sweep_dir: Path, before: dict[str, tuple] | None, stopped: bool = False) -> list[dict[str, Any]]:
    """Write and print the summary of the jobs this sweep ran; their rows."""
    if not sweep_dir.is_dir():
        return []
    rows = collect_results(sweep_dir, before)
    markdown_path, csv_path = write_summary(sweep_dir, rows, stopped)
    print(markdown_path.read_text(), flush=True)
    log.info("Sweep summary: %s and %s", markdown_path, csv_path)
    return rows


def summarise_stopped_sweep(context: RunContext, continue_with: list[str] | None = None) -> None:
    """A sweep stopped early (by its sweeper, Optuna past `max_failure_rate`, or by Ctrl+C or
    SIGTERM in one of its jobs) still gets the summary of the jobs it ran: Hydra calls no
    end-of-sweep callback then. `continue_with`: the sweep's command (`fit -m ...`), to print
    the one that continues it, each job in its own folder (`ckpt_path=auto`)."""
    under_way = context.found.sweep
    if under_way is None:
        return
    sweep_dir, before = under_way.folder, under_way.before
    context.found.sweep = None
    summarise(sweep_dir, before, stopped=True)
    if continue_with:
        kept = [word for word in continue_with if not word.lstrip("+~").startswith(("ckpt_path=", "hydra.sweep.dir="))]
        from sru_lightning.app.override_text import command_line, override

        words = [
            "python",
            "-m",
            "sru_lightning",
            *kept,
            override("hydra.sweep.dir", str(sweep_dir.absolute())),
            "ckpt_path=auto",
        ]
        print(
            "the sweep was stopped; continue it (each job from its own folder, the finished ones "
            "only validated again) with: " + command_line(words),
            flush=True,
        )


def report_incomplete(incomplete: SweepIncomplete) -> int:
    """One line per job of a sweep that did not complete, then the count; exit status 1."""
    for row in incomplete.rows:
        error = row["error"].splitlines()[0] if row["error"] else "no result was written"
        print(f"{PROG}: job {row['job']} {row['status']}: {error}", file=sys.stderr)
    print(
        f"{PROG}: {len(incomplete.rows)} of {incomplete.total} runs did not complete; see the summary above",
        file=sys.stderr,
    )
    return 1
