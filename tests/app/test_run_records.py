"""What a run leaves behind can be trusted: a refused attempt changes nothing, evaluation data
means what it meant in training, result.json describes the whole run, and the console says
each thing once."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.tiny_run import TINY_RUN

from sru_lightning.app import cli, sweep
from sru_lightning.app.runs.checkpoints import CHECKPOINT_NAME
from sru_lightning.app.runs.folder import RunFolder

TINY = [*TINY_RUN, "+trainer.enable_progress_bar=false"]
REPO = Path(__file__).resolve().parents[2]


def fit(*overrides: str) -> int:
    return cli.main(["fit", *TINY, *overrides])


def digests(folder: Path) -> dict[str, str]:
    """Every file under `folder` (hidden ones included) and its content's digest."""
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def result_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "result.json").read_text())


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


# --------------------------------------------------------------------------------------------
# nothing a user had is changed
@pytest.mark.slow
def test_a_refused_or_mismatched_attempt_leaves_the_run_directory_byte_for_byte(tmp_path, capsys):
    run = tmp_path / "run"
    assert fit(f"hydra.run.dir={run}") == 0
    before = digests(run)
    assert ".hydra/config.yaml" in before and "sru_lightning.log" in before
    # a fresh fit into it, and a continuation with another model size: both refused
    assert fit(f"hydra.run.dir={run}", "trainer.max_steps=3", "data.seq_len=8") == 2
    assert fit(f"hydra.run.dir={run}", "ckpt_path=last", "model.net.hidden_size=24") == 2
    assert digests(run) == before
    err = capsys.readouterr().err
    assert "already holds checkpoints of an earlier run" in err and "model.net.hidden_size=16" in err
    assert "pass ckpt_path=auto to continue that run" in err
    # the run's own record still describes it: evaluating it needs no overrides
    assert (
        cli.main(["validate", f"ckpt_path={run}", "trainer.limit_val_batches=2", f"hydra.run.dir={tmp_path / 'check'}"])
        == 0
    )


@pytest.mark.slow
def test_a_usage_error_in_a_new_directory_leaves_no_directory(tmp_path):
    attempt = tmp_path / "attempt"
    assert fit(f"hydra.run.dir={attempt}", "trainer.max_epochs=0") == 2
    assert not attempt.exists()


@pytest.mark.slow
def test_a_sweep_into_an_earlier_sweeps_folder_is_refused_before_it_writes(tmp_path, capsys):
    sweep_dir = tmp_path / "sweep"
    assert cli.main(["fit", "-m", "model.net.dropout=0.0", *TINY, f"hydra.sweep.dir={sweep_dir}"]) == 0
    before = digests(sweep_dir)
    capsys.readouterr()
    assert cli.main(["fit", "-m", "model.net.dropout=0.0,0.1", *TINY, f"hydra.sweep.dir={sweep_dir}"]) == 2
    out, err = capsys.readouterr()
    assert "holds the jobs of an earlier sweep (0)" in err and "Traceback" not in out + err
    assert digests(sweep_dir) == before  # summary.md still describes the sweep that ran
    # the advice works: each job continues its own folder
    assert "pass ckpt_path=auto to continue those jobs" in err
    assert (
        cli.main(
            [
                "fit",
                "-m",
                "model.net.dropout=0.0",
                *TINY,
                "trainer.max_epochs=2",
                "ckpt_path=auto",
                f"hydra.sweep.dir={sweep_dir}",
            ]
        )
        == 0
    )
    record = json.loads((sweep_dir / "0" / "result.json").read_text())
    assert record["status"] == "completed" and record["ckpt_step"] > 0, record


