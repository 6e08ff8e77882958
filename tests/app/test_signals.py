"""A real `python -m sru_lightning fit` killed mid-fit leaves a checkpoint, and resuming it
reproduces the uninterrupted run's per-step training losses.

Every run uses the same tiny configuration and seed and logs its training loss at every step
to the CSV logger; the interrupted run is stopped with SIGTERM (or SIGINT) once it has logged
a few steps, well inside the first epoch, so the resume starts mid-epoch.
"""

from __future__ import annotations

import csv
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import preloaded

REPO = Path(__file__).resolve().parents[2]
MAX_STEPS = 40
SIGNAL_AFTER_STEPS = 6
# Same machine, same thread count, same operations in the same order: the losses after the
# resume are the uninterrupted run's bit for bit; the tolerance allows one float32 ulp. (A
# resume that forgets the language model's carried hidden state is off by ~1e-5 relative at
# its first step on this tiny model, so anything looser would hide it.)
LOSS_TOLERANCE = dict(rel=1e-7, abs=0.0)


def callbacks_override() -> str:
    defaults = (REPO / "conf" / "callbacks" / "default.yaml").read_text()
    return "callbacks=default" if "fault_tolerance" in defaults else "callbacks=[default,fault_tolerance]"


TINY_FIT = [
    "data.batch_size=4",
    "data.seq_len=16",
    "model.net.embedding_dim=16",
    "model.net.hidden_size=32",
    "model.net.num_layers=2",
    "trainer.limit_val_batches=2",
    f"trainer.max_steps={MAX_STEPS}",
    "trainer.log_every_n_steps=1",
    "+logger.csv.flush_logs_every_n_steps=1",
    "seed=7",
]


def fit_command(run_dir: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "sru_lightning",
        "fit",
        callbacks_override(),
        f"hydra.run.dir={run_dir}",
        *TINY_FIT,
        *extra,
    ]


def environment() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def step_losses(run_dir: Path) -> dict[int, float]:
    """{step: train_loss} from the run's CSV metrics."""
    path = run_dir / "csv" / "metrics.csv"
    if not path.is_file():
        return {}
    with path.open() as handle:
        rows = list(csv.DictReader(handle))
    return {int(row["step"]): float(row["train_loss"]) for row in rows if row.get("train_loss")}


def run_to_completion(run_dir: Path, *extra: str) -> dict[int, float]:
    completed = preloaded.run(
        fit_command(run_dir, *extra), cwd=REPO, env=environment(), capture_output=True, text=True, timeout=300
    )
    assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-3000:]
    return step_losses(run_dir)


