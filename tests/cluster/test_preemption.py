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

A requeued job waits about cred_expire + 1 s (6 s on this cluster) before it may run again,
which is most of each test's time.
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

pytestmark = [pytest.mark.slow, pytest.mark.slurm]

REPO = Path(__file__).resolve().parents[2]
HELPERS = REPO / "tests" / "helpers"
EXAMPLE = REPO / "examples" / "slurm_requeue.sbatch"
MAX_STEPS = 30
PAUSE_AT = 6
FIT = [
    "model.embedding_dim=16",
    "model.hidden_size=32",
    "model.num_layers=2",
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


def _environment(base: dict[str, str]) -> dict[str, str]:
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
            env=_environment(dict(os.environ)),
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


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    root = tmp_path_factory.mktemp("references")
    started = {tasks: Reference(root, tasks) for tasks in TRAINERS}
    yield started
    for reference in started.values():
        reference.stop()


# --------------------------------------------------------------------------------------------
# jobs
class Job:
    """One submission of the example script, in `workdir`."""

    def __init__(self, cluster, workdir: Path, tasks: int, *extra: str, sbatch: tuple[str, ...] = ()) -> None:
        self.cluster, self.workdir, self.tasks = cluster, workdir, tasks
        workdir.mkdir(parents=True, exist_ok=True)
        env = _environment(cluster.env)
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

    expected, got = reference.losses(), step_losses(job.run_dir)
    assert sorted(got) == sorted(expected), (sorted(got), sorted(expected))
    differing = {
        step: (got[step], expected[step])
        for step in expected
        if got[step] != pytest.approx(expected[step], **LOSS_TOLERANCE)
    }
    assert not differing, f"train_loss differs at {len(differing)} steps (requeued job, uninterrupted): {differing}"


# --------------------------------------------------------------------------------------------
# 1. SIGUSR1 (the `--signal=USR1@90` warning, or an admin's `scancel --signal=USR1`): the run
#    stops, asks for its own requeue and continues; 4. a second job starts its own run.
@pytest.mark.parametrize("tasks", [1, 2], ids=["one_process", "ddp_2_ranks"])
def test_sigusr1_requeues_and_continues_the_same_run(slurm_cluster, references, tmp_path, tasks):
    marker = tmp_path / "paused"
    job = Job(slurm_cluster, tmp_path, tasks, *pause(marker))
    job.wait_for(marker)
    slurm_cluster.scancel(job.id, "--signal=USR1")
    seconds = job.finish()
    assert_continued_exactly(job, references[tasks], "SIGUSR1", requeue_asked=True)
    if tasks == 2:  # both ranks of each attempt were ranks of one srun step
        assert job.output.count("GLOBAL_RANK: 1, MEMBER: 2/2") == 2, job.output[-3000:]
    print(f"{tasks} task(s): stopped, requeued and completed in {seconds:.1f} s")

    # 4. The same script submitted again is a new job: a run of its own from step 0, never
    #    the first job's checkpoint, which stays as it was. (Once: the choice of checkpoint is
    #    made before any process group exists, the same for one process as for two.)
    if tasks == 2:
        return
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
# 5. SIGUSR1 at different moments of a 2-rank step: every stop ends, requeues and completes.
#    Each moment costs a requeue (~50 s on a 2-core machine): by default the two that take
#    different ways out, a stop agreed in the middle of a training step and one agreed during a
#    fit's validation (which finishes first); SRU_PREEMPTION_ALL_MOMENTS=1 adds the optimizer step
#    and the checkpoint save (all four passed when this was written).
MOMENTS = [("on_before_backward", 4), ("on_validation_batch_start", 10)]
if os.environ.get("SRU_PREEMPTION_ALL_MOMENTS") == "1":
    MOMENTS += [("on_before_optimizer_step", 7), ("on_save_checkpoint", 10)]


@pytest.mark.parametrize("hook, at_step", MOMENTS)
def test_sigusr1_at_any_moment_never_hangs(slurm_cluster, references, tmp_path, hook, at_step):
    prefix = "+callbacks.signal_once"
    job = Job(
        slurm_cluster,
        tmp_path,
        2,
        f"{prefix}._target_=pause_for_signal.SignalOnce",
        f"{prefix}.marker={tmp_path / 'signalled'}",
        f"{prefix}.hook={hook}",
        f"{prefix}.target=group",
        f"{prefix}.signum=10",
        f"{prefix}.at_step={at_step}",
    )
    seconds = job.finish()
    assert (tmp_path / "signalled").exists(), job.output[-3000:]
    assert_continued_exactly(job, references[2], "SIGUSR1", requeue_asked=True)
    print(f"{hook}: stopped, requeued and completed in {seconds:.1f} s")


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
    env = _environment(slurm_cluster.env)
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
