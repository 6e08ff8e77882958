"""A sweep's summary as two tables in its folder: `summary.md` for people (numbers as they read
best) and `summary.csv` for programs (every digit), one row per job (sru_lightning.app.sweep
collects the rows)."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

SUMMARY_MARKDOWN = "summary.md"
SUMMARY_CSV = "summary.csv"
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
