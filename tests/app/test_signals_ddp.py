"""No signal hangs a 2-process `fit trainer=ddp_cpu`.

SIGTERM or Ctrl+C (SIGINT), sent to the whole process group (a terminal, SLURM) or to one
rank only, at every point of a training step (forward, backward, optimizer step),
during validation and while a checkpoint is being saved, ends the run with
`interrupted.ckpt`, the resume line and an `interrupted` record naming the signal. Sent
before training has started, it ends every process at once with a message. A rank that is
stuck when the signal comes is ended by the watchdog with a message, and a double Ctrl+C
aborts without a checkpoint. Every case has a hard time limit: a hang fails the test
instead of blocking the run, and every process of the fit must be gone at the end.

The fits are independent, so they run two at a time (module fixture); each test then
checks one case's outcome.
"""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from helpers.distributed_fits import Ended, children, finish, result, send_signal_callback, start, step_losses
from helpers.signal_sender import POINTS

MAX_STEPS, SIGNAL_AT_STEP, VALIDATE_EVERY = 12, 3, 5
TIME_LIMIT = 150  # seconds for one fit on a busy 2-core machine; a stop takes a few seconds
FIT = [f"trainer.max_steps={MAX_STEPS}", f"trainer.val_check_interval={VALIDATE_EVERY}"]

# Every point x (the whole group, one rank); at each point one case is SIGTERM and the other
# SIGINT, and the single rank alternates between rank 1 and rank 0.
STOP_CASES = {}
for index, hook in enumerate(POINTS):
    one_rank = "rank1" if index % 2 == 0 else "rank0"
    first, second = (signal.SIGTERM, signal.SIGINT) if index % 2 == 0 else (signal.SIGINT, signal.SIGTERM)
    for target, signum in (("group", first), (one_rank, second)):
        STOP_CASES[f"{POINTS[hook].replace(' ', '-')}/{target}/{signal.Signals(signum).name}"] = (hook, target, signum)


def stop_case(run_dir: Path, hook: str, target: str, signum: int) -> Ended:
    return finish(start(run_dir, *FIT, *send_signal_callback(hook, target, signum, SIGNAL_AT_STEP)), TIME_LIMIT)


def signal_at_startup(run_dir: Path, who: str, signum: int) -> Ended:
    """`who`: "group" 1 s after the start (imports), "rank0"/"rank1" as soon as rank 1 exists."""
    process = start(run_dir, *FIT)
    if who == "group":
        time.sleep(1.0)
        os.killpg(process.pid, signum)
        return finish(process, TIME_LIMIT)
    deadline = time.monotonic() + TIME_LIMIT
    while not children(process.pid) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    launched = children(process.pid)
    assert launched, "rank 1 was never launched"
    os.kill(process.pid if who == "rank0" else launched[0], signum)
    return finish(process, TIME_LIMIT)


def stuck_peer(run_dir: Path) -> Ended:
    """Rank 1 frozen (SIGSTOP) mid-training, then SIGTERM to rank 0: the watchdog must end it."""
    process = start(run_dir, *FIT, "trainer.max_steps=400", "callbacks.graceful_interrupt.stop_timeout=5")
    deadline = time.monotonic() + TIME_LIMIT
    while len(step_losses(run_dir)) < 2 and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    launched = children(process.pid)
    assert launched, "rank 1 is missing"
    os.kill(launched[0], signal.SIGSTOP)
    time.sleep(0.3)
    os.kill(process.pid, signal.SIGTERM)
    return finish(process, TIME_LIMIT)  # also kills the frozen rank


def killed_rank(run_dir: Path, who: str) -> Ended:
    """SIGKILL of one rank mid-training: no handler runs in it; the other one must say which died."""
    process = start(run_dir, *FIT, "trainer.max_steps=400")
    deadline = time.monotonic() + TIME_LIMIT
    while len(step_losses(run_dir)) < 2 and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    launched = children(process.pid)
    assert launched, "rank 1 is missing"
    os.kill(process.pid if who == "rank0" else launched[0], signal.SIGKILL)
    return finish(process, TIME_LIMIT)


CASES = {
    "kill9/rank1": (killed_rank, "rank1"),
    "kill9/rank0": (killed_rank, "rank0"),
    **{name: (stop_case, *arguments) for name, arguments in STOP_CASES.items()},
    "startup/group/SIGTERM": (signal_at_startup, "group", signal.SIGTERM),
    "startup/rank0/SIGINT": (signal_at_startup, "rank0", signal.SIGINT),
    "startup/rank1/SIGTERM": (signal_at_startup, "rank1", signal.SIGTERM),
    "stuck-peer/rank0/SIGTERM": (stuck_peer,),
    "double-ctrl-c/rank0/SIGINT": (
        lambda run_dir: finish(
            start(
                run_dir,
                *FIT,
                *send_signal_callback("on_before_backward", "rank0", signal.SIGINT, SIGNAL_AT_STEP, count=2),
            ),
            TIME_LIMIT,
        ),
    ),
}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, tuple[Path, Ended, float]]:
    root = tmp_path_factory.mktemp("signals")

    def run_case(name: str):
        run_dir = root / name.replace("/", "_")
        function, *arguments = CASES[name]
        started = time.monotonic()
        ended = function(run_dir, *arguments)
        return name, (run_dir, ended, time.monotonic() - started)

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = dict(pool.map(run_case, CASES))
    for name, (_, ended, seconds) in results.items():  # the matrix, shown with `pytest -s`
        print(f"{name:40s} exit {ended.returncode!s:>4}  {seconds:6.1f} s")
    return results


