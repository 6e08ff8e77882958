"""Two commands started at the same moment into one folder: exactly one writes it, the other is
refused in one line before it writes anything (sru_lightning/app/runs/hold.py), and readers
read whole checkpoints while a fit writes. Real processes, started together."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from helpers import preloaded
from helpers.tiny_run import TINY_RUN

from sru_lightning.app.runs.folder import RunFolder

pytestmark = pytest.mark.slow

STEPS = ["trainer.max_epochs=-1", "trainer.limit_train_batches=null", "trainer.log_every_n_steps=1"]
FIT_A = ["fit", *TINY_RUN, *STEPS, "trainer.max_steps=30"]
FIT_B = ["fit", *TINY_RUN, *STEPS, "trainer.max_steps=20", "model.net.hidden_size=24", "seed=7"]


def environment() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def start(words: list[str], cwd: Path, delay: float = 0.0):
    time.sleep(delay)
    return preloaded.Popen(
        [sys.executable, "-m", "sru_lightning", *words],
        cwd=cwd,
        env=environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def together(commands: list[list[str]], cwd: Path, seed: int) -> list[tuple[int, str, str]]:
    """Start `commands` within a few milliseconds of each other (in an order and with gaps drawn
    from `seed`); their exit statuses and outputs."""
    rng = random.Random(seed)
    order = list(range(len(commands)))
    rng.shuffle(order)
    processes = {}
    for index in order:
        processes[index] = start(commands[index], cwd, delay=rng.uniform(0, 0.2))
    ended = {}
    for index, process in processes.items():
        out, err = process.communicate(timeout=300)
        ended[index] = (process.returncode, out, err)
    return [ended[index] for index in range(len(commands))]


def refusal_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "must be a folder no other run is writing" in line]


def assert_of_one_run(run: Path) -> dict:
    """The folder's config, checkpoints, history and metrics are all of one run; its config."""
    config = yaml.safe_load((run / ".hydra" / "config.yaml").read_text())
    index = json.loads((run / "checkpoints.json").read_text())["checkpoints"]
    assert index, "the run saved no checkpoint"
    assert len({entry["run_id"] for entry in index.values()}) == 1, index.keys()
    for name, entry in index.items():
        assert entry["config"]["model"]["net"] == config["model"]["net"], name
        assert entry["config"]["seed"] == config["seed"], name
        state = torch.load(run / "checkpoints" / name, map_location="cpu", weights_only=True)["state_dict"]
        assert state["net.decoder.weight"].shape[-1] == config["model"]["net"]["hidden_size"], name
    history = [json.loads(line) for line in (run / "history.jsonl").read_text().splitlines()]
    result = json.loads((run / "result.json").read_text())
    assert history[-1] == result
    seeds = {record["overrides"].count("seed=7") for record in history}
    assert seeds == {int(config["seed"] == 7)}, [record["overrides"] for record in history]
    for metrics in run.glob("csv/**/metrics.csv"):
        header, *rows = metrics.read_text().splitlines()
        assert all(row.count(",") == header.count(",") for row in rows), metrics
    assert not (run / RunFolder.HOLD_FILE).exists()
    return config


def test_two_fits_started_together_one_trains_the_other_is_refused_before_writing(tmp_path):
    run = tmp_path / "runs" / "x"
    (a, a_out, a_err), (b, b_out, b_err) = together(
        [[*FIT_A, f"hydra.run.dir={run}"], [*FIT_B, f"hydra.run.dir={run}"]], tmp_path, seed=0
    )
    assert sorted([a, b]) == [0, 2], (a_err[-2000:], b_err[-2000:])
    refused_err = a_err if a == 2 else b_err
    assert len(refusal_lines(refused_err)) == 1 and "Traceback" not in refused_err + a_err + b_err
    (line,) = refusal_lines(refused_err)
    assert "(process " in line and " on host " in line and "python -m sru_lightning fit" in line
    config = assert_of_one_run(run)
    assert config["model"]["net"]["hidden_size"] == (16 if a == 0 else 24)
    steps = json.loads((run / "result.json").read_text())["optimizer_steps"]
    assert steps == (30 if a == 0 else 20)


def fit_into(run: Path) -> list[str]:
    return [*FIT_A, f"hydra.run.dir={run}"]


