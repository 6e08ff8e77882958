"""Jobs of examples/slurm_requeue.sbatch on the private test cluster, and the uninterrupted local
runs they are compared with (tests/cluster/test_preemption*.py).

Every job is the example script itself, submitted with `--chdir` a fresh directory and only the
sizes given through its environment (PYTHON, TRAINER, EXTRA_OVERRIDES, MASTER_ADDR/MASTER_PORT):
no `hydra.run.dir`, no `ckpt_path`. A job's run is `outputs/slurm-<job id>` under that directory,
and the requeued job, which keeps its id, finds it again through `ckpt_path=auto`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.distributed_fits import step_losses
from helpers.slurm_cluster import FOREIGN_ENVIRONMENT, free_ports

REPO = Path(__file__).resolve().parents[2]
HELPERS = REPO / "tests" / "helpers"
EXAMPLE = REPO / "examples" / "slurm_requeue.sbatch"
MAX_STEPS = 30
PAUSE_AT = 6
FIT = [
    "model.net.embedding_dim=16",
    "model.net.hidden_size=32",
    "model.net.num_layers=2",
    "data.batch_size=4",
    "data.seq_len=16",
    "trainer.limit_val_batches=2",
    "trainer.val_check_interval=10",
    f"trainer.max_steps={MAX_STEPS}",
    "trainer.log_every_n_steps=1",
    "+logger.csv.flush_logs_every_n_steps=1",
    "seed=7",
    "threads=1",
    "~callbacks.rich_progress_bar",
]
TRAINERS = {1: "cpu", 2: "ddp_cpu"}
TIMEOUT = 120  # for any one wait: a job that hangs fails the test instead of blocking the run
LOSS_TOLERANCE = dict(rel=1e-7, abs=0.0)
DISTRIBUTED = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "NODE_RANK",
    "PL_GLOBAL_SEED",
    "OMP_NUM_THREADS",
    "PYTHON",
    "TRAINER",
    "EXTRA_OVERRIDES",
)


def environment(base: dict[str, str]) -> dict[str, str]:
    env = {
        key: value for key, value in base.items() if key not in DISTRIBUTED and not key.startswith(FOREIGN_ENVIRONMENT)
    }
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), str(HELPERS), base.get("PYTHONPATH")]))
    env["OMP_NUM_THREADS"] = "1"
    return env


# --------------------------------------------------------------------------------------------
# the uninterrupted runs, local, started once per module in the background
class Reference:
    def __init__(self, root: Path, tasks: int) -> None:
        self.run_dir = root / f"reference-{tasks}"
        command = [
            sys.executable,
            "-m",
            "sru_lightning",
            "fit",
            f"trainer={TRAINERS[tasks]}",
            f"trainer.devices={tasks}",
            *FIT,
            f"hydra.run.dir={self.run_dir}",
        ]
        self.log = root / f"reference-{tasks}.out"
        self.process = subprocess.Popen(
            command,
            cwd=root,
            env=environment(dict(os.environ)),
            stdin=subprocess.DEVNULL,
            stdout=open(self.log, "w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._losses: dict[int, float] | None = None

    def losses(self) -> dict[int, float]:
        if self._losses is None:
            try:
                returncode = self.process.wait(timeout=TIMEOUT)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, 9)
                returncode = self.process.wait()
            assert returncode == 0, self.log.read_text()[-3000:]
            self._losses = step_losses(self.run_dir)
            assert sorted(self._losses) == list(range(MAX_STEPS)), self._losses
        return self._losses

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, 9)
            self.process.wait()


# --------------------------------------------------------------------------------------------
# jobs
class Job:
    """One submission of the example script, in `workdir`."""

    def __init__(self, cluster, workdir: Path, tasks: int, *extra: str, sbatch: tuple[str, ...] = ()) -> None:
        self.cluster, self.workdir, self.tasks = cluster, workdir, tasks
        workdir.mkdir(parents=True, exist_ok=True)
        env = environment(cluster.env)
        env["SLURM_CONF"] = cluster.env["SLURM_CONF"]
        env.update(
            PYTHON=sys.executable,
            TRAINER=TRAINERS[tasks],
            EXTRA_OVERRIDES=" ".join([*FIT, *extra]),
            # The node's name resolves nowhere here; the port is a free one, kept by the requeue.
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(free_ports(1)[0]),
        )
        self.submitted = time.monotonic()
        self.id = cluster.sbatch(
            EXAMPLE,
            f"--chdir={workdir}",
            f"--output={workdir}/job-%j.out",
            f"--ntasks-per-node={tasks}",
            *sbatch,
            env=env,
        )

    @property
    def run_dir(self) -> Path:
        return self.workdir / "outputs" / f"slurm-{self.id}"

    @property
    def output(self) -> str:
        path = self.workdir / f"job-{self.id}.out"
        return path.read_text(errors="replace") if path.exists() else "(no output yet)"

    def field(self, name: str) -> str | None:
        fields = self.cluster.job(self.id)
        return None if fields is None else fields.get(name)

    def wait_for(self, marker: Path) -> None:
        """Until `marker` exists (the fit is held there); fail if the job ends first."""
        deadline = time.monotonic() + TIMEOUT
        while not marker.exists():
            state = self.field("JobState")
            assert state in ("PENDING", "RUNNING", "CONFIGURING"), f"job {self.id} is {state}:\n{self.output[-3000:]}"
            assert time.monotonic() < deadline, f"job {self.id} never reached {marker.name}:\n{self.output[-3000:]}"
            time.sleep(0.1)

    def finish(self) -> float:
        """Wait until the job has ended for good; assert it completed; the seconds since submission."""
        state = self.cluster.wait(self.id, timeout=TIMEOUT)
        assert state == "COMPLETED", f"job {self.id} {state}:\n{self.output[-4000:]}"
        return time.monotonic() - self.submitted

    def history(self) -> list[dict]:
        return [json.loads(line) for line in (self.run_dir / "history.jsonl").read_text().splitlines()]

    def result(self) -> dict:
        return json.loads((self.run_dir / "result.json").read_text())


def pause(marker: Path) -> list[str]:
    return [
        "+callbacks.pause._target_=pause_for_signal.PauseForSignal",
        f"+callbacks.pause.at_step={PAUSE_AT}",
        f"+callbacks.pause.marker={marker}",
    ]


def assert_continued_exactly(job: Job, reference: Reference, stop_signal: str, requeue_asked: bool) -> None:
    """The job was stopped once, requeued, and completed its run in its own directory with the
    uninterrupted run's losses; its history says so."""
    assert sorted(os.listdir(job.workdir / "outputs")) == [f"slurm-{job.id}"]
    assert job.field("Restarts") == "1", job.cluster.job(job.id)
    attempts = [line for line in job.output.splitlines() if line.startswith("sru-fit: job")]
    assert [line.split(" on ")[0] for line in attempts] == [
        f"sru-fit: job {job.id} attempt 1",
        f"sru-fit: job {job.id} attempt 2",
    ], job.output[-3000:]

    stopped, completed = job.history()
    assert stopped["status"] == "interrupted", stopped
    assert stop_signal in stopped["error"], stopped
    assert stopped["owner"] == {"slurm_job": str(job.id)}
    assert 0 < stopped["optimizer_steps"] < MAX_STEPS
    if requeue_asked:
        assert stopped["requeue"] == "asked", stopped
    else:
        assert "requeue" not in stopped, stopped  # SLURM requeues by itself
    assert completed["status"] == "completed", completed
    assert completed["optimizer_steps"] == MAX_STEPS
    assert completed["ckpt_step"] == stopped["optimizer_steps"], (stopped, completed)
    # continued from the stop's own checkpoint in its own directory (removed once the run completed)
    assert completed["ckpt_path"] == str(job.run_dir / "checkpoints" / "interrupted.ckpt"), completed
    assert job.result() == completed

    assert_losses_equal(job, reference)


def assert_losses_equal(job: Job, reference: Reference) -> None:
    """The job's per-step training losses are the uninterrupted run's."""
    expected, got = reference.losses(), step_losses(job.run_dir)
    assert sorted(got) == sorted(expected), (sorted(got), sorted(expected))
    differing = {
        step: (got[step], expected[step])
        for step in expected
        if got[step] != pytest.approx(expected[step], **LOSS_TOLERANCE)
    }
    assert not differing, f"train_loss differs at {len(differing)} steps (requeued job, uninterrupted): {differing}"