def describe(ended: Ended) -> str:
    return f"exit {ended.returncode} after {ended.seconds:.1f} s; output:\n{ended.stdout[-2500:]}"


def assert_ended_cleanly(ended: Ended) -> None:
    assert ended.returncode is not None, f"hung: killed after {TIME_LIMIT} s\n{describe(ended)}"
    assert not ended.leftover, f"processes left running: {ended.leftover}\n{describe(ended)}"
    assert "Traceback" not in ended.stdout, describe(ended)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(STOP_CASES))
def test_a_signal_anywhere_in_training_stops_with_a_resumable_checkpoint(outcomes, name):
    run_dir, ended, _ = outcomes[name]
    _, _, signum = STOP_CASES[name]
    assert_ended_cleanly(ended)
    assert ended.returncode == 1, describe(ended)
    checkpoint = torch.load(run_dir / "checkpoints" / "interrupted.ckpt", map_location="cpu", weights_only=True)
    step = checkpoint["global_step"]
    assert SIGNAL_AT_STEP <= step < MAX_STEPS, describe(ended)
    assert checkpoint["carried_train_state"]["world_size"] == 2
    assert f"interrupted at step {step}; resume with: " in ended.stdout, describe(ended)
    record = result(run_dir)
    name_of_signal = "SIGINT (Ctrl+C)" if signum == signal.SIGINT else "SIGTERM"
    assert record["status"] == "interrupted" and record["error"] == f"stopped by {name_of_signal}", record
    assert "SIGTERMException" not in ended.stdout and "Received SIGTERM: 15" not in ended.stdout
    assert not list((run_dir / "checkpoints").glob("*.partial")), "a half-written checkpoint was left"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["startup/group/SIGTERM", "startup/rank0/SIGINT", "startup/rank1/SIGTERM"])
def test_a_signal_before_training_ends_every_process_at_once(outcomes, name):
    run_dir, ended, _ = outcomes[name]
    assert_ended_cleanly(ended)
    assert ended.returncode != 0 and ended.seconds < 30, describe(ended)
    assert not (run_dir / "checkpoints" / "interrupted.ckpt").exists()
    if name != "startup/group/SIGTERM":  # the group signal may land before the handlers (killed at once)
        expected = "ended with status" if "rank1" in name else "before training started; exiting"
        assert expected in ended.stdout, describe(ended)


@pytest.mark.slow
def test_a_stuck_peer_ends_in_the_watchdog_with_a_message(outcomes):
    run_dir, ended, _ = outcomes["stuck-peer/rank0/SIGTERM"]
    assert ended.returncode == 1, describe(ended)
    assert ended.seconds < 30, describe(ended)
    assert "another process of this run is gone or stuck" in ended.stdout, describe(ended)
    assert "callbacks.graceful_interrupt.stop_timeout=5" in ended.stdout
    assert not (run_dir / "checkpoints" / "interrupted.ckpt").exists()
    # the watchdog's exit leaves a record, a log line, and no rank behind
    record = result(run_dir)
    assert record["status"] == "interrupted" and record["error"].startswith("ended by the stop watchdog"), record
    assert "another process of this run is gone or stuck" in (run_dir / "sru_lightning.log").read_text()
    assert not ended.leftover, f"processes left behind: {ended.leftover}"


@pytest.mark.slow
def test_a_double_ctrl_c_aborts_without_a_checkpoint_and_says_so(outcomes):
    run_dir, ended, _ = outcomes["double-ctrl-c/rank0/SIGINT"]
    assert_ended_cleanly(ended)
    assert ended.returncode == 1, describe(ended)
    assert not (run_dir / "checkpoints" / "interrupted.ckpt").exists(), "an abort must not look resumable"
    record = result(run_dir)
    assert record["status"] == "interrupted", record
    assert record["error"].startswith("aborted by a second Ctrl+C (SIGINT)"), record
    assert "nothing to resume (no checkpoint was written)" in ended.stdout, describe(ended)


@pytest.mark.slow
def test_a_killed_rank_is_named_in_one_line_and_in_the_record(outcomes):
    run_dir, ended, _ = outcomes["kill9/rank1"]
    assert ended.returncode == 1 and ended.seconds < 30, describe(ended)
    assert "Traceback" not in ended.stdout, describe(ended)
    assert "error: rank 1 (pid " in ended.stdout and "was killed by SIGKILL, so rank 0 could not go on" in ended.stdout
    record = result(run_dir)
    assert record["status"] == "failed" and "rank 1 (pid" in record["error"], record


@pytest.mark.slow
def test_a_killed_rank_0_leaves_a_record_written_by_rank_1(outcomes):
    run_dir, ended, _ = outcomes["kill9/rank0"]
    deadline = time.monotonic() + 30  # rank 1 outlives rank 0 by the time its collective fails
    while not (run_dir / "result.json").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    rank1_log = run_dir / "train_ddp_process_1.log"
    context = describe(ended) + (rank1_log.read_text()[-3000:] if rank1_log.exists() else "")
    assert (run_dir / "result.json").exists(), context
    record = result(run_dir)
    assert record["status"] == "failed" and record["error"].startswith("rank 0 (pid "), (record, context)
    assert "rank 1 wrote this record" in record["error"]