def test_a_summary_lists_only_the_jobs_this_sweep_started(tmp_path):
    """Which jobs a sweep ran is told by what it wrote into their folders, not by clocks: on a
    file system whose clock is an hour behind this machine's, this sweep's jobs were left out of
    its summary (and one an hour ahead would have joined it)."""
    import os
    import time

    from sru_lightning.app.sweep import collect_results, job_records

    def start_job(job: str, stamp: float) -> None:
        (tmp_path / job / ".hydra").mkdir(parents=True, exist_ok=True)
        (tmp_path / job / ".hydra" / "overrides.yaml").write_text(f"- lr={job}\n")
        RunFolder(tmp_path / job).write_result(
            {"status": "completed", "overrides": [f"lr={job}"], "metrics": {"val_bpc": 1.0}}
        )
        for path in (tmp_path / job / ".hydra" / "overrides.yaml", tmp_path / job / "result.json"):
            os.utime(path, (stamp, stamp))

    for job in ("0", "1"):  # an earlier sweep, its clock an hour ahead
        start_job(job, time.time() + 3600)
    before = job_records(tmp_path)
    for job in ("0", "2"):  # this sweep continues job 0 and adds job 2, its clock an hour behind
        start_job(job, time.time() - 3600)
    assert [row["job"] for row in collect_results(tmp_path, before)] == ["0", "2"]
    assert [row["job"] for row in collect_results(tmp_path)] == ["0", "1", "2"]


def test_summaries_print_integers_as_integers_and_overrides_as_typed(tmp_path):
    from sru_lightning.app.summary_table import write_summary
    from sru_lightning.app.sweep import collect_results

    (tmp_path / "0").mkdir()
    RunFolder(tmp_path / "0").write_result(
        {
            "status": "completed",
            "overrides": ["data.path=my notes.txt", "~callbacks.x"],
            "metrics": {"val_bpc": 2.5, "epoch": 3.0},
            "optimizer_steps": 40,
            "tokens_per_second": 1234.56,
            "wall_seconds": 9.54,
        },
    )
    write_summary(tmp_path, collect_results(tmp_path))
    line = (tmp_path / "summary.md").read_text().splitlines()[4]
    assert "| 'data.path=my notes.txt' '~callbacks.x' |" in line
    assert "| 2.5000 |" in line and "| 3 |" in line and "| 40 | 1235 | 9.5 |" in line


def test_summaries_keep_small_and_large_numbers_meaningful(tmp_path):
    """A learning rate of 2.9e-05 read 0.0000 in both tables; the CSV now holds every digit,
    the markdown at least four significant ones."""
    import csv

    from sru_lightning.app.summary_table import write_summary
    from sru_lightning.app.sweep import collect_results

    metrics = {
        "lr": 2.9e-05,
        "val_bpc": 1.234567891,
        "grad_norm": 0.012345678,
        "val_ppl": 3.5e18,
        "tiny": -7.25e-09,
        "epoch": 3.0,
        "steps": 40,
    }
    (tmp_path / "0").mkdir()
    RunFolder(tmp_path / "0").write_result(
        {
            "status": "completed",
            "overrides": ["model.optimizer.lr=2.9e-05"],
            "metrics": metrics,
            "optimizer_steps": 40,
            "tokens_per_second": 1234.56,
            "wall_seconds": 0.04,
        },
    )
    markdown, table = write_summary(tmp_path, collect_results(tmp_path))
    with open(table, newline="") as handle:
        (row,) = list(csv.DictReader(handle))
    for name, value in metrics.items():
        assert float(row[name]) == value, f"{name}: {row[name]!r} is not {value!r}"
    assert row["epoch"] == "3" and row["steps"] == "40" and row["optimizer_steps"] == "40"
    assert row["lr"] == "2.9e-05" and row["tokens_per_second"] == "1234.56" and row["wall_seconds"] == "0.04"

    header, _, line = markdown.read_text().splitlines()[2:5]
    shown = dict(
        zip([c.strip() for c in header.strip("|").split("|")], [c.strip() for c in line.strip("|").split("|")])
    )
    assert shown["lr"] == "2.9e-05" and shown["tiny"] == "-7.25e-09"
    assert shown["val_bpc"] == "1.2346" and shown["grad_norm"] == "0.01235"
    assert shown["val_ppl"] == "3.5e+18" and shown["epoch"] == "3" and shown["steps"] == "40"
    assert shown["optimizer_steps"] == "40" and shown["tokens_per_second"] == "1235" and shown["wall_seconds"] == "0.04"