PAIRS = {
    "fit/fit": lambda run, sweep: ([*FIT_A, f"hydra.run.dir={run}"], [*FIT_B, f"hydra.run.dir={run}"]),
    "fit/resume": lambda run, sweep: (
        [*FIT_B, f"hydra.run.dir={run}"],
        [*FIT_A, "trainer.max_steps=40", f"ckpt_path={run}", f"hydra.run.dir={run}"],
    ),
    "fit/validate": lambda run, sweep: (
        [*FIT_A, f"hydra.run.dir={run}"],
        ["validate", *TINY_RUN, f"ckpt_path={run}", f"hydra.run.dir={run}"],
    ),
    "sweep/sweep": lambda run, sweep: (
        ["fit", "-m", *TINY_RUN, "seed=1,2", f"hydra.sweep.dir={sweep}"],
        ["fit", "-m", *TINY_RUN, "seed=7,8", f"hydra.sweep.dir={sweep}"],
    ),
}


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("pair", list(PAIRS))
def test_commands_started_together_never_leave_a_folder_of_two_runs(tmp_path, pair, seed):
    run, sweep = tmp_path / "run", tmp_path / "sweep"
    if pair == "fit/resume":  # the resumed run exists; a new fit starts beside its resume
        completed = preloaded.run(
            [sys.executable, "-m", "sru_lightning", *fit_into(run)], cwd=tmp_path, env=environment(), timeout=300
        )
        assert completed.returncode == 0
    outcomes = together(list(PAIRS[pair](run, sweep)), tmp_path, seed)
    statuses = [status for status, _, _ in outcomes]
    for status, out, err in outcomes:
        assert status in (0, 2), err[-3000:]
        assert "Traceback" not in out + err, err[-3000:]
        if status == 2:
            assert len([line for line in err.splitlines() if "error:" in line]) == 1, err[-2000:]
    if pair == "sweep/sweep":
        assert sorted(statuses) == [0, 2]
        jobs = sorted(path.name for path in sweep.iterdir() if path.is_dir() and not path.name.startswith("."))
        assert jobs == ["0", "1"]
        seeds = sorted(assert_of_one_run(sweep / job)["seed"] for job in jobs)
        assert seeds in ([1, 2], [7, 8])
        summary = (sweep / "summary.csv").read_text()
        assert all(f"seed={value}" in summary for value in seeds)
        return
    if pair == "fit/fit":
        assert sorted(statuses) == [0, 2]
    trained = outcomes[0][0] == 0 or (pair != "fit/validate" and outcomes[1][0] == 0)
    if trained or pair == "fit/resume":
        assert_of_one_run(run)
    else:  # the other held the folder first and was refused itself: nothing of either is left
        assert not run.exists() or sorted(os.listdir(run)) == [], sorted(os.listdir(run))
    if pair == "fit/validate" and outcomes[1][0] == 0:  # it evaluated the run beside it, not into it
        assert list((run / "evaluations").iterdir())


def test_readers_never_wait_and_never_read_half_a_checkpoint(tmp_path):
    """The readers' checkpoint choice (generate, export, serve) in a loop, and `generate` itself,
    while a fit writes a checkpoint every step and deletes the one before (top-k of 1)."""
    from sru_lightning.app.runs.trained_model import read_checkpoint

    run = tmp_path / "run"
    fit = start(
        [
            *FIT_A,
            "trainer.max_steps=150",
            "+callbacks.model_checkpoint.every_n_train_steps=1",
            "callbacks.model_checkpoint.monitor=null",
            'callbacks.model_checkpoint.filename="step{step:04d}"',
            f"hydra.run.dir={run}",
        ],
        tmp_path,
    )
    steps, generated = [], None
    deadline = time.monotonic() + 300
    while fit.poll() is None and time.monotonic() < deadline:
        if not (run / RunFolder.INDEX_FILE).is_file():  # no checkpoint written yet
            time.sleep(0.02)
            continue
        path, checkpoint = read_checkpoint(str(run), "outputs")  # never half a file, never a vanished one
        steps.append(checkpoint["global_step"])
        if generated is None and steps[-1] >= 10:
            generated = preloaded.Popen(
                [sys.executable, "-m", "sru_lightning", "generate", f"ckpt_path={run}", "length=20", "prompt=def "],
                cwd=tmp_path,
                env=environment(),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
    out, err = fit.communicate(timeout=300)
    assert fit.returncode == 0, err[-3000:]
    assert len(steps) >= 5 and steps == sorted(steps) and steps[0] < 150, steps
    assert generated is not None, steps
    generated_out, generated_err = generated.communicate(timeout=300)
    assert generated.returncode == 0 and generated_out.strip(), generated_err[-2000:]
