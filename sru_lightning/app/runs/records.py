"""The records a run leaves in its directory: `result.json` (the outcome of the latest attempt)
and `history.jsonl` (one line per attempt). The run writes them; the sweep summary and
`ckpt_path=last` read them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RESULT_FILE = "result.json"
HISTORY_FILE = "history.jsonl"


def write_result(output_dir: str | Path, record: dict[str, Any]) -> Path:
    """Write one run's result record (status, command, overrides, metrics, error) as JSON."""
    path = Path(output_dir) / RESULT_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=2, sort_keys=True, default=str))
    tmp.replace(path)  # atomic: a reader never sees half a file
    return path


def write_record(output_dir: Path, record: dict[str, Any], *, keep_result: bool = False) -> None:
    """Append the attempt to history.jsonl and make it the run's result.json, unless
    `keep_result`: an attempt refused before it started leaves an earlier run's result alone."""
    if not (keep_result and (output_dir / RESULT_FILE).is_file()):
        write_result(output_dir, record)
    with open(output_dir / HISTORY_FILE, "a") as history:
        history.write(json.dumps(record, sort_keys=True, default=str) + "\n")


def run_status(run_dir: Path) -> str | None:
    """The status in the run directory's result.json (None when it has none or it is unreadable)."""
    try:
        return json.loads((run_dir / RESULT_FILE).read_text()).get("status")
    except (OSError, ValueError, AttributeError):
        return None
