"""A 2-rank DDP fit launched by SLURM (`srun` inside an sbatch job, Lightning's SLURM
environment) trains exactly like the same fit started locally (`trainer=ddp_cpu`, Lightning's
own launcher), bit for bit, and writes only into its run directory.

The job runs a real interpreter (slurmstepd starts it: no fork server) with the venv's python
by absolute path, in a working directory of its own, with one thread per rank in both runs.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.distributed_fits import result, step_losses
from helpers.slurm_cluster import FOREIGN_ENVIRONMENT, free_ports
from helpers.tiny_run import TINY_RUN

pytestmark = [pytest.mark.slow, pytest.mark.slurm]

REPO = Path(__file__).resolve().parents[2]
FIT = [
    "fit",
    "trainer=ddp_cpu",
    "trainer.accelerator=cpu",
    "trainer.devices=2",
    "threads=1",
    *TINY_RUN,
    "trainer.log_every_n_steps=1",
    "seed=7",
]
TIMEOUT = 240


def fit_environment(base: dict[str, str]) -> dict[str, str]:
    """`base` with the working tree's package first on the path, one thread per process, and no
    distributed settings left over from whoever runs the tests."""
    env = {
        key: value
        for key, value in base.items()
        if key
        not in (
            "MASTER_ADDR",
            "MASTER_PORT",
            "WORLD_SIZE",
            "RANK",
            "LOCAL_RANK",
            "NODE_RANK",
            "PL_GLOBAL_SEED",
            "OMP_NUM_THREADS",
        )
    }
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), base.get("PYTHONPATH")]))
    env["OMP_NUM_THREADS"] = "1"
    return env


def job_script(run_dir: Path, port: int) -> str:
    command = shlex.join([sys.executable, "-m", "sru_lightning", *FIT, f"hydra.run.dir={run_dir}"])
    return (
        "#!/bin/bash\n"
        "#SBATCH --nodes=1\n"
        "#SBATCH --ntasks-per-node=2\n"
        "set -e\n"
        # Lightning takes rank 0's address from SLURM_NODELIST: this cluster's node name is its
        # own and resolves nowhere (on a real cluster it does). The port is a free one, not
        # Lightning's 15000 + job id, which two test runs' clusters would share.
        f"export MASTER_ADDR=127.0.0.1 MASTER_PORT={port} OMP_NUM_THREADS=1\n"
        f"srun --ntasks-per-node=2 {command}\n"
    )


def run_local(command: list[str], **options) -> tuple[int | None, str]:
    """Run `command` in a session of its own (a real interpreter); on timeout kill the session,
    Lightning's rank 1 with it. Its exit status (None: timed out) and output."""
    process = subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        **options,
    )
    try:
        output = process.communicate(timeout=TIMEOUT)[0]
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        return None, process.communicate()[0] + f"\n(killed after {TIMEOUT} s)"
    return process.returncode, output


def test_ddp_under_srun_equals_local(slurm_cluster, tmp_path):
    job_cwd, local_cwd = tmp_path / "job_cwd", tmp_path / "local_cwd"
    job_cwd.mkdir()
    local_cwd.mkdir()
    srun_run, local_run = tmp_path / "srun_run", tmp_path / "local_run"

    job = slurm_cluster.sbatch(
        job_script(srun_run, free_ports(1)[0]),
        f"--chdir={job_cwd}",
        f"--output={tmp_path}/job-%j.out",
        env=fit_environment(slurm_cluster.env),
    )
    local_env = fit_environment(
        {key: value for key, value in os.environ.items() if not key.startswith(FOREIGN_ENVIRONMENT)}
    )
    returncode, output = run_local(
        [sys.executable, "-m", "sru_lightning", *FIT, f"hydra.run.dir={local_run}"], cwd=local_cwd, env=local_env
    )
    assert returncode == 0, output[-3000:]
    state = slurm_cluster.wait(job, timeout=TIMEOUT)
    job_output = (tmp_path / f"job-{job}.out").read_text()
    assert state == "COMPLETED", f"job {job} {state}:\n{job_output[-3000:]}"
    # Two ranks of one process group, both started by srun (had Lightning not taken them for
    # SLURM tasks, each would have launched a rank of its own: four lines).
    assert sorted(re.findall(r"Initializing distributed: (GLOBAL_RANK: \d, MEMBER: \d/\d)", job_output)) == [
        "GLOBAL_RANK: 0, MEMBER: 1/2",
        "GLOBAL_RANK: 1, MEMBER: 2/2",
    ]

    expected, got = step_losses(local_run), step_losses(srun_run)
    assert sorted(expected) == sorted(got) == [0, 1, 2], (expected, got)
    differing = {step: (got[step], expected[step]) for step in expected if got[step] != expected[step]}
    assert not differing, f"train_loss differs at {len(differing)} of {len(expected)} steps (srun, local): {differing}"
    assert result(srun_run)["status"] == result(local_run)["status"] == "completed"
    assert result(srun_run)["metrics"] == result(local_run)["metrics"]
    # and every other logged value (learning rates, validation, epoch means), byte for byte
    assert (srun_run / "csv" / "metrics.csv").read_bytes() == (local_run / "csv" / "metrics.csv").read_bytes()

    # Nothing outside the run directories: no outputs/ (Hydra's default run directory) or
    # lightning_logs/ in either working directory, and the same files in both runs but one:
    # Lightning's launcher starts rank 1 with Hydra's job name `train_ddp_process_1`, so its log
    # has a file of its own; under srun both ranks are started alike and log into
    # sru_lightning.log (and both write the same .hydra/*.yaml).
    assert sorted(os.listdir(job_cwd)) == sorted(os.listdir(local_cwd)) == []
    assert sorted(os.listdir(tmp_path)) == sorted(["job_cwd", "local_cwd", "srun_run", "local_run", f"job-{job}.out"])
    assert _tree(srun_run) == [name for name in _tree(local_run) if name != "train_ddp_process_1.log"]
    assert (srun_run / ".hydra" / "config.yaml").read_text() == (local_run / ".hydra" / "config.yaml").read_text()


def _tree(run_dir: Path) -> list[str]:
    return sorted(str(path.relative_to(run_dir)) for path in run_dir.rglob("*"))
