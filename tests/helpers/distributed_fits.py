"""Starting, signalling and reading real 2-process `fit trainer=ddp_cpu` runs, for the DDP tests.

Every fit runs in its own session (so a signal to "the whole process group" reaches exactly
its processes) with one thread per process, and every wait has a hard limit: a fit that does
not end in time is killed and reported as a hang instead of blocking the test run.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from helpers import preloaded

REPO = Path(__file__).resolve().parents[2]
TESTS = Path(__file__).resolve().parent

TINY_DDP_FIT = [
    "trainer=ddp_cpu",
    "data.batch_size=4",
    "data.seq_len=16",
    "model.net.embedding_dim=16",
    "model.net.hidden_size=32",
    "model.net.num_layers=2",
    "trainer.limit_val_batches=2",
    "trainer.log_every_n_steps=1",
    "+logger.csv.flush_logs_every_n_steps=1",
    "seed=7",
]


def environment(one_thread: bool = True) -> dict[str, str]:
    env = dict(os.environ)
    # The repository for the package, tests/ for the signal-sending callback.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), str(TESTS), env.get("PYTHONPATH")]))
    env.pop("OMP_NUM_THREADS", None)
    if one_thread:
        env["OMP_NUM_THREADS"] = "1"  # the same thread count in every run: bit-equal losses
    env.pop("PL_GLOBAL_SEED", None)
    return env


def fit_command(run_dir: Path, *overrides: str) -> list[str]:
    return [sys.executable, "-m", "sru_lightning", "fit", f"hydra.run.dir={run_dir}", *TINY_DDP_FIT, *overrides]


@dataclass
class Ended:
    returncode: int | None  # None: it hung and was killed
    stdout: str
    seconds: float
    leftover: list[int]  # processes of the fit's session still alive after rank 0 ended


def start(
    run_dir: Path, *overrides: str, command: list[str] | None = None, log: Path | None = None, one_thread: bool = True
) -> subprocess.Popen:
    """Start the fit (or `command`) in a new session; its output goes to `log` (default `<run_dir>.out`).

    `one_thread=False` leaves OMP_NUM_THREADS unset, for runs that choose threads themselves.
    """
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    log = log or Path(f"{run_dir}.out")
    process = preloaded.Popen(
        command or fit_command(run_dir, *overrides),
        cwd=REPO,
        env=environment(one_thread),
        stdout=open(log, "w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    process.log = log
    return process


def session_processes(session: int) -> list[int]:
    """Live processes of `session` (Linux /proc; the fit's rank 0 leads its session)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == session and fields[0] != "Z":
            found.append(int(entry))
    return found


def finish(process: subprocess.Popen, timeout: float) -> Ended:
    """Wait for rank 0 (hard limit), then up to 20 s for the other ranks; kill whatever is left."""
    started = time.monotonic()
    try:
        returncode = process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        returncode = None
    seconds = time.monotonic() - started
    deadline = time.monotonic() + (20 if returncode is not None else 0)
    while session_processes(process.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    leftover = session_processes(process.pid)
    for pid in leftover:
        with _ignore_gone():
            os.kill(pid, signal.SIGKILL)
    if returncode is None:
        with _ignore_gone():
            os.kill(process.pid, signal.SIGKILL)
        process.wait()
    return Ended(returncode, process.log.read_text(), seconds, leftover)


class _ignore_gone:
    def __enter__(self):
        return self

    def __exit__(self, kind, value, traceback):
        return kind is not None and issubclass(kind, ProcessLookupError)


def run_fit(run_dir: Path, *overrides: str, timeout: float = 240) -> Ended:
    return finish(start(run_dir, *overrides), timeout)


def step_losses(run_dir: Path) -> dict[int, float]:
    """{step: rank 0's train_loss} from the run's CSV metrics."""
    path = run_dir / "csv" / "metrics.csv"
    if not path.is_file():
        return {}
    with path.open() as handle:
        return {int(row["step"]): float(row["train_loss"]) for row in csv.DictReader(handle) if row.get("train_loss")}


def result(run_dir: Path) -> dict:
    return json.loads((run_dir / "result.json").read_text())


def children(pid: int) -> list[int]:
    try:
        return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def send_signal_callback(hook: str, target: str, signum: int, at_step: int, count: int = 1) -> list[str]:
    """Overrides adding tests/signal_sender.SendSignal to the fit's callbacks."""
    prefix = "+callbacks.send_signal"
    return [
        f"{prefix}._target_=signal_sender.SendSignal",
        f"{prefix}.hook={hook}",
        f"{prefix}.target={target}",
        f"{prefix}.signum={int(signum)}",
        f"{prefix}.at_step={at_step}",
        f"{prefix}.count={count}",
    ]