def test_sweep_jobs_keep_the_overrides_as_the_user_typed_them():
    typed = ["model.net.rnn=sru,lstm", "~callbacks.rich_progress_bar", "+trainer.enable_progress_bar=false"]
    job = ["model.net.rnn=lstm", "~callbacks.rich_progress_bar=null", "+trainer.enable_progress_bar=False"]
    assert sweep.as_typed(job, typed) == ["model.net.rnn=lstm", *typed[1:]]


# --------------------------------------------------------------------------------------------
# no silent wrong number
@pytest.mark.slow
def test_evaluation_data_is_encoded_with_the_checkpoints_vocabulary(tmp_path, capsys):
    letters, others = "abcdefghij \n", "klmnopqrst \n"
    train_text = tmp_path / "a.txt"
    train_text.write_text("".join(letters[(i * 7) % 12] for i in range(12000)))
    shuffled = tmp_path / "c.txt"  # the same characters in another order: another own vocabulary
    shuffled.write_text("j" * 5000 + "".join(letters[(i * 5) % 12] for i in range(12000)))
    foreign = tmp_path / "b.txt"  # as many characters, none of them in the checkpoint's vocabulary
    foreign.write_text("".join(others[(i * 7) % 12] for i in range(12000)))
    data = ["data=text", "data.batch_size=4", "data.seq_len=16"]
    run = tmp_path / "run"
    assert fit(*data, f"data.path={train_text}", f"hydra.run.dir={run}") == 0
    trained = result_of(run)["metrics"]["val_bpc"]
    capsys.readouterr()
    evaluate = ["validate", f"ckpt_path={run}", *data, "trainer.limit_val_batches=2"]
    assert cli.main([*evaluate, f"data.path={foreign}", f"hydra.run.dir={tmp_path / 'b'}"]) == 2
    assert "not in the checkpoint's vocabulary of 12 characters" in capsys.readouterr().err
    assert cli.main([*evaluate, f"data.path={train_text}", f"hydra.run.dir={tmp_path / 'a'}"]) == 0
    assert result_of(tmp_path / "a")["metrics"]["val_bpc"] == pytest.approx(trained, abs=1e-6)


def test_unknown_words_count_as_the_unknown_word(tmp_path):
    from sru_lightning.data import TextDataModule, TokenCodec
    from sru_lightning.data.tokens import END_OF_LINE

    (tmp_path / "words.txt").write_text("the cat sat on the mat\n" * 400 + "a dog ran far away\n" * 10)
    module = TextDataModule(path=str(tmp_path / "words.txt"), level="word", batch_size=2, seq_len=4)
    codec = TokenCodec("word", ["<unk>", END_OF_LINE, "the", "cat", "sat", "on", "mat"], unknown="<unk>")
    unknown = module.adopt_vocabulary(codec)
    assert unknown == 5 * 10
    assert module.vocab_size == 7 and module.codec.itos == codec.itos


@pytest.mark.slow
def test_result_json_keeps_the_training_metrics_through_the_final_validation(tmp_path, capsys):
    run = tmp_path / "run"
    # no validation inside the fit (every second epoch of one): the CLI validates the final weights
    assert fit("trainer.check_val_every_n_epoch=2", f"hydra.run.dir={run}") == 0
    assert "Validating the final weights" in capsys.readouterr().out
    metrics = result_of(run)["metrics"]
    assert "val_bpc" in metrics and "train_bpc_epoch" in metrics and "train_loss" in metrics


@pytest.mark.slow
def test_a_mid_epoch_resume_names_its_partial_epoch_and_a_finished_run_is_not_called_unvalidated(tmp_path, capsys):
    run = tmp_path / "run"
    steps = ["trainer.limit_train_batches=6", f"hydra.run.dir={run}"]
    assert fit("trainer.max_steps=3", *steps) == 0
    assert "train_bpc_epoch" in result_of(run)["metrics"]
    assert fit("trainer.max_steps=5", "ckpt_path=last", *steps) == 0
    metrics = result_of(run)["metrics"]
    assert "train_bpc_since_resume" in metrics and "train_bpc_epoch" not in metrics
    capsys.readouterr()
    assert fit("trainer.max_steps=5", "ckpt_path=last", *steps) == 0
    out = capsys.readouterr().out
    assert "never ran" not in out and "the fit resumed at step 5 and trained no further" in out
    assert out.count("SRU recurrence precision") == 1, "the final validation does not print the table again"


