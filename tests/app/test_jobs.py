"""A run belongs to its job: a requeued SLURM job continues its own run without any setting, and
no job (a SLURM job, a sweep job) continues a run another job owns."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.tiny_run import TINY_RUN

from sru_lightning.app import cli
from sru_lightning.app.runs.folder import RunFolder

STEPS = [
    *TINY_RUN,
    "+trainer.enable_progress_bar=false",
    "trainer.max_epochs=-1",
    "trainer.limit_train_batches=null",
    "logger=none",
]


@pytest.fixture(autouse=True)
def _outside_slurm(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_NTASKS"):
        monkeypatch.delenv(name, raising=False)


def history(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "history.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_a_requeued_slurm_job_continues_its_own_run_and_no_other_job_does(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    assert cli.main(["fit", *STEPS, "trainer.max_steps=3"]) == 0
    run = tmp_path / "outputs" / "slurm-4242"
    assert RunFolder(run).latest.step == 3 and history(run)[-1]["owner"] == {"slurm_job": "4242"}
    # the job again (a requeue keeps the id), no setting: it continues from its own step 3
    assert cli.main(["fit", *STEPS, "trainer.max_steps=5"]) == 0
    assert history(run)[-1]["ckpt_step"] == 3 and RunFolder(run).latest.step == 5
    # another job with the same model and data, even with ckpt_path=last: a fresh run of its own
    monkeypatch.setenv("SLURM_JOB_ID", "4243")
    assert cli.main(["fit", *STEPS, "trainer.max_steps=2", "ckpt_path=last"]) == 0
    other = tmp_path / "outputs" / "slurm-4243"
    assert "ckpt_path" not in history(other)[-1] and RunFolder(other).latest.step == 2
    # a plain fit outside any job: ckpt_path=last does not take a job's run either
    monkeypatch.delenv("SLURM_JOB_ID")
    assert (
        cli.main(["fit", *STEPS, "trainer.max_steps=2", "ckpt_path=last", f"hydra.run.dir={tmp_path / 'local'}"]) == 0
    )
    assert "ckpt_path" not in history(tmp_path / "local")[-1]


@pytest.mark.slow
def test_a_sweep_job_with_ckpt_path_last_continues_only_its_own_folder(tmp_path):
    unrelated = tmp_path / "outputs" / "unrelated"
    assert cli.main(["fit", *STEPS, "trainer.max_steps=4", f"hydra.run.dir={unrelated}"]) == 0
    sweep = tmp_path / "sweep"
    assert (
        cli.main(
            [
                "fit",
                "-m",
                *STEPS,
                "trainer.max_steps=2",
                "model.net.dropout=0.1",
                "ckpt_path=last",
                f"hydra.sweep.dir={sweep}",
            ]
        )
        == 0
    )
    job = sweep / "0"
    assert "ckpt_path" not in history(job)[-1], "a new sweep job starts its own run"
    assert history(job)[-1]["owner"] == {"sweep_job": str(job.absolute())}
    # the same sweep continued: each job continues its own folder
    assert (
        cli.main(
            [
                "fit",
                "-m",
                *STEPS,
                "trainer.max_steps=3",
                "model.net.dropout=0.1",
                "ckpt_path=last",
                f"hydra.sweep.dir={sweep}",
            ]
        )
        == 0
    )
    assert history(job)[-1]["ckpt_step"] == 2 and Path(history(job)[-1]["ckpt_path"]).parent.parent == job.absolute()


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, "python -m sru_lightning fit a=1 hydra.run.dir=/r ckpt_path=/r"),
        (
            {
                "TORCHELASTIC_RUN_ID": "x",
                "LOCAL_WORLD_SIZE": "1",
                "WORLD_SIZE": "2",
                "MASTER_ADDR": "10.0.0.7",
                "MASTER_PORT": "29400",
            },
            "torchrun --nnodes 2 --nproc-per-node 1 --node-rank 0 --master-addr 10.0.0.7 --master-port 29400 -m "
            "sru_lightning fit a=1 hydra.run.dir=/r ckpt_path=/r (on each of the 2 nodes, with its own --node-rank)",
        ),
        (
            {"TORCHELASTIC_RUN_ID": "x", "LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "2"},
            "torchrun --nnodes 1 --nproc-per-node 2 -m sru_lightning fit a=1 hydra.run.dir=/r ckpt_path=/r",
        ),
        (
            {"SLURM_STEP_ID": "0", "SLURM_NTASKS": "2", "SLURM_NNODES": "1", "SLURM_NTASKS_PER_NODE": "2"},
            "srun --nodes 1 --ntasks-per-node 2 python -m sru_lightning fit a=1 hydra.run.dir=/r ckpt_path=/r "
            "(inside an allocation of the same size)",
        ),
    ],
)
def test_the_printed_resume_command_starts_the_run_as_it_was_launched(monkeypatch, env, expected):
    from sru_lightning.app.runs.console import resume_command

    for name in (
        "TORCHELASTIC_RUN_ID",
        "LOCAL_WORLD_SIZE",
        "WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "SLURM_STEP_ID",
        "SLURM_NTASKS",
        "SLURM_NPROCS",
        "SLURM_NNODES",
        "SLURM_NTASKS_PER_NODE",
    ):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert resume_command("fit", ["a=1", "ckpt_path=x"], Path("/r")) == expected


@pytest.mark.slow  # two tiny fits
def test_the_printed_resume_command_runs_as_printed_in_a_folder_hydra_reads_only_quoted(tmp_path, monkeypatch):
    import shlex

    from sru_lightning.app.runs.console import interruption_message

    for name in ("TORCHELASTIC_RUN_ID", "SLURM_STEP_ID"):  # a plain `python -m sru_lightning` launch
        monkeypatch.delenv(name, raising=False)
    folder = tmp_path / "runs" / "it's dir ü" / "r2 中文"
    assert cli.main(["fit", *STEPS, "trainer.max_steps=2", f'hydra.run.dir="{folder}"']) == 0
    message = interruption_message("fit", [*STEPS, "trainer.max_steps=4"], folder, 2)
    words = shlex.split(message.split("resume with: ", 1)[1])
    assert words[:4] == ["python", "-m", "sru_lightning", "fit"], message
    assert cli.main(words[3:]) == 0, message
    runs = history(folder)
    assert [record["status"] for record in runs] == ["completed", "completed"]
    assert RunFolder(folder).latest.step == 4, "the printed command continued this run"


def test_srun_with_ntasks_instead_of_ntasks_per_node_is_one_line_naming_the_fix(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_NTASKS", "2")
    monkeypatch.setenv("SLURM_JOB_NAME", "batch")
    monkeypatch.delenv("SLURM_NTASKS_PER_NODE", raising=False)
    assert cli.main(["fit", *STEPS, "trainer.max_steps=2", f"hydra.run.dir={tmp_path / 'r'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--ntasks-per-node" in err and "Traceback" not in err


@pytest.mark.slow  # starts the command in a process of its own
def test_a_scheduler_warning_before_the_run_watches_signals_does_not_kill_the_command():
    import subprocess
    import sys

    code = (
        "import os, signal\nfrom sru_lightning.app import cli\ncli.main(['--help'])\n"
        "os.kill(os.getpid(), signal.SIGUSR1)\nos.kill(os.getpid(), signal.SIGUSR2)\nprint('still here')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip().endswith("still here"), done.stderr[-2000:]
