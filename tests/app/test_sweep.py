"""Multirun sweeps: one directory per job, failures isolated, a summary table at the end."""

from __future__ import annotations

import csv
import json

import pytest
from helpers.tiny_run import TINY_RUN

from sru_lightning.app import cli, sweep
from sru_lightning.app.runs import directories
from sru_lightning.app.runs.folder import RunFolder
from sru_lightning.app.summary_table import write_summary
from sru_lightning.app.sweep import collect_results, record_lost_job

TINY = TINY_RUN


def read_csv(path):
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


@pytest.mark.slow
def test_precision_sweep_runs_both_jobs_and_writes_a_summary(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    sweep_dir = tmp_path / "sweep"
    status = cli.main(["fit", "-m", "trainer.precision=32-true,bf16-true", *TINY, f"hydra.sweep.dir={sweep_dir}"])
    assert status == 0
    for job in ("0", "1"):
        record = json.loads((sweep_dir / job / "result.json").read_text())
        assert record["status"] == "completed"
        assert (sweep_dir / job / "checkpoints" / "last.ckpt").is_file()
    rows = read_csv(sweep_dir / "summary.csv")
    assert [row["overrides"].split()[0] for row in rows] == ["trainer.precision=32-true", "trainer.precision=bf16-true"]
    assert all(row["status"] == "completed" and float(row["val_bpc"]) > 0 for row in rows)
    markdown = (sweep_dir / "summary.md").read_text()
    assert (
        "| job | status | overrides | val_bpc |" in markdown.replace(" val_ppl |", "").split("\n")[2]
        or "val_bpc" in markdown
    )
    assert "2 of 2 jobs completed." in markdown
    assert "2 of 2 jobs completed." in capsys.readouterr().out


@pytest.mark.slow
def test_a_failing_job_does_not_stop_the_others(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    sweep_dir = tmp_path / "sweep"
    status = cli.main(["fit", "--multirun", "model.net.rnn=gru,sru", *TINY, f"hydra.sweep.dir={sweep_dir}"])
    assert status == 1  # the sweep reports its failure...
    rows = {row["job"]: row for row in read_csv(sweep_dir / "summary.csv")}
    assert rows["0"]["status"] == "failed" and "`rnn` must be one of" in rows["0"]["error"]
    assert rows["1"]["status"] == "completed" and float(rows["1"]["val_bpc"]) > 0  # ...after running the rest
    assert "1 of 2 runs did not complete" in capsys.readouterr().err


def test_summary_lists_jobs_that_died_without_a_result(tmp_path):
    for job, overrides in (("0", ["lr=1"]), ("1", ["lr=2"]), ("10", ["lr=3"])):
        (tmp_path / job / ".hydra").mkdir(parents=True)
        (tmp_path / job / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    RunFolder(tmp_path / "0").write_result(
        {
            "status": "completed",
            "overrides": ["lr=1"],
            "metrics": {"val_bpc": 2.5, "zeta": 1.0},
            "optimizer_steps": 40,
            "tokens_per_second": 1234.5,
            "wall_seconds": 9.5,
        },
    )
    RunFolder(tmp_path / "10").write_result(
        {"status": "failed", "overrides": ["lr=3"], "error": "ValueError: bad\nmore"}
    )
    rows = collect_results(tmp_path)
    assert [row["job"] for row in rows] == ["0", "1", "10"]  # numeric order
    assert [row["status"] for row in rows] == ["completed", "missing", "failed"]
    markdown, table = write_summary(tmp_path, rows)
    lines = read_csv(table)
    assert list(lines[0]) == [
        "job",
        "status",
        "overrides",
        "val_bpc",
        "zeta",
        "optimizer_steps",
        "tokens_per_second",
        "wall_seconds",
        "error",
    ]
    assert lines[0]["tokens_per_second"] == "1234.5" and lines[0]["wall_seconds"] == "9.5"  # every digit
    assert lines[1]["overrides"] == "lr=2" and lines[1]["val_bpc"] == "" and lines[1]["tokens_per_second"] == ""
    assert lines[2]["error"] == "ValueError: bad"
    assert "1 of 3 jobs completed." in markdown.read_text()


def test_a_job_record_of_another_format_is_listed_as_unreadable(tmp_path):
    (tmp_path / "0").mkdir()
    (tmp_path / "0" / "result.json").write_text(json.dumps({"status": "completed", "overrides": ["lr=1"]}))
    RunFolder(tmp_path / "1").write_result({"status": "completed", "overrides": ["lr=2"]})
    (tmp_path / "1" / "history.jsonl").write_text(json.dumps({"status": "completed", "format_version": 2}) + "\n")
    rows = collect_results(tmp_path)
    assert [row["status"] for row in rows] == ["unreadable", "unreadable"]
    assert rows[0]["error"] == (
        f"cannot read the run record {str(tmp_path / '0' / 'result.json')!r}: its format version is none, "
        "expected 1 (it was written by an earlier sru_lightning)"
    )
    assert str(tmp_path / "1" / "history.jsonl") in rows[1]["error"] and "version is 2, expected 1" in rows[1]["error"]


def test_summary_lists_jobs_their_launcher_gave_up_on_as_lost(tmp_path):
    # 0: lost before it started (no folder of its own); 1: lost while its run was running;
    # 2: the scheduler's SIGTERM interrupted the run, then the job died; 3: completed, then the
    # job died before it returned: the run's own outcome stands.
    for job, status in (("1", "running"), ("2", "interrupted"), ("3", "completed")):
        RunFolder(tmp_path / job).write_result(
            {
                "status": status,
                "overrides": [f"lr={job}"],
                **({"error": "stopped by SIGTERM"} if status == "interrupted" else {}),
            },
        )
    for job in "0123":
        record_lost_job(
            tmp_path / job, [f"lr={job}"], f"SLURM job 7_{job} ended (CANCELLED) without a result", f"7_{job}"
        )
    rows = collect_results(tmp_path)
    assert [(row["job"], row["status"], row["overrides"]) for row in rows] == [
        ("0", "lost", "lr=0"),
        ("1", "lost", "lr=1"),
        ("2", "lost", "lr=2"),
        ("3", "completed", "lr=3"),
    ]
    assert rows[0]["error"] == "SLURM job 7_0 ended (CANCELLED) without a result"
    assert rows[1]["error"] == "SLURM job 7_1 ended (CANCELLED) without a result; the run was running"
    assert rows[2]["error"] == (
        "SLURM job 7_2 ended (CANCELLED) without a result; the run was interrupted: stopped by SIGTERM"
    )


def test_the_summary_hands_the_jobs_that_did_not_complete_to_the_command(tmp_path, capsys):
    from omegaconf import OmegaConf

    from sru_lightning.app.sweep import SweepIncomplete, SweepSummary

    RunFolder(tmp_path / "0").write_result({"status": "completed", "overrides": ["lr=1"], "metrics": {"val_bpc": 2.5}})
    RunFolder(tmp_path / "1").write_result(
        {"status": "failed", "overrides": ["lr=2"], "error": "ValueError: bad\nmore"}
    )
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}})
    with pytest.raises(SweepIncomplete) as ended:
        SweepSummary().on_multirun_end(config)
    assert ended.value.code == 1 and ended.value.total == 2
    assert [(row["job"], row["status"]) for row in ended.value.rows] == [("1", "failed")]
    assert sweep.report_incomplete(ended.value) == 1
    err = capsys.readouterr().err
    assert "job 1 failed: ValueError: bad\n" in err and "1 of 2 runs did not complete" in err
    RunFolder(tmp_path / "1").write_result({"status": "completed", "overrides": ["lr=2"], "metrics": {"val_bpc": 2.0}})
    SweepSummary().on_multirun_end(config)  # every job completed: the command goes on to status 0
    assert "2 of 2 jobs completed." in capsys.readouterr().out


