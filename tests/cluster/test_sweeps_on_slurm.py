"""Sweeps on a real (private, one-node) SLURM cluster through `hydra/launcher=slurm`: the CLI runs
as a subprocess with the cluster's SLURM_CONF, submitit submits each job as a task of a job
array, and the sweep ends with a true summary.

The cluster has no accounting (no sacct), as many small clusters: submitit alone would wait
forever for a job cancelled before it could return its result. The sweep's lost-job watchdog
(sru_lightning/app/sweep_watchdog.py) asks squeue instead and closes such a job as `lost`.
"""

from __future__ import annotations

import csv
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.distributed_fits import step_losses
from helpers.requeue_jobs import FIT, LOSS_TOLERANCE, MAX_STEPS, PAUSE_AT, pause
from helpers.tiny_run import TINY_RUN

pytestmark = [pytest.mark.slow, pytest.mark.slurm]

REPO = Path(__file__).resolve().parents[2]
# The cluster's one node has the machine's cores; a job asks for one and no memory.
LAUNCHER = [
    "hydra/launcher=slurm",
    "hydra.launcher.partition=debug",
    "hydra.launcher.cpus_per_task=1",
    "hydra.launcher.mem_gb=null",
    "hydra.launcher.timeout_min=15",
]
TIMEOUT = 180


def sweep_environment(cluster) -> dict[str, str]:
    env = cluster.env
    # tests/helpers too: a job may hold at a step (pause_for_signal) for a test to signal it
    helpers = str(REPO / "tests" / "helpers")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), helpers, env.get("PYTHONPATH")]))
    env["OMP_NUM_THREADS"] = "1"
    env.pop("HYDRA_FULL_ERROR", None)
    return env


