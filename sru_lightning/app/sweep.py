"""Per-job result files and the end-of-sweep summary table (markdown + CSV).

Every run writes `result.json` into its own output directory. After a multirun, the
`SweepSummary` Hydra callback reads the result of each job directory (whatever launcher ran
it: local, joblib, submitit on SLURM) and writes `summary.md` and `summary.csv` next to them.
A job that died without writing its result is listed as `missing`, and one its launcher gave up
on (`lost.json` in its folder, see sru_lightning.app.slurm_launcher) as `lost`, with the
launcher's reason. When a job did not
complete, the callback ends the command with :class:`SweepIncomplete`, which carries those
rows to the command line.
"""

from __future__ import annotations

import csv
import json
import logging
import math
import shlex
import time
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from sru_lightning.app.runs.records import HISTORY_FILE, RESULT_FILE

log = logging.getLogger(__name__)

SUMMARY_MARKDOWN = "summary.md"
SUMMARY_CSV = "summary.csv"
# Written into a job's folder by a launcher that gave up on the job (it ended without a result).
LOST_FILE = "lost.json"
# How a run ends on its own terms. A lost job whose run recorded anything else (`running`, no
# record at all, or `interrupted`: stopped by the scheduler's SIGTERM, a stop the sweep will not
# come back to) is listed as lost, with the launcher's reason and the run's.
SETTLED_STATUSES = ("completed", "failed")
# Metrics shown first when present; any other metric follows in alphabetical order.
PREFERRED_METRICS = (
    "val_bpc",
    "val_ppl",
    "test_bpc",
    "test_ppl",
    "unigram_bpc",
    "train_bpc_epoch",
    "val_bpw",
    "val_word_ppl",
    "test_bpw",
    "test_word_ppl",
    "unigram_bpw",
    "train_bpw_epoch",
)

# How each job ran, after its metrics: optimizer steps, training throughput, wall time.
# Column -> decimals shown in summary.md (summary.csv keeps every digit).
RUN_COLUMNS = {"optimizer_steps": 0, "tokens_per_second": 0, "wall_seconds": 1}
# Significant digits summary.md keeps of a metric (a learning rate of 2.9e-05 must not read
# 0.0000), and of a run column (a short run's 0.04 s is not 0.0).
METRIC_SIGNIFICANT_DIGITS = 4
RUN_COLUMN_SIGNIFICANT_DIGITS = 1
# Above this, fixed-point notation prints digits a float does not hold.
_FIXED_POINT_LIMIT = 1e15


class SweepIncomplete(SystemExit):
    """Ends a sweep in which some jobs did not complete, with exit status 1 (Hydra lets
    SystemExit pass its callbacks); `rows` are the summary rows of those jobs, `total` the
    number of jobs in the summary."""

    def __init__(self, rows: list[dict[str, Any]], total: int) -> None:
        super().__init__(1)
        self.rows = rows
        self.total = total


def _job_sort_key(path: Path) -> tuple[int, str]:
    return (int(path.name), "") if path.name.isdigit() else (1 << 30, path.name)


def collect_results(sweep_dir: str | Path, since: float | None = None) -> list[dict[str, Any]]:
    """One row per job directory under `sweep_dir`: job, status, overrides, metrics, error.

    With `since` (a time.time()), only the jobs this sweep started: Hydra writes a job's
    `.hydra/overrides.yaml` when it starts it, so older job folders belong to an earlier sweep.
    """
    rows = []
    for job_dir in sorted((p for p in Path(sweep_dir).iterdir() if p.is_dir()), key=_job_sort_key):
        overrides_file = job_dir / ".hydra" / "overrides.yaml"
        result_file = job_dir / RESULT_FILE
        if not any(file.exists() for file in (overrides_file, result_file, job_dir / LOST_FILE)):
            continue
        if since is not None and _started_before(job_dir, since):
            continue
        record: dict[str, Any] = latest_attempt(job_dir) or {}
        if not record and result_file.exists():
            try:
                record = json.loads(result_file.read_text())
            except (OSError, ValueError) as error:
                record = {"status": "unreadable", "error": f"{result_file}: {error}"}
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
        lines = (job_dir / HISTORY_FILE).read_text().splitlines()
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


def _started_before(job_dir: Path, since: float) -> bool:
    stamps = [
        file.stat().st_mtime
        for file in (job_dir / ".hydra" / "overrides.yaml", job_dir / RESULT_FILE, job_dir / LOST_FILE)
        if file.exists()
    ]
    return max(stamps) < since


def _metric_columns(rows: list[dict[str, Any]]) -> list[str]:
    present = {name for row in rows for name in row["metrics"]}
    first = [name for name in PREFERRED_METRICS if name in present]
    return first + sorted(present - set(first))


def _is_whole(value: Any) -> bool:
    return isinstance(value, float) and math.isfinite(value) and value.is_integer() and abs(value) < _FIXED_POINT_LIMIT


