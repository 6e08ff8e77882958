"""A scheduler stops and requeues a fit; the requeued job continues the same run exactly.

Every job here is examples/slurm_requeue.sbatch itself, submitted to the private cluster with
`--chdir` a fresh directory and only the sizes given through its environment (PYTHON,
TRAINER, EXTRA_OVERRIDES, MASTER_ADDR/MASTER_PORT): no `hydra.run.dir`, no `ckpt_path`. A
job's run is `outputs/slurm-<job id>` under that directory, and the requeued job, which keeps
its id, finds it again through `ckpt_path=auto`.

The fits take well under a second for all their steps, so a test that stops one from outside
holds it at a chosen step (helpers/pause_for_signal.PauseForSignal) and then signals the job
through SLURM. Each finished run is compared with the same fit run locally without any stop:
the per-step training losses are equal (within one float32 ulp, as in tests/app/test_signals.py),
and the run's history records the stopped attempt, then the completed one.

A requeued job waits about cred_expire + 1 s (6 s on this cluster) before it may run again;
the rest of a test's time is the start-up of each attempt's interpreters. The stops at several
moments of a 2-rank step are in test_preemption_moments.py, so the two files run side by side.
"""

from __future__ import annotations

import os
import sys
import time

import pytest
from helpers.distributed_fits import step_losses
from helpers.requeue_jobs import (
    LOSS_TOLERANCE,
    TIMEOUT,
    Job,
    assert_continued_exactly,
    environment,
    pause,
)

pytestmark = [pytest.mark.slow, pytest.mark.slurm]
REFERENCE_TASKS = (1,)  # one process; the 2-rank jobs are test_preemption_moments.py's


# --------------------------------------------------------------------------------------------
# 1. SIGUSR1 (the `--signal=USR1@90` warning, or an admin's `scancel --signal=USR1`): the run
#    stops, asks for its own requeue and continues; 4. a second job starts its own run. (A 2-rank
#    job stopped by SIGUSR1 is test_preemption_moments.py's, ten times over.)
def test_sigusr1_requeues_and_continues_the_same_run(slurm_cluster, references, tmp_path):
    tasks = 1
    marker = tmp_path / "paused"
    job = Job(slurm_cluster, tmp_path, tasks, *pause(marker))
    job.wait_for(marker)
    slurm_cluster.scancel(job.id, "--signal=USR1")
    seconds = job.finish()
    assert_continued_exactly(job, references[tasks], "SIGUSR1", requeue_asked=True)
    print(f"{tasks} task(s): stopped, requeued and completed in {seconds:.1f} s")

    # 4. The same script submitted again is a new job: a run of its own from step 0, never
    #    the first job's checkpoint, which stays as it was. (Once: the choice of checkpoint is
    #    made before any process group exists, the same for one process as for two.)
    before = (job.run_dir / "history.jsonl").read_bytes()
    fresh = Job(slurm_cluster, tmp_path, tasks)
    fresh.finish()
    assert sorted(os.listdir(tmp_path / "outputs")) == sorted([f"slurm-{job.id}", f"slurm-{fresh.id}"])
    (only,) = fresh.history()
    assert only["status"] == "completed" and "ckpt_path" not in only, only
    assert only["owner"] == {"slurm_job": str(fresh.id)}
    assert step_losses(fresh.run_dir) == pytest.approx(references[tasks].losses(), **LOSS_TOLERANCE)
    assert (job.run_dir / "history.jsonl").read_bytes() == before


# --------------------------------------------------------------------------------------------
# 2. `scontrol requeue <job>`: SLURM sends SIGTERM and requeues the job itself.
def test_scontrol_requeue_continues_from_the_interruption_checkpoint(slurm_cluster, references, tmp_path):
    marker = tmp_path / "paused"
    job = Job(slurm_cluster, tmp_path, 1, *pause(marker))
    job.wait_for(marker)
    done = slurm_cluster.run(["scontrol", "requeue", str(job.id)])
    assert done.returncode == 0, done.stderr
    job.finish()
    assert_continued_exactly(job, references[1], "SIGTERM", requeue_asked=False)


# --------------------------------------------------------------------------------------------
# 3. A job of the higher-priority partition preempts it (PreemptMode=REQUEUE: SIGTERM, requeue).
def test_partition_preemption_requeues_and_continues(slurm_cluster, references, tmp_path):
    marker = tmp_path / "paused"
    job = Job(slurm_cluster, tmp_path, 1, *pause(marker), sbatch=("--exclusive",))
    job.wait_for(marker)
    urgent = slurm_cluster.sbatch(
        "#!/bin/bash\ntrue\n",
        "--partition=urgent",
        "--exclusive",
        f"--chdir={tmp_path}",
        f"--output={tmp_path}/urgent-%j.out",
    )
    assert slurm_cluster.wait(urgent, timeout=TIMEOUT) == "COMPLETED"
    job.finish()
    assert_continued_exactly(job, references[1], "SIGTERM", requeue_asked=False)


# --------------------------------------------------------------------------------------------
# 6. A scheduler's warning before training started (imports, data, the rendezvous): nothing to
#    save, but the job still asks to be requeued, so the run is not lost with the job.
EARLY_WARNING_JOB = """#!/bin/bash
if [ "${SLURM_RESTART_COUNT:-0}" != 0 ]; then echo "second attempt"; exit 0; fi
exec "$PYTHON" - "$MARKER" <<'PY'
import pathlib, sys, time
from sru_lightning.app.signal_watch import SignalWatch
SignalWatch().start()  # as the command line does first, long before the fit starts
pathlib.Path(sys.argv[1]).touch()
time.sleep(120)
PY
"""


def test_a_warning_signal_before_training_requeues_the_job(slurm_cluster, tmp_path):
    marker = tmp_path / "watching"
    env = environment(slurm_cluster.env)
    env.update(SLURM_CONF=slurm_cluster.env["SLURM_CONF"], PYTHON=sys.executable, MARKER=str(marker))
    job = slurm_cluster.sbatch(
        EARLY_WARNING_JOB,
        "--requeue",
        "--open-mode=append",
        f"--chdir={tmp_path}",
        f"--output={tmp_path}/job.out",
        env=env,
    )
    deadline = time.monotonic() + TIMEOUT
    while not marker.exists():
        assert slurm_cluster.job_state(job) in ("PENDING", "RUNNING", "CONFIGURING"), (tmp_path / "job.out").read_text()
        assert time.monotonic() < deadline
        time.sleep(0.1)
    slurm_cluster.scancel(job, "--batch", "--signal=USR1")
    assert slurm_cluster.wait(job, timeout=TIMEOUT) == "COMPLETED"
    output = (tmp_path / "job.out").read_text()
    assert "received SIGUSR1 before training started; exiting (nothing to save yet); requeued: " in output, output
    assert output.rstrip().endswith("second attempt"), output
    assert slurm_cluster.job(job)["Restarts"] == "1"