def start_sweep(cluster, tmp_path: Path, sweep: list[str]) -> subprocess.Popen:
    # The swept keys last: TINY_RUN's own trainer.max_epochs=1 must not override them.
    command = [
        sys.executable,
        "-m",
        "sru_lightning",
        "fit",
        "-m",
        *LAUNCHER,
        "threads=1",
        *TINY_RUN,
        *sweep,
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
    ]
    return subprocess.Popen(
        command,
        cwd=tmp_path,
        env=sweep_environment(cluster),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def finish(process: subprocess.Popen, timeout: float = TIMEOUT) -> tuple[int | None, str, str]:
    """The sweep's exit status (None: killed after `timeout`), stdout and stderr."""
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        return None, out, err + f"\n(killed after {timeout} s)"
    return process.returncode, out, err


def summary(sweep_dir: Path) -> list[dict[str, str]]:
    with open(sweep_dir / "summary.csv", newline="") as handle:
        return list(csv.DictReader(handle))


def array_tasks(sweep_dir: Path) -> dict[int, str]:
    """{job number: SLURM id `<array>_<task>`} of the jobs submitit submitted (its job folders)."""
    found = {}
    for folder in (sweep_dir / ".submitit").glob("*_*"):
        if (folder / f"{folder.name}_submitted.pkl").exists():
            found[int(folder.name.split("_")[1])] = folder.name
    return found


def test_a_two_job_sweep_completes_with_a_true_summary(slurm_cluster, tmp_path):
    started = time.monotonic()
    returncode, out, err = finish(start_sweep(slurm_cluster, tmp_path, ["model.net.dropout=0.0,0.1"]))
    assert returncode == 0, (out + err)[-4000:]
    rows = summary(tmp_path / "sweep")
    assert [row["job"] for row in rows] == ["0", "1"]
    assert [row["status"] for row in rows] == ["completed", "completed"], rows
    assert "model.net.dropout=0.0" in shlex.split(rows[0]["overrides"]), rows[0]
    assert "model.net.dropout=0.1" in shlex.split(rows[1]["overrides"]), rows[1]
    assert all(math.isfinite(float(row["val_bpc"])) for row in rows), rows
    assert "2 of 2 jobs completed." in (tmp_path / "sweep" / "summary.md").read_text()
    # Both ran as tasks of one SLURM array and returned their results through submitit.
    assert sorted(array_tasks(tmp_path / "sweep")) == [0, 1]
    print(f"two-job sweep: {time.monotonic() - started:.1f} s")


def test_b_a_cancelled_job_is_lost_and_the_sweep_still_ends(slurm_cluster, tmp_path):
    sweep_dir = tmp_path / "sweep"
    # Job 0 is the tiny run; job 1 would train for hours: it is cancelled while it runs.
    process = start_sweep(slurm_cluster, tmp_path, ["trainer.max_epochs=1,100000"])
    cancelled = None
    try:
        deadline = time.monotonic() + TIMEOUT
        while cancelled is None and time.monotonic() < deadline and process.poll() is None:
            tasks = array_tasks(sweep_dir)
            if (
                1 in tasks
                and (sweep_dir / "1" / ".hydra" / "overrides.yaml").exists()
                and slurm_cluster.job_state(int(tasks[1].split("_")[0])) is not None
                and _task_state(slurm_cluster, tasks[1]) == "RUNNING"
            ):
                time.sleep(1.0)  # into its fit
                done = slurm_cluster.run(["scancel", tasks[1]], timeout=30)
                assert done.returncode == 0, done.stderr
                cancelled = time.monotonic()
            time.sleep(0.2)
        assert cancelled is not None, "job 1 never ran: " + "".join(finish(process, 1)[1:])[-4000:]
        returncode, out, err = finish(process)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        for task in array_tasks(sweep_dir).values():
            slurm_cluster.run(["scancel", task], timeout=30)
    ended_after = time.monotonic() - cancelled
    print(f"sweep ended {ended_after:.1f} s after scancel")
    assert returncode is not None, (out + err)[-4000:]
    assert ended_after < 60, ended_after

    rows = summary(sweep_dir)
    assert [(row["job"], row["status"]) for row in rows] == [("0", "completed"), ("1", "lost")], rows
    assert "trainer.max_epochs=1" in shlex.split(rows[0]["overrides"]), rows[0]
    assert "trainer.max_epochs=100000" in shlex.split(rows[1]["overrides"]), rows[1]
    assert math.isfinite(float(rows[0]["val_bpc"]))
    slurm_id = array_tasks(sweep_dir)[1]
    assert rows[1]["error"].startswith(f"SLURM job {slurm_id} ended (CANCELLED) without a result"), rows[1]
    assert "1 of 2 jobs completed." in (sweep_dir / "summary.md").read_text()
    assert json.loads((sweep_dir / "1" / "lost.json").read_text())["slurm_job"] == slurm_id

    # Exit status 1, one line per job that did not complete, then the count.
    assert returncode == 1, (out + err)[-4000:]
    lines = [line for line in err.splitlines() if line.startswith("python -m sru_lightning: ")]
    assert lines[-2].startswith(f"python -m sru_lightning: job 1 lost: SLURM job {slurm_id} ended (CANCELLED)"), lines
    assert lines[-1] == "python -m sru_lightning: 1 of 2 runs did not complete; see the summary above", lines
    assert not any(line.startswith("python -m sru_lightning: job 0") for line in lines), lines


def _task_state(cluster, task: str) -> str | None:
    done = cluster.run(
        ["squeue", "--noheader", "--array", "--states=all", "--format=%i|%T", f"--jobs={task.split('_')[0]}"],
        timeout=15,
    )
    states = dict(line.strip().split("|", 1) for line in done.stdout.splitlines() if "|" in line)
    return states.get(task)


def test_c_a_job_preempted_by_submitit_usr2_is_requeued_and_continues_its_own_folder(slurm_cluster, tmp_path):
    """SLURM's warning before a time limit or preemption of a submitit job (`--signal=USR2@...`,
    sent here with `scancel --signal=USR2`): the run stops at a batch boundary with a checkpoint,
    the job is requeued, and the requeued job continues the sweep job's own folder with the
    per-step losses of an uninterrupted run; the summary says completed."""
    sweep_dir, marker = tmp_path / "sweep", tmp_path / "paused"
    # Long enough to hold at step PAUSE_AT: the sizes of the requeue tests (helpers/requeue_jobs.py).
    fit = [
        "model.net.dropout=0.0",
        "trainer.limit_train_batches=null",
        "trainer.max_epochs=null",
        *(override for override in FIT if not override.startswith("~")),
    ]
    reference_dir = tmp_path / "reference"
    reference = subprocess.Popen(
        [sys.executable, "-m", "sru_lightning", "fit", "threads=1", *TINY_RUN, *fit, f"hydra.run.dir={reference_dir}"],
        cwd=tmp_path,
        env=sweep_environment(slurm_cluster),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    process = start_sweep(slurm_cluster, tmp_path, [*fit, *pause(marker)])
    try:
        deadline = time.monotonic() + TIMEOUT
        while not marker.exists():
            assert process.poll() is None and time.monotonic() < deadline, "".join(finish(process, 1)[1:])[-4000:]
            time.sleep(0.1)
        # a sweep of one job is one SLURM job, not an array: its submitit folder is its id
        (job,) = [path.name for path in (sweep_dir / ".submitit").glob("*") if path.name.isdigit()]
        done = slurm_cluster.run(["scancel", "--signal=USR2", job], timeout=30)
        assert done.returncode == 0, done.stderr
        returncode, out, err = finish(process)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        for path in (sweep_dir / ".submitit").glob("*"):
            slurm_cluster.run(["scancel", path.name], timeout=30)
    assert returncode == 0, (out + err)[-4000:]
    (row,) = summary(sweep_dir)
    assert row["status"] == "completed" and math.isfinite(float(row["val_bpc"])), row

    run_dir = sweep_dir / "0"
    stopped, completed = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]
    assert stopped["status"] == "interrupted" and "SIGUSR2" in stopped["error"], stopped
    assert stopped["requeue"] == "asked" and stopped["optimizer_steps"] == PAUSE_AT, stopped
    assert completed["status"] == "completed" and completed["ckpt_step"] == PAUSE_AT, completed
    assert completed["owner"] == stopped["owner"], (stopped, completed)  # the same job, requeued
    assert sorted(os.listdir(sweep_dir)) == sorted(["0", ".submitit", "multirun.yaml", "summary.md", "summary.csv"])

    assert reference.wait(timeout=TIMEOUT) == 0, reference.stderr.read()[-3000:]
    expected = step_losses(reference_dir)
    assert sorted(expected) == list(range(MAX_STEPS)), expected
    assert step_losses(run_dir) == pytest.approx(expected, **LOSS_TOLERANCE)