def _format(value: Any, digits: int = 4, significant: int = METRIC_SIGNIFICANT_DIGITS) -> str:
    """A number for summary.md, as it reads best: integers (and whole floats such as an `epoch`
    metric) without a fraction; other floats with `digits` decimals when those still show
    `significant` significant digits, else with `significant` significant digits in whatever
    notation Python picks (``2.9e-05``), so a small or huge value keeps its meaning."""
    if _is_whole(value):
        return str(int(value))
    if isinstance(value, float):
        magnitude = abs(value)
        if not math.isfinite(value) or 10.0 ** (significant - 1 - digits) <= magnitude < _FIXED_POINT_LIMIT:
            return f"{value:.{digits}f}"
        return f"{value:.{significant}g}"
    return "" if value is None else str(value)


def _exact(value: Any) -> str:
    """A number for summary.csv, where a program reads it back: every digit of a float (its
    shortest round-tripping form, ``2.9e-05``), integers and whole floats without a fraction."""
    if _is_whole(value):
        return str(int(value))
    if isinstance(value, float):
        return repr(value)
    return "" if value is None else str(value)


def write_summary(sweep_dir: str | Path, rows: list[dict[str, Any]], stopped: bool = False) -> tuple[Path, Path]:
    """Write summary.md and summary.csv for `rows` into `sweep_dir`; return their paths.
    `stopped`: the sweep ended before its last job, which summary.md then says."""
    sweep_dir = Path(sweep_dir)
    metrics = _metric_columns(rows)
    header = ["job", "status", "overrides", *metrics, *RUN_COLUMNS, "error"]

    def cells(row: dict[str, Any], metric, run_column) -> list[str]:
        return [
            row["job"],
            row["status"],
            row["overrides"],
            *(metric(row["metrics"].get(m)) for m in metrics),
            *(run_column(row.get(key), key) for key in RUN_COLUMNS),
            row["error"].splitlines()[0] if row["error"] else "",
        ]

    csv_path = sweep_dir / SUMMARY_CSV
    with open(csv_path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(cells(row, _exact, lambda value, key: _exact(value)) for row in rows)
    table = [
        cells(row, _format, lambda value, key: _format(value, RUN_COLUMNS[key], RUN_COLUMN_SIGNIFICANT_DIGITS))
        for row in rows
    ]

    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    lines = [
        f"# Sweep summary: {sweep_dir}",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
        *("| " + " | ".join(cell(value) for value in line) + " |" for line in table),
        "",
    ]
    done = sum(row["status"] == "completed" for row in rows)
    lines.append(f"{done} of {len(rows)} jobs completed.")
    if stopped:
        lines.append("The sweep was stopped: the jobs it had not started yet are not listed.")
    markdown_path = sweep_dir / SUMMARY_MARKDOWN
    markdown_path.write_text("\n".join(lines) + "\n")
    return markdown_path, csv_path


class SweepSummary(Callback):
    """Hydra callback: after a multirun, tabulate the overrides and final metrics of every job
    this sweep ran (a sweep continued in the folder of an earlier one lists only its own jobs)."""

    def __init__(self) -> None:
        self.started: float | None = None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        global _unfinished
        # A little slack for file systems that store times coarsely.
        self.started = time.time() - 1.0
        _unfinished = (Path(config.hydra.sweep.dir), self.started)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        global _unfinished
        _unfinished = None
        rows = summarise(Path(config.hydra.sweep.dir), self.started)
        incomplete = [row for row in rows if row["status"] != "completed"]
        if incomplete:
            raise SweepIncomplete(incomplete, len(rows))


#: The sweep under way (its folder, when it started) until its summary is written.
_unfinished: tuple[Path, float] | None = None


def summarise(sweep_dir: Path, since: float | None, stopped: bool = False) -> list[dict[str, Any]]:
    """Write and print the summary of the jobs this sweep ran; their rows."""
    if not sweep_dir.is_dir():
        return []
    rows = collect_results(sweep_dir, since=since)
    markdown_path, csv_path = write_summary(sweep_dir, rows, stopped)
    print(markdown_path.read_text(), flush=True)
    log.info("Sweep summary: %s and %s", markdown_path, csv_path)
    return rows


def summarise_stopped_sweep(continue_with: list[str] | None = None) -> None:
    """A sweep stopped early (by its sweeper, Optuna past `max_failure_rate`, or by Ctrl+C or
    SIGTERM in one of its jobs) still gets the summary of the jobs it ran: Hydra calls no
    end-of-sweep callback then. `continue_with`: the sweep's command (`fit -m ...`), to print
    the one that continues it, each job in its own folder (`ckpt_path=auto`)."""
    global _unfinished
    if _unfinished is not None:
        sweep_dir, since = _unfinished
        _unfinished = None
        summarise(sweep_dir, since, stopped=True)
        if continue_with:
            kept = [
                word for word in continue_with if not word.lstrip("+~").startswith(("ckpt_path=", "hydra.sweep.dir="))
            ]
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