def test_a_sweeps_jobs_are_ordered_by_hydras_job_numbers(tmp_path):
    """Folders named by `hydra.sweep.subdir=${hydra.job.override_dirname}` come in the order the
    sweep ran them (was: by name, lr=0.01 first), in the summary and in the refusal that lists them."""
    for name, number in (("lr=1", 0), ("lr=0.1", 1), ("lr=0.01", 2), ("lr=0.001", 10)):
        (tmp_path / name / ".hydra").mkdir(parents=True)
        (tmp_path / name / ".hydra" / "hydra.yaml").write_text(f"hydra:\n  job:\n    num: {number}\n")
        (tmp_path / name / ".hydra" / "overrides.yaml").write_text(f"- {name}\n")
    (tmp_path / "9" / ".hydra").mkdir(parents=True)  # no record of its number: its folder's name
    (tmp_path / "9" / ".hydra" / "overrides.yaml").write_text("- lr=9\n")
    order = ["lr=1", "lr=0.1", "lr=0.01", "9", "lr=0.001"]
    assert [row["job"] for row in collect_results(tmp_path)] == order
    assert directories.earlier_jobs(tmp_path) == order


@pytest.mark.parametrize(
    "sweeper, launcher, by_a_plugin",
    [
        ("hydra._internal.core_plugins.basic_sweeper.BasicSweeper", "basic_launcher.BasicLauncher", False),
        ("hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper", "basic_launcher.BasicLauncher", True),
        ("hydra._internal.core_plugins.basic_sweeper.BasicSweeper", "hydra_plugins.joblib.JoblibLauncher", True),
    ],
)
def test_a_sweep_run_by_a_plugin_is_told_from_its_config(tmp_path, sweeper, launcher, by_a_plugin):
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    from sru_lightning.app.runs.context import RunContext, activated
    from sru_lightning.app.sweep import SweepSummary

    launcher = launcher if launcher.startswith("hydra_plugins") else "hydra._internal.core_plugins." + launcher
    hydra_node = {
        "mode": RunMode.MULTIRUN,
        "sweep": {"dir": str(tmp_path)},
        "sweeper": {"_target_": sweeper},
        "launcher": {"_target_": launcher},
    }
    config = OmegaConf.create({"hydra": hydra_node})
    assert sweep.sweeper_counts_failures(config.hydra) is ("optuna" in sweeper)
    context = RunContext("fit", ("-m",))
    assert not sweep.ended_by_a_plugin(context)  # no sweep under way
    with activated(context):  # as the CLI runs Hydra: its callbacks record into the command's context
        SweepSummary().on_multirun_start(config)
    assert sweep.ended_by_a_plugin(context) is by_a_plugin
    sweep.summarise_stopped_sweep(context)
    assert not sweep.ended_by_a_plugin(context)
    config.hydra.mode = RunMode.RUN  # a single run never counts as a failed trial
    assert not sweep.sweeper_counts_failures(config.hydra)


