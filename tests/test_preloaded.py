"""What the tests' fork server (helpers/preloaded.py) promises: a real process per command,
as a fresh interpreter would run it, or a fresh interpreter where it cannot promise that."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import preloaded

pytestmark = pytest.mark.slow  # starts processes
needs_server = pytest.mark.skipif(
    os.environ.get(preloaded.FRESH) == "1", reason=f"{preloaded.FRESH}=1: the fork server is off"
)
REPO = Path(__file__).resolve().parents[1]

SHOW = """
import json, os, sys
print(json.dumps(dict(argv=sys.argv, cwd=os.getcwd(), name=__name__, value=os.environ.get("PRELOADED_PROBE"),
                      path0=sys.path[0], on_path="/somewhere/else" in sys.path,
                      ours="sru_lightning" in sys.modules, torch="torch" in sys.modules)))
sys.stderr.write("to stderr\\n")
sys.exit(7)
"""


@needs_server
def test_the_test_processes_come_from_the_server_after_an_in_process_compile():
    import torch

    torch.compile(lambda x: x * 2, backend="inductor")(torch.ones(3))  # sets TORCHINDUCTOR_CACHE_DIR here
    command = [sys.executable, "-m", "sru_lightning", "fit"]
    assert preloaded.fresh_interpreter_reason(command) is None
    assert preloaded.fresh_interpreter_reason(command, env={**os.environ, "OMP_NUM_THREADS": "1"}) is None
    assert "PYTHONHASHSEED" in preloaded.fresh_interpreter_reason(command, env={**os.environ, "PYTHONHASHSEED": "1"})


@needs_server
def test_a_command_runs_in_its_own_process_with_its_arguments_directory_and_environment(tmp_path):
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


@needs_server
def test_a_new_session_gets_the_signals_sent_to_its_group(tmp_path):
    process = preloaded.Popen(
        [sys.executable, "-c", "import os, time; print(os.getsid(0), flush=True); time.sleep(60)"],
        stdout=open(tmp_path / "out", "w"),
        start_new_session=True,
    )
    assert process.fresh_interpreter_reason is None
    deadline = time.monotonic() + 60
    while not (tmp_path / "out").read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert int((tmp_path / "out").read_text()) == process.pid  # it leads its own session
    os.killpg(process.pid, signal.SIGTERM)
    assert process.wait(timeout=60) == -signal.SIGTERM


@needs_server
def test_an_environment_that_changes_what_the_imports_read_gets_a_fresh_interpreter():
    env = {**os.environ, "PYTHONHASHSEED": "123"}
    process = preloaded.Popen([sys.executable, "-c", "pass"], env=env)
    assert process.wait(timeout=120) == 0
    assert process.fresh_interpreter_reason == "environment read at import differs: ['PYTHONHASHSEED']"
    options = preloaded.Popen([sys.executable, "-I", "-c", "pass"])  # interpreter options: fresh too
    assert (
        options.wait(timeout=120) == 0
        and options.fresh_interpreter_reason == "an interpreter option or no command: ['-I']"
    )


@needs_server
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


@needs_server
def test_an_uncaught_keyboard_interrupt_ends_the_process_by_sigint():
    ended = preloaded.run(
        [sys.executable, "-c", "raise KeyboardInterrupt"], capture_output=True, text=True, timeout=120
    )
    assert ended.returncode == -signal.SIGINT and "KeyboardInterrupt" in ended.stderr


EXITS = [
    "import sys; sys.exit('bye')",
    "import sys; sys.exit()",
    "import sys; sys.exit(259)",
    "import sys; sys.exit(-1)",
    "raise ValueError('no')",
    "import atexit, threading, time\natexit.register(print, 'at exit')\n"
    "threading.Thread(target=time.sleep, args=(0.5,)).start()",
]


@needs_server
def test_a_forked_process_ends_as_a_fresh_interpreter_does():
    """Its exit status, what it prints, its non-daemon threads waited for and `atexit` run."""
    for code in EXITS:
        forked = preloaded.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        fresh = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert forked.fresh_interpreter_reason is None
        assert (forked.returncode, forked.stdout) == (fresh.returncode, fresh.stdout), code
        assert forked.stderr.splitlines()[-1:] == fresh.stderr.splitlines()[-1:], code


# --- guardrails ---------------------------------------------------------------------------


@needs_server
def test_the_server_runs_a_single_thread():
    """Its imports leave no thread behind (numpy's and scipy's OpenBLAS would start a pool),
    and forking children starts none."""
    server = preloaded._server()
    assert preloaded.run([sys.executable, "-c", "pass"], timeout=120).fresh_interpreter_reason is None
    assert os.listdir(f"/proc/{server.process.pid}/task") == [str(server.process.pid)]


@needs_server
def test_a_child_runs_the_blas_threads_its_environment_asks_for():
    """The server's OpenBLAS runs one thread; each child sets the count a fresh interpreter's
    OpenBLAS would pick."""
    show = (
        "import ctypes, numpy\n"
        "maps = open('/proc/self/maps').read().splitlines()\n"
        "lib = ctypes.CDLL(next(line.split()[-1] for line in maps if 'openblas' in line and 'numpy' in line))\n"
        "names = ('scipy_openblas_get_num_threads64_', 'openblas_get_num_threads64_', 'openblas_get_num_threads')\n"
        "print(next(getattr(lib, name) for name in names if hasattr(lib, name))())\n"
    )
    base = {key: value for key, value in os.environ.items() if key not in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
    for extra in ({}, {"OMP_NUM_THREADS": "1"}, {"OPENBLAS_NUM_THREADS": "2", "OMP_NUM_THREADS": "1"}):
        env = {**base, **extra}
        forked = preloaded.run([sys.executable, "-c", show], env=env, capture_output=True, text=True, timeout=120)
        fresh = subprocess.run([sys.executable, "-c", show], env=env, capture_output=True, text=True, timeout=120)
        if fresh.returncode != 0:
            pytest.skip(f"no OpenBLAS thread count to read in this numpy: {fresh.stderr[-500:]}")
        assert forked.fresh_interpreter_reason is None
        assert (forked.returncode, forked.stdout) == (0, fresh.stdout), (extra, forked.stderr[-2000:])


REFUSED = "the fork server has 2 threads: a fork could deadlock"
STARTS_A_THREAD = "import threading, time\nthreading.Thread(target=time.sleep, args=(3600,), daemon=True).start()\n"


@needs_server
def test_a_server_with_a_second_thread_refuses_to_fork_and_a_real_interpreter_runs_the_command(tmp_path, monkeypatch):
    (tmp_path / "starts_a_thread.py").write_text(STARTS_A_THREAD)
    env = {key: value for key, value in os.environ.items() if key not in preloaded.RUNTIME_ONLY}
    server = preloaded._Server(preload=("starts_a_thread",), env={**env, "PYTHONPATH": str(tmp_path)})
    try:
        monkeypatch.setattr(preloaded, "_the_server", server)
        command = [sys.executable, "-c", "import sys; print(sys.executable); sys.exit(3)"]
        process = preloaded.Popen(command, stdout=subprocess.DEVNULL)  # answered once the server has imported
        assert process.wait(timeout=120) == 3 and process.fresh_interpreter_reason == REFUSED
        assert len(os.listdir(f"/proc/{server.process.pid}/task")) == 2
        ended = preloaded.run(command, capture_output=True, text=True, timeout=120, preload_children=True)
        assert ended.returncode == 3 and ended.stdout.strip() == sys.executable  # not the proxy: no server child
        assert ended.fresh_interpreter_reason == REFUSED
        # A preloaded child's own Python processes: the proxy is refused too, and becomes the interpreter.
        proxied = subprocess.run([server.proxy, *command[1:]], capture_output=True, text=True, timeout=120)
        assert proxied.returncode == 3 and proxied.stdout.strip() == sys.executable, proxied.stderr[-2000:]
        assert server.process.poll() is None  # refusing leaves the server serving
    finally:
        server.close()


def test_a_test_marked_cuda_never_forks(request, monkeypatch):
    """tests/conftest.py tells the fork server which test runs; a `cuda` one gets real
    interpreters (without starting a server)."""
    monkeypatch.delenv(preloaded.FRESH, raising=False)
    command = [sys.executable, "-c", "import sys; sys.exit(6)"]
    request.node.add_marker(pytest.mark.cuda)  # after collection: the GPU-less skip is already decided
    assert preloaded.fresh_interpreter_reason(command) == "the test is marked cuda"
    process = preloaded.Popen(command, preload_children=True)
    assert process.wait(timeout=120) == 6
    assert process.fresh_interpreter_reason == "the test is marked cuda"
    assert preloaded.run(command, timeout=120).fresh_interpreter_reason == "the test is marked cuda"


def test_an_environment_that_makes_a_gpu_visible_never_forks():
    """The rule the client and the proxy share: even where the server imported with the same
    CUDA_VISIBLE_DEVICES, a command that can see a GPU gets a real interpreter."""
    server_env = {"CUDA_VISIBLE_DEVICES": "0"}
    for devices in ("0", "1,0", "GPU-8a3e"):
        reason = preloaded.fresh_reason(["-m", "sru_lightning"], {"CUDA_VISIBLE_DEVICES": devices}, server_env)
        assert reason == f"the environment asks for CUDA (CUDA_VISIBLE_DEVICES={devices})"
    for hidden in ("", "-1"):
        env = {"CUDA_VISIBLE_DEVICES": hidden}
        assert preloaded.fresh_reason(["-m", "sru_lightning"], env, env) is None
    assert preloaded.fresh_reason(["-m", "sru_lightning"], {}, {}) is None


@needs_server
def test_a_command_that_makes_a_gpu_visible_gets_a_real_interpreter():
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "0"}
    command = [sys.executable, "-c", "import sys; print(sys.executable)"]
    reason = "the environment asks for CUDA (CUDA_VISIBLE_DEVICES=0)"
    assert preloaded.fresh_interpreter_reason(command, env=env) == reason
    ended = preloaded.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert ended.fresh_interpreter_reason == reason and ended.stdout.strip() == sys.executable


def test_the_proxy_execs_the_real_interpreter_for_a_command_that_can_see_a_gpu():
    """A preloaded child's `sys.executable`, run with a GPU visible, is the real interpreter,
    even where its server imported with the same CUDA_VISIBLE_DEVICES; with the GPUs hidden,
    it has the server fork the command (whose own `sys.executable` is the proxy again)."""
    command = ["-c", "import sys; print(sys.executable)"]
    for devices, forked in (("0", False), ("", True)):
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": devices}
        server = preloaded._Server(preload=(), env={k: v for k, v in env.items() if k not in preloaded.RUNTIME_ONLY})
        try:
            ended = subprocess.run([server.proxy, *command], env=env, capture_output=True, text=True, timeout=120)
            assert ended.returncode == 0, ended.stderr[-2000:]
            assert ended.stdout.strip() == (server.proxy if forked else sys.executable)
        finally:
            server.close()


def test_with_fresh_interpreters_switched_on_no_process_is_forked(monkeypatch):
    monkeypatch.setenv(preloaded.FRESH, "1")
    process = preloaded.Popen([sys.executable, "-c", "pass"])
    assert process.wait(timeout=120) == 0 and process.fresh_interpreter_reason == f"{preloaded.FRESH}=1"


# --- the same result forked and in a fresh interpreter ------------------------------------

SIGTERM_AT_STEP_1 = [
    "+callbacks.send_signal._target_=signal_sender.SendSignal",
    "+callbacks.send_signal.hook=on_train_batch_start",
    "+callbacks.send_signal.target=rank0",
    f"+callbacks.send_signal.signum={int(signal.SIGTERM)}",
    "+callbacks.send_signal.at_step=1",
]
# A sample of what the process tests run: `fit` arguments and the exit status expected (None:
# not 0, the same both ways).
SAMPLE = {
    "usage-error": (["trainer.max_epochs=[1"], 2),
    "tiny-fit": (["debug=tiny", "seed=3", "hydra.run.dir=run"], 0),
    "fit-stopped-by-sigterm": (["debug=tiny", "seed=3", "hydra.run.dir=run", *SIGTERM_AT_STEP_1], None),
}
KEY_LINES = re.compile(r"error:|Traceback|final val_bpc=|Received SIG|interrupted at step")
# What differs between two runs of the same command: when and how fast it ran.
VOLATILE = ("started", "wall_seconds", "tokens_per_second", "flops_per_second")


def observed(ended: subprocess.CompletedProcess, cwd: Path) -> dict:
    """Exit status, the lines a user or a test reads, and the run's record, with `cwd` as <cwd>."""
    text = (ended.stdout + ended.stderr).replace(str(cwd), "<cwd>")
    path = cwd / "run" / "result.json"
    record = json.loads(path.read_text().replace(str(cwd), "<cwd>")) if path.is_file() else None
    for key in VOLATILE:
        (record or {}).pop(key, None)
    lines = [line.rstrip() for line in text.splitlines() if KEY_LINES.search(line)]
    return {"returncode": ended.returncode, "lines": lines, "record": record}


@needs_server
@pytest.mark.parametrize("case", list(SAMPLE))
def test_a_sample_of_commands_gives_the_same_result_forked_and_in_a_fresh_interpreter(case, tmp_path, monkeypatch):
    arguments, status = SAMPLE[case]
    paths = [str(REPO), str(REPO / "tests" / "helpers"), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, paths))}
    results = {}
    for way in ("forked", "fresh"):
        cwd = tmp_path / way
        cwd.mkdir()
        with monkeypatch.context() as patch:
            if way == "fresh":
                patch.setenv(preloaded.FRESH, "1")
            ended = preloaded.run(
                [sys.executable, "-m", "sru_lightning", "fit", *arguments],
                cwd=cwd,
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
            )
        assert ended.fresh_interpreter_reason == (f"{preloaded.FRESH}=1" if way == "fresh" else None)
        results[way] = observed(ended, cwd)
    forked, fresh = results["forked"], results["fresh"]
    assert forked == fresh
    assert fresh["returncode"] == status if status is not None else fresh["returncode"] != 0
    assert fresh["lines"], "nothing to compare: the command printed none of the key lines"
    assert (fresh["record"] is None) == (case == "usage-error")
