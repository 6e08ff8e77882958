"""The private SLURM cluster itself (helpers/slurm_cluster.py): it runs batch jobs and job
steps, reports how jobs end, and leaves nothing running when it stops."""

from __future__ import annotations

import os
import time

import pytest
from helpers.slurm_cluster import SlurmCluster, cluster_processes, unavailable

pytestmark = [pytest.mark.slow, pytest.mark.slurm]


def test_batch_job_and_two_task_step(slurm_cluster, tmp_path):
    job = slurm_cluster.sbatch(
        "#!/bin/bash\n"
        "#SBATCH --ntasks=2\n"
        'echo "batch $SLURM_JOB_ID on $SLURMD_NODENAME in $PWD"\n'
        "srun -N1 -n2 bash -c 'echo \"task $SLURM_PROCID of $SLURM_NTASKS\"'\n",
        f"--chdir={tmp_path}",
        f"--output={tmp_path}/%j.out",
    )
    assert slurm_cluster.wait(job, timeout=60) == "COMPLETED"
    record = slurm_cluster.job(job)
    assert record["ExitCode"] == "0:0" and record["NodeList"] == slurm_cluster.node
    lines = (tmp_path / f"{job}.out").read_text().splitlines()
    assert lines[0] == f"batch {job} on {slurm_cluster.node} in {tmp_path}"
    assert sorted(lines[1:]) == ["task 0 of 2", "task 1 of 2"]

    # A step of its own allocation, straight from the test: `srun -N1 -n2 hostname`.
    step = slurm_cluster.run(["srun", "-N1", "-n2", "hostname"], cwd=tmp_path)
    assert step.returncode == 0, step.stderr
    assert step.stdout.splitlines() == [os.uname().nodename] * 2


def test_job_states(slurm_cluster, tmp_path):
    options = (f"--chdir={tmp_path}", f"--output={tmp_path}/%j.out")
    failing = slurm_cluster.sbatch("#!/bin/bash\nexit 3\n", *options)
    sleeping = slurm_cluster.sbatch("#!/bin/bash\nsleep 300\n", *options)
    assert slurm_cluster.wait(failing, timeout=60) == "FAILED"
    assert slurm_cluster.job(failing)["ExitCode"] == "3:0"
    assert slurm_cluster.wait(sleeping, states={"RUNNING"}, timeout=60) == "RUNNING"
    slurm_cluster.scancel(sleeping)
    assert slurm_cluster.wait(sleeping, timeout=60) == "CANCELLED"
    assert slurm_cluster.job_state(10**6) is None  # a job the controller never had


def test_partitions(slurm_cluster):
    listed = slurm_cluster.run(["sinfo", "--noheader", "--format=%P %a %D %N"]).stdout.split("\n")
    assert listed[:2] == [
        f"debug* up 1 {slurm_cluster.node}",
        f"urgent up 1 {slurm_cluster.node}",
    ]  # debug: the default
    tiers = {}
    for name in ("debug", "urgent"):
        shown = slurm_cluster.run(["scontrol", "--oneliner", "show", "partition", name]).stdout
        tiers[name] = int(shown.split("PriorityTier=")[1].split()[0])
    assert tiers["urgent"] > tiers["debug"]  # urgent jobs preempt (requeue) debug jobs


def test_stop_leaves_nothing_running():
    if unavailable():
        pytest.skip(unavailable())
    cluster = SlurmCluster().start()
    try:
        job = cluster.sbatch("#!/bin/bash\ntrap '' TERM\nsleep 300 & sleep 300\n", f"--chdir={cluster.root}")
        assert cluster.wait(job, states={"RUNNING"}, timeout=60) == "RUNNING"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            running = cluster_processes(cluster.root)  # daemons, watcher, slurmstepd, bash, sleep, sleep
            if sum(command.startswith("sleep 300") for command in running.values()) == 2:
                break
            time.sleep(0.05)
        assert any(command.startswith("slurmstepd") for command in running.values()), running
        assert any(command.startswith("sleep 300") for command in running.values()), running
    finally:
        started = time.monotonic()
        cluster.stop()  # the job ignores SIGTERM: stop() does not wait the 30 s of KillWait
    assert time.monotonic() - started < 10
    assert cluster_processes(cluster.root) == {}
    assert not cluster.root.exists()
    assert all(not os.path.exists(f"/proc/{pid}") or _zombie(pid) for pid in running)


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True
