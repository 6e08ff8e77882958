"""The job a run belongs to, under a scheduler or in a sweep.

A scheduler starts, stops and requeues a run's processes; the run must come back to itself.
Under SLURM (a batch job, `srun`, or a submitit job) a run's identity is its job: the job id,
or `<array job>_<task>` for an array task, which a requeue keeps. From it follow:

* the default run directory (`outputs/slurm-<job>`, conf/hydra/default.yaml through the
  `sru_run_dir` resolver): every rank of the job, and the job after a requeue, share it;
* `ckpt_path` left unset in such a job means `auto`: this run directory's own newest
  checkpoint, else a fresh start, never another run's;
* the run's owner, recorded in its `result.json` and checkpoints, so `ckpt_path=last` never
  continues a run that another job or sweep job owns.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from .folder import RunFolder

#: Resolver name used by conf/hydra/default.yaml for the default run directory.
RUN_DIR_RESOLVER = "sru_run_dir"


def slurm_job() -> str | None:
    """The SLURM job this process belongs to (`<array job>_<task>` for an array task), or None."""
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    if array and task:
        return f"{array}_{task}"
    return os.environ.get("SLURM_JOB_ID") or None


def default_run_dir(elsewhere: str) -> str:
    """`outputs/slurm-<job>` inside a SLURM job (shared by its ranks and kept across a requeue),
    else `elsewhere` (the timestamped default)."""
    job = slurm_job()
    return f"outputs/slurm-{job}" if job else elsewhere


def register_resolvers() -> None:
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver(RUN_DIR_RESOLVER):
        OmegaConf.register_new_resolver(RUN_DIR_RESOLVER, default_run_dir)


def attempt_owner(output_dir: Path, multirun: bool) -> dict[str, str]:
    """Who owns the run this attempt writes: its SLURM job and, in a sweep, the sweep job's folder."""
    owner = {}
    job = slurm_job()
    if job:
        owner["slurm_job"] = job
    if multirun:
        owner["sweep_job"] = str(Path(output_dir).absolute())
    return owner


def owned_elsewhere(run_owner: dict[str, Any] | None, run_dir: Path) -> str | None:
    """Why a run with `run_owner` belongs to another job than this process's, None when it does not."""
    if not run_owner:
        return None
    job = run_owner.get("slurm_job")
    if job and job != slurm_job():
        return f"it belongs to SLURM job {job}"
    sweep_job = run_owner.get("sweep_job")
    if sweep_job and Path(sweep_job) != Path(run_dir).absolute():
        return f"it belongs to the sweep job in {sweep_job}"
    if sweep_job:
        return "it belongs to a sweep job"  # a sweep job continues only its own folder
    return None


# --------------------------------------------------------------------------------------------
# a sweep's jobs
def sweep_job_order(job_dir: Path) -> tuple[int, int, str]:
    """The key that orders a sweep's job folders: the job number Hydra recorded for the job
    (`hydra.job.num` in its `.hydra/hydra.yaml`), else the folder's name when it is a number
    (Hydra's default `hydra.sweep.subdir`); folders with neither come last, by name."""
    number = _hydra_job_number(Path(job_dir))
    if number is None and Path(job_dir).name.isdigit():
        number = int(Path(job_dir).name)
    return (0, number, Path(job_dir).name) if number is not None else (1, 0, Path(job_dir).name)


def _hydra_job_number(job_dir: Path) -> int | None:
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # a sweep of many jobs reads many
    try:
        hydra_file = job_dir / RunFolder.HYDRA_DIR / RunFolder.HYDRA_FILE
        number = yaml.load(hydra_file.read_text(), Loader=loader)["hydra"]["job"]["num"]
    except (OSError, ValueError, yaml.YAMLError, KeyError, TypeError):
        return None
    return number if isinstance(number, int) and not isinstance(number, bool) else None


# --------------------------------------------------------------------------------------------
# requeue
def requeue_own_job() -> str:
    """Ask SLURM to requeue this job (after a stop on a scheduler's warning signal); what happened."""
    job = os.environ.get("SLURM_JOB_ID")
    if not job:
        return "not requeued: not a SLURM job"
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        return "not requeued: scontrol is not on PATH"
    try:
        done = subprocess.run([scontrol, "requeue", job], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"not requeued: scontrol requeue {job} failed: {error}"
    if done.returncode != 0:
        reason = (done.stderr or done.stdout).strip().splitlines()
        return f"not requeued: scontrol requeue {job}: {reason[0] if reason else f'exit status {done.returncode}'}"
    return f"requeued: SLURM job {job} will start again and continue this run"


# --------------------------------------------------------------------------------------------
# how to start the run again
def launcher_words() -> tuple[list[str], str]:
    """The words that start this run's processes again, for the printed resume command, and a
    note on where to run them: `torchrun ...` on every node for a torchrun launch, `srun ...`
    for a multi-task SLURM step, else `python -m sru_lightning` (Lightning launches the rest)."""
    env = os.environ
    if env.get("TORCHELASTIC_RUN_ID") and env.get("LOCAL_WORLD_SIZE") and env.get("WORLD_SIZE"):
        per_node = int(env["LOCAL_WORLD_SIZE"])
        nodes = max(1, int(env["WORLD_SIZE"]) // max(1, per_node))
        words = ["torchrun", "--nnodes", str(nodes), "--nproc-per-node", str(per_node)]
        note = ""
        if nodes > 1:
            words += [
                "--node-rank",
                "0",
                "--master-addr",
                env.get("MASTER_ADDR", "HOST"),
                "--master-port",
                env.get("MASTER_PORT", "29500"),
            ]
            note = f" (on each of the {nodes} nodes, with its own --node-rank)"
        return [*words, "-m", "sru_lightning"], note
    tasks = env.get("SLURM_NTASKS") or env.get("SLURM_NPROCS")
    if env.get("SLURM_STEP_ID") is not None and tasks and int(tasks) > 1:
        words = ["srun", "--nodes", env.get("SLURM_NNODES", "1")]
        per_node = env.get("SLURM_NTASKS_PER_NODE")
        words += ["--ntasks-per-node", per_node.split("(")[0]] if per_node else ["--ntasks", tasks]
        return [*words, "python", "-m", "sru_lightning"], " (inside an allocation of the same size)"
    return ["python", "-m", "sru_lightning"], ""
