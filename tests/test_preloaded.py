"""What the tests' fork server (helpers/preloaded.py) promises: a real process per command,
as a fresh interpreter would run it, or a fresh interpreter where it cannot promise that."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from helpers import preloaded

pytestmark = [
    pytest.mark.slow,  # starts processes
    pytest.mark.skipif(os.environ.get(preloaded.FRESH) == "1", reason=f"{preloaded.FRESH}=1: the fork server is off"),
]

SHOW = """
import json, os, sys
print(json.dumps(dict(argv=sys.argv, cwd=os.getcwd(), name=__name__, value=os.environ.get("PRELOADED_PROBE"),
                      path0=sys.path[0], on_path="/somewhere/else" in sys.path,
                      ours="sru_lightning" in sys.modules, torch="torch" in sys.modules)))
sys.stderr.write("to stderr\\n")
sys.exit(7)
"""


def test_the_test_processes_come_from_the_server_after_an_in_process_compile():
    import torch

    torch.compile(lambda x: x * 2, backend="inductor")(torch.ones(3))  # sets TORCHINDUCTOR_CACHE_DIR here
    command = [sys.executable, "-m", "sru_lightning", "fit"]
    assert preloaded.fresh_interpreter_reason(command) is None
    assert preloaded.fresh_interpreter_reason(command, env={**os.environ, "OMP_NUM_THREADS": "1"}) is None
    assert "PYTHONHASHSEED" in preloaded.fresh_interpreter_reason(command, env={**os.environ, "PYTHONHASHSEED": "1"})


def test_a_command_runs_in_its_own_process_with_its_arguments_directory_and_environment(tmp_path):
    import json

    env = {
        **os.environ,
        "PRELOADED_PROBE": "yes",
        "PYTHONPATH": os.pathsep.join(["/somewhere/else", os.environ.get("PYTHONPATH", "")]),
    }
    ended = preloaded.run(
        [sys.executable, "-c", SHOW, "a", "b"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert ended.returncode == 7 and ended.stderr == "to stderr\n"
    seen = json.loads(ended.stdout)
    assert seen["argv"] == ["-c", "a", "b"] and seen["cwd"] == str(tmp_path) and seen["name"] == "__main__"
    assert seen["value"] == "yes" and seen["path0"] == "" and seen["on_path"]
    # third-party modules come preloaded; the package is imported by each process itself
    assert seen["torch"] and not seen["ours"]


def test_a_new_session_gets_the_signals_sent_to_its_group(tmp_path):
    process = preloaded.Popen(
        [sys.executable, "-c", "import os, time; print(os.getsid(0), flush=True); time.sleep(60)"],
        stdout=open(tmp_path / "out", "w"),
        start_new_session=True,
    )
    assert isinstance(process, preloaded.Popen)
    deadline = time.monotonic() + 60
    while not (tmp_path / "out").read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert int((tmp_path / "out").read_text()) == process.pid  # it leads its own session
    os.killpg(process.pid, signal.SIGTERM)
    assert process.wait(timeout=60) == -signal.SIGTERM


def test_an_environment_that_changes_what_the_imports_read_gets_a_fresh_interpreter():
    env = {**os.environ, "PYTHONHASHSEED": "123"}
    process = preloaded.Popen([sys.executable, "-c", "pass"], env=env)
    assert isinstance(process, subprocess.Popen) and process.wait(timeout=120) == 0
    options = preloaded.Popen([sys.executable, "-I", "-c", "pass"])  # interpreter options: fresh too
    assert isinstance(options, subprocess.Popen) and options.wait(timeout=120) == 0


def test_preloaded_children_start_their_own_python_processes_from_the_server_too():
    inner = (
        "import subprocess, sys; sys.exit(subprocess.run([sys.executable, '-c', 'import sys; sys.exit(5)']).returncode)"
    )
    ended = preloaded.run(
        [sys.executable, "-c", inner], capture_output=True, text=True, timeout=120, preload_children=True
    )
    assert ended.returncode == 5, ended.stderr[-2000:]
    which = preloaded.run(
        [sys.executable, "-c", "import sys; print(sys.executable)"],
        capture_output=True,
        text=True,
        timeout=120,
        preload_children=True,
    )
    assert which.stdout.strip().endswith(os.path.join("", "python")) and which.stdout.strip() != sys.executable


def test_an_uncaught_keyboard_interrupt_ends_the_process_by_sigint():
    ended = preloaded.run(
        [sys.executable, "-c", "raise KeyboardInterrupt"], capture_output=True, text=True, timeout=120
    )
    assert ended.returncode == -signal.SIGINT and "KeyboardInterrupt" in ended.stderr