def interrupt(run_dir: Path, signum: int) -> subprocess.CompletedProcess:
    """Start a fit, send `signum` once it has logged SIGNAL_AFTER_STEPS steps, wait for it."""
    process = preloaded.Popen(
        fit_command(run_dir), cwd=REPO, env=environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 240
    try:
        while len(step_losses(run_dir)) < SIGNAL_AFTER_STEPS:
            assert process.poll() is None, "the fit ended before it could be interrupted"
            assert time.monotonic() < deadline, "the fit logged no steps in time"
            time.sleep(0.02)
        process.send_signal(signum)
        stdout, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


@pytest.fixture(scope="module")
def uninterrupted_losses(tmp_path_factory) -> dict[int, float]:
    losses = run_to_completion(tmp_path_factory.mktemp("uninterrupted"))
    assert sorted(losses) == list(range(MAX_STEPS)), "every step's loss must be logged"
    return losses


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_killed_fit_resumes_with_the_uninterrupted_losses(tmp_path, signum, uninterrupted_losses):
    interrupted_dir = tmp_path / "interrupted"
    stopped = interrupt(interrupted_dir, signum)
    assert stopped.returncode != 0, "an interrupted fit must not report success"
    checkpoint = interrupted_dir / "checkpoints" / "interrupted.ckpt"
    assert checkpoint.is_file(), f"no checkpoint after {signal.Signals(signum).name}:\n{stopped.stderr[-3000:]}"
    saved = torch.load(checkpoint, map_location="cpu", weights_only=False)
    stop_step = saved["global_step"]
    assert SIGNAL_AFTER_STEPS <= stop_step < MAX_STEPS - 5, f"stopped at step {stop_step}"
    assert saved["loops"]["fit_loop"]["epoch_loop.batch_progress"]["current"]["completed"] == stop_step, (
        "the checkpoint must be taken mid-epoch, at a batch boundary"
    )
    # The steps logged before the stop are the uninterrupted run's too.
    before = step_losses(interrupted_dir)
    assert set(before) == set(range(stop_step))
    for step, loss in before.items():
        assert loss == pytest.approx(uninterrupted_losses[step], **LOSS_TOLERANCE), f"step {step}"

    # The run says where it stopped and how to continue; result.json agrees.
    announced = f"interrupted at step {stop_step}; resume with: "
    assert announced in stopped.stdout, stopped.stdout[-2000:]
    record = json.loads((interrupted_dir / "result.json").read_text())
    assert record["status"] == "interrupted" and record["optimizer_steps"] == stop_step
    # the real signal is named, in the record and the log (Ctrl+C is not "SIGTERM")
    name = "SIGINT (Ctrl+C)" if signum == signal.SIGINT else "SIGTERM"
    assert record["error"] == f"stopped by {name}"
    assert f"Received {name}" in stopped.stdout + stopped.stderr
    assert "SIGTERMException" not in stopped.stdout + stopped.stderr

    # The printed command (the requeue pattern: same run directory) continues the run and
    # keeps the rows logged before the stop.
    command = shlex.split(stopped.stdout.split(announced, 1)[1].splitlines()[0])
    assert command[:4] == ["python", "-m", "sru_lightning", "fit"]
    completed = preloaded.run(
        [sys.executable, *command[1:]], cwd=REPO, env=environment(), capture_output=True, text=True, timeout=300
    )
    assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-3000:]
    resumed = step_losses(interrupted_dir)
    assert sorted(resumed) == list(range(MAX_STEPS)), "earlier rows kept, the resumed fit continues at the next step"
    mismatches = {
        step: (loss, uninterrupted_losses[step])
        for step, loss in resumed.items()
        if loss != pytest.approx(uninterrupted_losses[step], **LOSS_TOLERANCE)
    }
    assert not mismatches, f"resumed losses differ from the uninterrupted run at {mismatches}"
    attempts = [json.loads(line) for line in (interrupted_dir / "history.jsonl").read_text().splitlines()]
    assert [a["status"] for a in attempts] == ["interrupted", "completed"]


def _signal_at(name: str, hook: str, at_step: int) -> list[str]:
    prefix = f"+callbacks.{name}"
    return [
        f"{prefix}._target_=signal_sender.SendSignal",
        f"{prefix}.hook={hook}",
        f"{prefix}.target=rank0",
        f"{prefix}.signum={int(signal.SIGINT)}",
        f"{prefix}.at_step={at_step}",
    ]


@pytest.mark.slow
def test_a_second_ctrl_c_while_the_checkpoint_is_written_leaves_no_checkpoint_and_says_so(tmp_path):
    """The first Ctrl+C stops the fit at step 3; the second lands inside the interruption
    checkpoint's save: nothing may look resumable, and the record and message say it was aborted."""
    run_dir = tmp_path / "run"
    env = environment()
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "tests" / "helpers"), env["PYTHONPATH"]])
    command = fit_command(
        run_dir, *_signal_at("first", "on_train_batch_start", 3), *_signal_at("second", "on_save_checkpoint", 3)
    )
    stopped = preloaded.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert stopped.returncode != 0
    checkpoints = sorted(os.listdir(run_dir / "checkpoints")) if (run_dir / "checkpoints").is_dir() else []
    assert checkpoints == [], f"a half-written checkpoint was left: {checkpoints}"
    record = json.loads((run_dir / "result.json").read_text())
    assert record["status"] == "interrupted" and record["error"].startswith("aborted by a second Ctrl+C"), record
    assert "nothing to resume (no checkpoint was written)" in stopped.stdout, stopped.stdout[-2000:]
    assert "Traceback" not in stopped.stdout + stopped.stderr


def test_a_second_ctrl_c_after_the_fit_stopped_lets_the_record_finish():
    """Once the Trainer call has ended (its checkpoint written), a second Ctrl+C no longer aborts:
    what is left is the run's record and its resume line."""
    from sru_lightning.callbacks import GracefulInterrupt

    graceful = GracefulInterrupt()
    graceful._active = True
    graceful.received_signal = graceful.stop_signal = signal.SIGINT
    graceful._stopped = True  # on_exception ran: the stop is complete
    graceful._handle_signal(signal.SIGINT, None)  # outside any Trainer call: no KeyboardInterrupt
    assert not graceful.aborted
    graceful._stopped = False  # still inside the stop (no on_exception yet): a second Ctrl+C aborts
    with pytest.raises(KeyboardInterrupt):
        graceful._handle_signal(signal.SIGINT, None)
    assert graceful.aborted
