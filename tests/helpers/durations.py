"""How long each test file takes, measured, and the order that starts the longest first.

`make test-durations` runs every tier as `make test` does with `--write-durations=
tests/durations.json`: each file's seconds (setup, call and teardown of all its tests, summed
on the worker that ran it) are written there, merged into what the file held (a file not run
this time keeps its earlier figure). Under pytest-xdist the controller receives every worker's
reports, so the figures are written once, by it.

The order (:func:`longest_first`): the files measured, longest first; a file not in the
durations file yet (a new one) goes before all of them, so that a new long file never starts
last and holds up the end of the run; a short new file costs a moment at the start. Run
`make test-durations` again when files are added or their times change much.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
DURATIONS_FILE = TESTS / "durations.json"


def read_durations(path: Path = DURATIONS_FILE) -> dict[str, float]:
    """{test file relative to tests/: seconds}; empty when the file is missing or unreadable."""
    try:
        found = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    seconds = found.get("seconds", {}) if isinstance(found, dict) else {}
    return {name: float(value) for name, value in seconds.items() if isinstance(value, (int, float))}


def longest_first(durations: dict[str, float]):
    """A sort key for test files (relative to tests/): unmeasured first, then longest first."""

    def key(name: str) -> tuple[int, float]:
        if name not in durations:
            return (0, 0.0)
        return (1, -durations[name])

    return key


class DurationsRecorder:
    """pytest plugin: sums each file's test durations and writes them at the end of the session."""

    def __init__(self, path: Path, rootdir: Path) -> None:
        self.path = Path(path)
        self.rootdir = Path(rootdir)
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report) -> None:
        file = report.nodeid.split("::", 1)[0]
        self.seconds[os.path.relpath(self.rootdir / file, TESTS).replace(os.sep, "/")] += report.duration

    def pytest_sessionfinish(self, session) -> None:
        merged = {**read_durations(self.path), **{name: round(value, 2) for name, value in self.seconds.items()}}
        ordered = dict(sorted(merged.items(), key=lambda item: (-item[1], item[0])))
        record = {
            "written_by": "make test-durations (pytest --write-durations=tests/durations.json)",
            "seconds": ordered,
        }
        self.path.write_text(json.dumps(record, indent=1) + "\n")
