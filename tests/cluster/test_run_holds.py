"""One run per folder under SLURM (sru_lightning/app/runs/hold.py): two jobs into one folder, and
the rule for a hold taken on another node of a shared file system, asked of the real cluster."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.requeue_jobs import environment

from sru_lightning.app.runs.folder import RunFolder

pytestmark = [pytest.mark.slow, pytest.mark.slurm]

FIT = ["fit", "debug=tiny", "trainer.max_epochs=-1", "trainer.limit_train_batches=null", "threads=1", "logger=none"]


def cluster_environment(cluster) -> dict[str, str]:
    return {**environment(cluster.env), "SLURM_CONF": cluster.env["SLURM_CONF"]}


def fit_job(cluster, folder: Path, run: Path, steps: int, name: str, extra: tuple[str, ...] | list[str] = ()) -> int:
    words = " ".join(
        [sys.executable, "-m", "sru_lightning", *FIT, f"trainer.max_steps={steps}", f"hydra.run.dir={run}", *extra]
    )
    return cluster.sbatch(
        f"#!/bin/bash\nexec {words}\n",
        f"--chdir={folder}",
        f"--output={folder}/{name}-%j.out",
        f"--job-name={name}",
        env=cluster_environment(cluster),
    )


def wait_for_hold(run: Path, job: int, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            record = json.loads((run / RunFolder.HOLD_FILE).read_text())
        except (OSError, ValueError):
            record = None
        if record and record.get("slurm_job") == str(job):
            return record
        time.sleep(0.2)
    raise AssertionError(f"job {job} took no hold of {run}")


def local_fit(cluster, folder: Path, run: Path) -> subprocess.CompletedProcess:
    """A fit from outside the cluster's jobs (as from a login node), able to ask SLURM."""
    return subprocess.run(
        [sys.executable, "-m", "sru_lightning", *FIT, "trainer.max_steps=3", f"hydra.run.dir={run}"],
        cwd=folder,
        env=cluster_environment(cluster),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_two_jobs_into_one_folder_and_a_hold_from_another_node(slurm_cluster, tmp_path):
    run = tmp_path / "run"
    # The first job writes no checkpoint, so that the fit taking its folder over below is a new run.
    first = fit_job(
        slurm_cluster, tmp_path, run, steps=100_000, name="first", extra=["+trainer.enable_checkpointing=false"]
    )
    assert slurm_cluster.wait(first, states={"RUNNING"}, timeout=60) == "RUNNING"
    held = wait_for_hold(run, first)

    # A second job into the folder: refused in one line naming the first job, exit status 2.
    second = fit_job(slurm_cluster, tmp_path, run, steps=3, name="second")
    assert slurm_cluster.wait(second, timeout=180) == "FAILED"
    assert slurm_cluster.job(second)["ExitCode"] == "2:0"
    output = next(tmp_path.glob(f"second-{second}.out")).read_text()
    refusals = [line for line in output.splitlines() if "error:" in line]
    assert len(refusals) == 1 and f"SLURM job {first}" in refusals[0] and "Traceback" not in output
    assert json.loads((run / RunFolder.HOLD_FILE).read_text())["token"] == held["token"]

    # The hold as a node of a shared file system would have written it: the rule is SLURM's
    # word on the job, whatever its heartbeat says.
    elsewhere = {**held, "host": "another-node"}
    (run / RunFolder.HOLD_FILE).write_text(json.dumps(elsewhere))
    stale = time.time() - 3600
    os.utime(run / RunFolder.HOLD_FILE, (stale, stale))
    refused = local_fit(slurm_cluster, tmp_path, run)
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert "on host another-node, started" in refused.stderr and f"SLURM job {first}" in refused.stderr

    # The first job dies without giving the folder back (SIGKILL): SLURM says it ended, and the
    # next fit takes the folder over with a line saying whose hold it was.
    os.kill(held["pid"], signal.SIGKILL)  # as on a lost node: no chance to give anything back
    state = slurm_cluster.wait(first, timeout=120)
    assert state in ("CANCELLED", "FAILED"), state
    assert (run / RunFolder.HOLD_FILE).exists()  # left behind by the killed process
    taken = local_fit(slurm_cluster, tmp_path, run)
    assert taken.returncode == 0, taken.stderr[-3000:]
    notes = [line for line in taken.stderr.splitlines() if "took over the hold" in line]
    assert len(notes) == 1 and f"SLURM job {first} is {state}" in notes[0] and "another-node" in notes[0]
    assert not (run / RunFolder.HOLD_FILE).exists()