@pytest.mark.slow
def test_a_continued_sweep_job_refused_shows_its_own_attempt_in_the_summary(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sweep_dir = tmp_path / "sweep"
    assert cli.main(["fit", "-m", "model.net.dropout=0.0", *TINY, f"hydra.sweep.dir={sweep_dir}"]) == 0
    first = json.loads((sweep_dir / "0" / "result.json").read_text())
    # continuing the job with a data change its checkpoint cannot follow: refused
    assert (
        cli.main(
            [
                "fit",
                "-m",
                "model.net.dropout=0.0",
                *TINY,
                "data.seq_len=8",
                "ckpt_path=last",
                f"hydra.sweep.dir={sweep_dir}",
            ]
        )
        == 1
    )
    assert json.loads((sweep_dir / "0" / "result.json").read_text()) == first, "the run's outcome stays its own"
    [row] = read_csv(sweep_dir / "summary.csv")
    assert (
        row["status"] == "failed"
        and "data.seq_len=8" in row["overrides"]
        and "`data.seq_len` cannot change" in row["error"]
    )


@pytest.mark.slow
def test_a_sweep_stopped_by_sigterm_in_a_job_summarises_and_continues_with_the_printed_command(
    tmp_path, monkeypatch, capsys
):
    """SIGTERM (or Ctrl+C) in the second of three jobs stops the sweep: its summary still lists
    the first job, completed, and the second, interrupted, and says the sweep was stopped; the
    printed command continues it, each job from its own folder."""
    import shlex
    import signal

    monkeypatch.chdir(tmp_path)
    sweep_dir = tmp_path / "sweep"
    signal_at = [
        "+callbacks.send_signal._target_=helpers.signal_sender.SendSignal",
        "+callbacks.send_signal.hook=on_train_batch_start",
        "+callbacks.send_signal.target=rank0",
        f"+callbacks.send_signal.signum={int(signal.SIGTERM)}",
    ]
    # the signal fires at step 1 of the second job only (each job trains 3 steps)
    sweep = [*TINY, "+trainer.enable_progress_bar=false", f"hydra.sweep.dir={sweep_dir}"]
    assert cli.main(["fit", "-m", *sweep, *signal_at, "+callbacks.send_signal.at_step=99,1,98"]) == 1
    out = capsys.readouterr().out
    rows = read_csv(sweep_dir / "summary.csv")
    assert [(row["job"], row["status"]) for row in rows] == [("0", "completed"), ("1", "interrupted")]
    markdown = (sweep_dir / "summary.md").read_text()
    assert "1 of 2 jobs completed." in markdown and "The sweep was stopped" in markdown
    assert not (sweep_dir / "2").exists()
    stopped_at = json.loads((sweep_dir / "1" / "result.json").read_text())["optimizer_steps"]
    assert 0 < stopped_at < 3

    (line,) = [line for line in out.splitlines() if line.startswith("the sweep was stopped; continue it")]
    printed = shlex.split(line.split(" with: ", 1)[1])
    assert printed[:4] == ["python", "-m", "sru_lightning", "fit"] and printed[-1] == "ckpt_path=auto"
    # run as printed, with the test's signal moved past the end of every job
    assert "+callbacks.send_signal.at_step=99,1,98" in printed
    again = [word.replace("at_step=99,1,98", "at_step=99,99,99") for word in printed[3:]]
    assert cli.main(again) == 0, capsys.readouterr().err[-3000:]
    rows = read_csv(sweep_dir / "summary.csv")
    assert [(row["job"], row["status"]) for row in rows] == [("0", "completed"), ("1", "completed"), ("2", "completed")]
    continued = json.loads((sweep_dir / "1" / "result.json").read_text())
    assert continued["ckpt_step"] == stopped_at and continued["optimizer_steps"] == 3