# --------------------------------------------------------------------------------------------
# readable errors and a quiet console
@pytest.mark.slow
def test_zero_step_settings_are_usage_errors(tmp_path, capsys):
    for setting in ("trainer.limit_train_batches=0", "trainer.max_epochs=0", "trainer.max_steps=0"):
        assert fit(setting, f"hydra.run.dir={tmp_path / 'zero'}") == 2
        assert setting.split("=")[0] in capsys.readouterr().err


@pytest.mark.slow
def test_checkpointing_off_runs_and_writes_no_checkpoint(tmp_path):
    run = tmp_path / "run"
    assert fit("+trainer.enable_checkpointing=false", f"hydra.run.dir={run}") == 0
    assert not (run / "checkpoints" / CHECKPOINT_NAME).exists()
    assert result_of(run)["status"] == "completed"


@pytest.mark.slow
def test_an_lstm_run_does_not_warn_about_sru_layers_and_a_resume_is_announced_once(tmp_path, capsys):
    runs = tmp_path / "outputs"
    assert fit("model=lstm", f"hydra.run.dir={runs / 'first'}") == 0
    out = capsys.readouterr().out
    assert "holds no SRU layer" not in out
    assert fit("model=lstm", "ckpt_path=last", "trainer.max_epochs=2", f"hydra.run.dir={runs / 'second'}") == 0
    out = capsys.readouterr().out
    assert out.count("resuming from") == 1


def test_bench_says_an_error_once():
    from sru_lightning.diagnostics.op_bench import error_line

    assert error_line(RuntimeError("RuntimeError: no kernel")) == "RuntimeError: no kernel"
    assert error_line(RuntimeError("frames\nRuntimeError: RuntimeError: no kernel")) == "RuntimeError: no kernel"


def test_bench_checks_the_plot_path_before_it_measures(monkeypatch, capsys):
    from sru_lightning.diagnostics import bench, op_bench

    def must_not_run(*args, **kwargs):
        raise AssertionError("the benchmark ran before `plot` was checked")

    monkeypatch.setattr(op_bench, "run_benchmark", must_not_run)
    assert bench.main(["plot=/no/such/dir/x.png"]) == 2
    assert "`plot` must be a file in an existing folder" in capsys.readouterr().err


def _shell(command: str) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        ["bash", "-c", f"set -o pipefail; {command}"], capture_output=True, text=True, env=env, timeout=120
    )


@pytest.mark.slow  # starts a process
def test_help_into_a_closed_pipe_is_quiet():
    done = _shell(f"{sys.executable} -m sru_lightning --help | head -1")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout.startswith("usage:")


@pytest.mark.slow  # starts a process
def test_output_to_a_full_device_is_one_line():
    if not Path("/dev/full").exists():
        pytest.skip("needs /dev/full (Linux) to fill the output")
    done = _shell(f"{sys.executable} -m sru_lightning --help > /dev/full")
    assert done.returncode == 1
    assert done.stderr.strip() == "python -m sru_lightning: error: cannot write the output: No space left on device"


def test_a_failed_attempt_keeps_the_runs_config_and_its_own_beside_it(tmp_path):
    from sru_lightning.app.runs import directories
    from sru_lightning.app.runs.context import RunContext

    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    for name in RunFolder.HYDRA_FILES:
        (run / ".hydra" / name).write_text(f"the run's {name}\n")
    context = RunContext("fit")
    context.found.directory = directories.DirectorySnapshot.take(run, ".hydra")  # what the guard records
    for name in RunFolder.HYDRA_FILES:  # what Hydra writes for the attempt
        (run / ".hydra" / name).write_text(f"the attempt's {name}\n")
    beside = directories.keep_config_beside(context, run)
    assert beside is not None and beside.parent == run / ".hydra" and beside.name.startswith("attempt-")
    for name in RunFolder.HYDRA_FILES:
        assert (run / ".hydra" / name).read_text() == f"the run's {name}\n"
        assert (beside / name).read_text() == f"the attempt's {name}\n"
