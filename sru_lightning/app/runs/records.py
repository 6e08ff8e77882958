"""The records a run leaves in its directory: `result.json` (the outcome of the latest attempt)
and `history.jsonl` (one line per attempt), where :class:`~.folder.RunFolder` says. The run
writes them (:meth:`~.folder.RunFolder.write_record`); the sweep summary and `ckpt_path=last`
read them. Every record carries `format_version` (:data:`RECORD_VERSION`); a
record of another version is refused in one line (:func:`check_record_format`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sru_lightning._atomic import write_text

#: The format of the records this sru_lightning writes and reads.
RECORD_VERSION = 1


class RecordFormatError(ValueError):
    """A run record of a format this sru_lightning does not read."""


def check_record_format(record: dict[str, Any], path: str | Path) -> None:
    """Raise RecordFormatError, naming the file, unless `record` is of this format."""
    found = record.get("format_version")
    if found != RECORD_VERSION or isinstance(found, bool):
        raise RecordFormatError(
            f"cannot read the run record {str(path)!r}: its format version is "
            f"{found if found is not None else 'none'}, expected {RECORD_VERSION} (it was written by an earlier "
            "sru_lightning)"
        )


def read_record(path: str | Path) -> dict[str, Any] | None:
    """The record in the file `path`; None when there is none or it is not JSON (a partial copy).
    RecordFormatError for a record of another format."""
    path = Path(path)
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict):
        return None
    check_record_format(record, path)
    return record


def write_record_file(path: str | Path, record: dict[str, Any]) -> Path:
    """Write one run's result record (status, command, overrides, metrics, error) as JSON into `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, json.dumps(_versioned(record), indent=2, sort_keys=True, default=str))  # never half a file
    return path


def append_record(path: str | Path, record: dict[str, Any]) -> None:
    """Append one attempt's record to the history file `path`, one line."""
    with open(path, "a") as history:
        history.write(json.dumps(_versioned(record), sort_keys=True, default=str) + "\n")


def _versioned(record: dict[str, Any]) -> dict[str, Any]:
    return {**record, "format_version": RECORD_VERSION}
