"""The order of the test files (tests/helpers/durations.py): measured, longest first."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers.durations import DURATIONS_FILE, TESTS, longest_first, read_durations


def test_measured_files_go_longest_first_and_unmeasured_ones_before_them():
    key = longest_first({"a.py": 3.0, "b.py": 30.0, "c.py": 0.5})
    assert sorted(["c.py", "a.py", "new.py", "b.py"], key=key) == ["new.py", "b.py", "a.py", "c.py"]


def test_the_committed_durations_name_test_files_that_exist():
    durations = read_durations()
    assert durations, f"{DURATIONS_FILE} is missing or empty: make test-durations writes it"
    gone = [name for name in durations if not (TESTS / name).is_file()]
    assert gone == [], f"{DURATIONS_FILE} names files that are gone ({gone}): make test-durations"


@pytest.mark.slow  # runs pytest in a process
def test_a_run_writes_each_files_seconds_merged_into_the_earlier_ones(tmp_path):
    (tmp_path / "conftest.py").write_text(
        f"import sys; sys.path.insert(0, {str(TESTS)!r})\n"
        "from helpers.durations import DurationsRecorder\n"
        "def pytest_configure(config):\n"
        "    config.pluginmanager.register(DurationsRecorder(config.rootpath / 'durations.json', config.rootpath))\n"
    )
    sleeps = "import time\ndef test_a(): time.sleep(0.3)\ndef test_b(): time.sleep(0.3)\n"
    (tmp_path / "test_slow.py").write_text(sleeps)
    (tmp_path / "test_quick.py").write_text("def test_c(): pass\n")
    out = tmp_path / "durations.json"
    out.write_text(json.dumps({"seconds": {"kept_from_before.py": 9.0}}))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        # the options of the run around this one (a --write-durations of make test-durations) are
        # not this small run's: its conftest has no such option
        env={key: value for key, value in os.environ.items() if key != "PYTEST_ADDOPTS"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    seconds = json.loads(out.read_text())["seconds"]
    slow, quick = (os.path.relpath(tmp_path / name, TESTS) for name in ("test_slow.py", "test_quick.py"))
    assert seconds["kept_from_before.py"] == 9.0 and seconds[slow] >= 0.6 and seconds[quick] < 0.3
    assert list(seconds) == ["kept_from_before.py", slow, quick]  # written longest first
