"""A run the package owns: its newest checkpoint, its config and its record never disagree.

Each test is one way a user moves, copies, resumes or evaluates a run; the checks are on what
the next command really used (the step inside the checkpoint it loaded, the number it printed,
the files it left)."""

from __future__ import annotations

import csv
import hashlib
import json
import os
import random
import shutil
import signal
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import hypothesis
import pytest
import torch
from helpers.tiny_run import TINY_RUN
from hypothesis import strategies as st

from sru_lightning.app import cli
from sru_lightning.app.runs.ckpt_path import model_checkpoint, named_checkpoint
from sru_lightning.app.runs.folder import RunFolder
from sru_lightning.models.checkpoint_format import FORMAT_KEY, FORMAT_VERSION

# Steps, not epochs, bound these fits: each resume trains two more.
STEPS = [
    *TINY_RUN,
    "+trainer.enable_progress_bar=false",
    "trainer.max_epochs=-1",
    "trainer.limit_train_batches=null",
    "trainer.val_check_interval=2",
    "trainer.log_every_n_steps=1",
]


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def fit(run: Path, max_steps: int, *extra: str) -> int:
    return cli.main(["fit", *STEPS, f"trainer.max_steps={max_steps}", f"hydra.run.dir={run}", *extra])


def resume(run: Path, max_steps: int, *extra: str) -> int:
    return fit(run, max_steps, f"ckpt_path={run}", *extra)


def stop_by_sigterm(at_step: int) -> list[str]:
    """The settings that stop a fit by SIGTERM (to this process) at `at_step`: interrupted.ckpt is written."""
    return [
        "+callbacks.send_signal._target_=helpers.signal_sender.SendSignal",
        "+callbacks.send_signal.hook=on_train_batch_start",
        "+callbacks.send_signal.target=rank0",
        f"+callbacks.send_signal.signum={int(signal.SIGTERM)}",
        f"+callbacks.send_signal.at_step={at_step}",
    ]


def interrupted_resume(run: Path, max_steps: int, at_step: int) -> int:
    """Resume, then stop by SIGTERM at `at_step`."""
    return resume(run, max_steps, *stop_by_sigterm(at_step))


def result_of(run: Path) -> dict:
    return json.loads((run / "result.json").read_text())


def history_of(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "history.jsonl").read_text().splitlines()]


def logged_steps(run: Path) -> list[int]:
    """The training steps metrics.csv holds a train_loss for (one row per logged step)."""
    with open(next(run.glob("csv/**/metrics.csv"))) as handle:
        steps = [int(row["step"]) for row in csv.DictReader(handle) if row.get("train_loss")]
    assert steps, "no training step was logged"
    return steps


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


V1 = {FORMAT_KEY: FORMAT_VERSION}


def fake_checkpoint(path: Path, step: int, written: float) -> None:
    torch.save({"global_step": step, "state_dict": {}, **V1}, path)
    os.utime(path, (written, written))


# --------------------------------------------------------------------------------------------
# the newest checkpoint is the one with the highest recorded step
def test_the_latest_checkpoint_is_the_highest_recorded_step_whatever_its_name_or_time(tmp_path):
    folder = tmp_path / "run" / "checkpoints"
    folder.mkdir(parents=True)
    now = time.time()
    fake_checkpoint(folder / "last.ckpt", 20, now)  # newest file, stale weights (a moved run)
    fake_checkpoint(folder / "last-v1.ckpt", 40, now - 50)
    fake_checkpoint(folder / "interrupted.ckpt", 30, now - 10)
    fake_checkpoint(folder / "backup copy.ckpt", 40, now - 100)  # same step, written earlier
    (folder / "last.ckpt.partial").write_bytes(b"half written")
    (folder / "damaged.ckpt").write_bytes(b"not a checkpoint")
    run = RunFolder(tmp_path / "run")
    assert [saved.step for saved in run.checkpoints] == [20, 30, 40, 40]
    assert run.latest.path == (folder / "last-v1.ckpt").absolute()
    # every way of naming the run gives that checkpoint
    for setting in (tmp_path / "run", folder):
        assert named_checkpoint(str(setting)) == (folder / "last-v1.ckpt").absolute()
    assert model_checkpoint(str(tmp_path / "run"), "outputs") == (folder / "last-v1.ckpt").absolute()
    # ckpt_path=last across runs: the latest checkpoint of the most recently written run
    assert model_checkpoint("last", str(tmp_path)) == (folder / "last-v1.ckpt").absolute()


def counted_loads(monkeypatch) -> list[str]:
    """Every torch.load from now on in this process, by what it was given (a path or a file)."""
    loads: list[str] = []
    real = torch.load

    def counting(source, *args, **kwargs):
        loads.append(str(getattr(source, "name", source)))
        return real(source, *args, **kwargs)

    monkeypatch.setattr(torch, "load", counting)
    return loads


def indexed_checkpoint(path: Path, step: int, **entries) -> None:
    """A checkpoint written as a run writes one: noted in the run's index."""
    from sru_lightning.app.runs.checkpoint_index import IndexedCheckpointIO
    from sru_lightning.app.runs.checkpoints import RUN_CONFIG_KEY, RUN_ID_KEY

    contents = {"global_step": step, "state_dict": {}, RUN_ID_KEY: "run-a", RUN_CONFIG_KEY: {"seed": step}, **V1}
    IndexedCheckpointIO(RunFolder.index_of).save_checkpoint({**contents, **entries}, path)


def test_a_runs_checkpoints_are_ordered_from_its_index_without_reading_one(tmp_path, monkeypatch):
    folder = tmp_path / "run" / "checkpoints"
    for name, step in (("epoch=0-step=2.ckpt", 2), ("last.ckpt", 6), ("interrupted.ckpt", 4)):
        indexed_checkpoint(folder / name, step)
    assert (tmp_path / "run" / RunFolder.INDEX_FILE).is_file() and not (folder / RunFolder.INDEX_FILE).exists()
    loads = counted_loads(monkeypatch)
    run = RunFolder(tmp_path / "run")
    assert [saved.step for saved in run.checkpoints] == [2, 4, 6] and run.latest.path.name == "last.ckpt"
    assert run.config().seed == 6 and run.latest.run_id == "run-a"
    assert model_checkpoint("last", str(tmp_path)) == folder / "last.ckpt"
    # a copy that keeps the files' times (cp -a, copytree) keeps its index
    shutil.copytree(tmp_path / "run", tmp_path / "copy")
    assert RunFolder(tmp_path / "copy").latest.path == tmp_path / "copy" / "checkpoints" / "last.ckpt"
    # a checkpoint deleted by hand is gone from the order
    (folder / "last.ckpt").unlink()
    assert RunFolder(tmp_path / "run").latest.path.name == "interrupted.ckpt"
    # a file written under a partial name and renamed into place is known under its name
    indexed_checkpoint(folder / "interrupted.ckpt.partial", 8)
    os.replace(folder / "interrupted.ckpt.partial", folder / "interrupted.ckpt")
    assert RunFolder(tmp_path / "run").latest.step == 8
    assert loads == [], "the index alone ordered the checkpoints"
    # a file replaced or added by hand is read: the index never outvotes a file
    torch.save({"global_step": 12, "state_dict": {}, **V1}, folder / "epoch=0-step=2.ckpt")
    shutil.copy(folder / "interrupted.ckpt", folder / "copy.ckpt")
    assert [saved.step for saved in RunFolder(tmp_path / "run").checkpoints] == [8, 8, 12]
    assert sorted(Path(load).name for load in loads) == ["copy.ckpt", "epoch=0-step=2.ckpt"]


# --------------------------------------------------------------------------------------------
# one format: checkpoints and run records of another version are refused in one line
@pytest.mark.parametrize("version", [None, 1, 3])
def test_a_checkpoint_of_another_format_is_refused_in_one_line(tmp_path, capsys, version):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    path = run / "checkpoints" / "last.ckpt"
    contents = {"global_step": 4, "state_dict": {}, "hyper_parameters": {"vocab_size": 5}}
    torch.save({**contents, **({FORMAT_KEY: version} if version is not None else {})}, path)
    found = "none" if version is None else str(version)
    for command in (
        ["validate", *STEPS, f"ckpt_path={path}", f"hydra.run.dir={tmp_path / 'v'}"],
        ["fit", *STEPS, f"ckpt_path={run}", f"hydra.run.dir={tmp_path / 'f'}"],
        ["generate", f"ckpt_path={path}"],
        ["export", f"ckpt_path={path}", f"out={tmp_path / 'e'}"],
    ):
        capsys.readouterr()
        assert cli.main(command) == 2, command[0]
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1, (command[0], err)
        assert str(path) in err[0] and f"format version is {found}, expected 2" in err[0], (command[0], err)


def test_the_model_writes_its_format_and_refuses_another():
    from helpers.language_models import language_model

    from sru_lightning.models.checkpoint_format import CheckpointFormatError

    model = language_model(vocab_size=5, embedding_dim=4, hidden_size=6, num_layers=1)
    model._trainer = SimpleNamespace(world_size=1, ckpt_path="x.ckpt", state=SimpleNamespace(fn="fit"))
    written: dict = {}
    model.on_save_checkpoint(written)
    assert written[FORMAT_KEY] == FORMAT_VERSION
    model.on_load_checkpoint(written)
    with pytest.raises(CheckpointFormatError, match="'x.ckpt': its format version is none, expected 2"):
        model.on_load_checkpoint({"carried_train_state": torch.zeros(2, 6)})  # the per-rank layout's predecessor
    with pytest.raises(CheckpointFormatError, match="'x.ckpt': its format version is 1, expected 2"):
        model.on_load_checkpoint({**written, FORMAT_KEY: 1})  # the network's weights at the top level


def test_a_run_record_of_another_format_is_refused_in_one_line(tmp_path, capsys):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    fake_checkpoint(run / "checkpoints" / "last.ckpt", 4, time.time())
    RunFolder(run).write_record({"status": "completed"})
    assert RunFolder(run).result()["format_version"] == 1
    assert json.loads((run / "history.jsonl").read_text())["format_version"] == 1
    (run / "result.json").write_text(json.dumps({"status": "completed"}))  # as written before records had a version
    capsys.readouterr()
    assert cli.main(["fit", *STEPS, "ckpt_path=auto", f"hydra.run.dir={run}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(run / "result.json") in err[0], err
    assert "format version is none, expected 1" in err[0], err


@pytest.mark.slow
def test_a_resume_reads_its_checkpoint_once_and_lightning_once(tmp_path, monkeypatch):
    run = tmp_path / "runs" / "A"
    assert fit(run, 4) == 0
    assert interrupted_resume(run, 8, at_step=5) == 1
    assert len(list((run / "checkpoints").glob("*.ckpt"))) == 3  # last, the best, interrupted
    assert fit(tmp_path / "runs" / "B", 2) == 0  # another run under the same root
    stopped_at = RunFolder(run).latest
    assert stopped_at.path.name == "interrupted.ckpt"
    loads = counted_loads(monkeypatch)
    assert resume(run, 8) == 0
    assert result_of(run)["ckpt_step"] == stopped_at.step
    assert len(loads) <= 2, loads
    loads.clear()
    assert fit(tmp_path / "runs" / "C", 10, "ckpt_path=last", f"resume_dir={tmp_path / 'runs'}") == 0
    assert result_of(tmp_path / "runs" / "C")["ckpt_step"] == 8
    assert len(loads) <= 2, loads


# --------------------------------------------------------------------------------------------
# the five reproductions of the issue
@pytest.mark.slow
def test_a_moved_run_resumes_and_serves_its_newest_weights(tmp_path, capsys):
    first, moved = tmp_path / "runs" / "mvA", tmp_path / "runs" / "mvB"
    assert fit(first, 4) == 0
    shutil.move(first, moved)
    assert resume(moved, 6) == 0
    assert resume(moved, 8) == 0
    assert history_of(moved)[-1]["ckpt_step"] == 6, "the third fit resumed the second one's step"
    steps = logged_steps(moved)
    assert len(steps) == len(set(steps)), f"steps trained twice: {steps}"
    assert sorted(os.listdir(moved / "checkpoints")).count("last.ckpt") == 1
    assert not any(name.startswith("last-v") for name in os.listdir(moved / "checkpoints"))
    # the record of the best checkpoint moved with the folder: still one best (save_top_k=1),
    # the lowest val_bpc of all four validations, before and after the move
    (best,) = [name for name in os.listdir(moved / "checkpoints") if name.startswith("epoch")]
    with open(next(moved.glob("csv/**/metrics.csv"))) as handle:
        scores = [float(row["val_bpc"]) for row in csv.DictReader(handle) if row.get("val_bpc")]
    assert len(scores) == 4 and best.endswith(f"val_bpc{min(scores):.4f}.ckpt"), (best, scores)
    capsys.readouterr()
    assert cli.main(["validate", f"ckpt_path={moved}", f"hydra.run.dir={tmp_path / 'v'}"]) == 0
    assert result_of(tmp_path / "v")["evaluated_with"]["step"] == 8
    assert "step 8 of" in capsys.readouterr().out


@pytest.mark.slow
def test_validate_into_a_runs_own_directory_leaves_it_alone_and_reports_the_runs_number(tmp_path, capsys):
    run = tmp_path / "runs" / "lstm3"
    assert fit(run, 4, "model=lstm", "data.batch_size=3", "data.seq_len=12") == 0
    trained = result_of(run)["metrics"]["val_bpc"]
    copy = tmp_path / "runs" / "lstm3v"
    shutil.copytree(run, copy)
    before = {name: digest(copy / name) for name in (".hydra/config.yaml", "result.json", "history.jsonl")}
    # no model, data or trainer settings: the run's own are used (a default batch would differ)
    for _ in range(2):
        capsys.readouterr()
        assert cli.main(["validate", f"ckpt_path={copy}", f"hydra.run.dir={copy}"]) == 0
        out = capsys.readouterr().out
        assert f"final val_bpc={trained:.4f}" in out and "batch_size=3 seq_len=12" in out
    assert {name: digest(copy / name) for name in before} == before, "the run's files were rewritten"
    evaluations = sorted((copy / "evaluations").iterdir())
    assert len(evaluations) == 2 and all((folder / "result.json").is_file() for folder in evaluations)
    # the same weights named by file, by a copy elsewhere, or by the run alone: the same number
    loose = tmp_path / "elsewhere.ckpt"
    shutil.copy(named_checkpoint(str(copy)), loose)
    for setting in (f"ckpt_path={loose}", f"ckpt_path={named_checkpoint(str(copy))}", f"hydra.run.dir={copy}"):
        target = [] if setting.startswith("hydra") else [f"hydra.run.dir={tmp_path / 'eval' / str(len(setting))}"]
        capsys.readouterr()
        assert cli.main(["validate", setting, *target]) == 0
        assert f"final val_bpc={trained:.4f}" in capsys.readouterr().out, setting
    # a data override is applied and said
    capsys.readouterr()
    assert cli.main(["validate", f"ckpt_path={copy}", "data.batch_size=2", f"hydra.run.dir={tmp_path / 'b2'}"]) == 0
    assert (
        "batch_size=2" in capsys.readouterr().out
        and "except data.batch_size" in (tmp_path / "b2" / "sru_lightning.log").read_text()
    )


@pytest.mark.slow
def test_a_changed_setting_on_resume_is_applied_and_recorded_or_refused_in_one_line(tmp_path, capsys):
    run = tmp_path / "r"
    assert fit(run, 4) == 0
    assert resume(run, 6, "model.optimizer.lr=0.5") == 0
    record = result_of(run)
    assert record["changes"]["model.optimizer.lr"] == {"from": 0.003, "to": 0.5, "action": "apply"}
    assert record["changes"]["trainer.max_steps"]["to"] == 6
    state = torch.load(named_checkpoint(str(run)), weights_only=True)
    groups = state["optimizer_states"][0]["param_groups"]
    assert all(group["initial_lr"] == 0.5 for group in groups), "the new peak rate is the optimizer's"
    assert all(group["lr"] > 0.01 for group in groups), "the rate follows the new peak, not the old schedule"
    scheduler = state["lr_schedulers"][0]
    assert scheduler["base_lrs"] == [0.5] * len(groups) and scheduler["total_steps"] == 6
    # a setting the checkpoint cannot follow: refused, naming both values; nothing changes
    before = digest(run / "result.json")
    capsys.readouterr()
    assert resume(run, 8, "data.seq_len=32") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "`data.seq_len` cannot change" in err[0] and "=16" in err[0] and "=32" in err[0]
    assert resume(run, 3) == 2
    assert "`trainer.max_steps` must be at least the step" in capsys.readouterr().err
    assert digest(run / "result.json") == before
    # evaluation follows the same rule: a training-only setting is harmless, the architecture is not
    assert cli.main(["validate", f"ckpt_path={run}", "model.net.dropout=0.3", f"hydra.run.dir={tmp_path / 'v'}"]) == 0
    wider = ["validate", f"ckpt_path={run}", "model.net.hidden_size=32", f"hydra.run.dir={tmp_path / 'w'}"]
    assert cli.main(wider) == 2


@pytest.mark.slow
def test_a_weight_averaged_run_resumed_without_its_callback_keeps_the_average_and_trains_on(tmp_path):
    """The checkpoints of a weight-averaged run hold the average as the model and the trained
    weights beside it: a resume whose command line leaves the callback out keeps it from the run
    and ends where the uninterrupted fit ends (without it, the fit would train on from the average)."""
    averaged = ["callbacks=[default,weight_average]", "callbacks.weight_average.decay=0.5"]
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    assert fit(whole, 4, *averaged) == 0
    assert fit(parts, 2, *averaged) == 0
    assert resume(parts, 4) == 0
    assert "callbacks.weight_average: kept from the run" in (parts / "sru_lightning.log").read_text()
    assert not [key for key in result_of(parts).get("changes", {}) if key.startswith("callbacks.")]
    ends = [torch.load(named_checkpoint(str(run)), weights_only=True) for run in (whole, parts)]
    for part in ("state_dict", "current_model_state"):
        assert ends[0][part].keys() == ends[1][part].keys()
        for name, value in ends[0][part].items():
            torch.testing.assert_close(ends[1][part][name], value, rtol=0, atol=0, msg=f"{part}[{name!r}]")
    assert any(not torch.equal(ends[0]["state_dict"][n], v) for n, v in ends[0]["current_model_state"].items())
    # a changed setting of the average is applied and recorded like any other
    assert resume(parts, 6, *averaged[:1], "callbacks.weight_average.decay=0.9") == 0
    change = result_of(parts)["changes"]["callbacks.weight_average.decay"]
    assert change == {"from": 0.5, "to": 0.9, "action": "apply"}


def test_validate_without_weights_is_refused_in_one_line(tmp_path, capsys):
    assert cli.main(["validate", *STEPS, f"hydra.run.dir={tmp_path / 'v'}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "`validate` needs the weights to evaluate" in err[0]
    assert not (tmp_path / "v").exists()


@pytest.mark.parametrize("where", ["a file", "/proc/sru-lightning-run"])
def test_a_run_directory_that_cannot_be_one_is_refused_in_one_line(tmp_path, capsys, where):
    if where == "a file":
        where = str(tmp_path / "notes.txt")
        Path(where).write_text("mine")
    assert cli.main(["fit", *STEPS, f"hydra.run.dir={where}"]) == 2
    out, err = capsys.readouterr()
    assert len(err.strip().splitlines()) == 1 and "`hydra.run.dir` must be a folder" in err
    assert "Traceback" not in out + err


@pytest.mark.slow
def test_a_fit_stopped_between_validations_saves_its_final_weights(tmp_path):
    run = tmp_path / "run"
    assert fit(run, 5, "trainer.val_check_interval=4") == 0  # validations at step 4 only
    assert RunFolder(run).latest.step == 5 and result_of(run)["optimizer_steps"] == 5


# --------------------------------------------------------------------------------------------
# property: any sequence of moves, copies, renames and (interrupted) fits
@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_moved_copied_and_renamed_runs_always_continue_from_their_newest_weights(tmp_path, seed):
    chooser = random.Random(seed)
    run, step, names = tmp_path / "runs" / "start", 2, 0
    assert fit(run, step) == 0
    for _ in range(4):
        operation = chooser.choice(["move", "copy", "rename", "stale"])
        names += 1
        if operation == "move":
            shutil.move(run, run.with_name(f"moved{names}"))
            run = run.with_name(f"moved{names}")
        elif operation == "copy":
            shutil.copytree(run, run.with_name(f"copy{names}"))
            run = run.with_name(f"copy{names}")
        elif operation == "rename":
            latest = RunFolder(run).latest.path
            latest.rename(latest.with_name(f"renamed{names}.ckpt"))
        else:  # an older checkpoint written last, under the name Lightning would pick
            older = min(RunFolder(run).checkpoints, key=lambda saved: saved.step)
            shutil.copy(older.path, run / "checkpoints" / "last.ckpt")
        assert RunFolder(run).latest.step == step, operation
        if chooser.random() < 0.5:
            assert interrupted_resume(run, step + 4, at_step=step + 1) == 1
            step = RunFolder(run).latest.step
            assert step == result_of(run)["optimizer_steps"] and result_of(run)["status"] == "interrupted"
        else:
            assert resume(run, step + 2) == 0
            assert history_of(run)[-1]["ckpt_step"] == step
            step += 2
        assert RunFolder(run).latest.step == step
        trained = logged_steps(run)
        assert len(trained) == len(set(trained)), f"steps trained twice after {operation}: {trained}"
    assert model_checkpoint(str(run), "outputs") == RunFolder(run).latest.path


@pytest.mark.parametrize("setting", ["model.net.hidden_size=-4", "trainer.val_check_interval=10000"])
def test_a_usage_error_speaks_of_the_setting_not_of_python_classes(tmp_path, capsys, setting):
    assert cli.main(["fit", *STEPS, "trainer.max_steps=2", setting, f"hydra.run.dir={tmp_path / 'r'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and setting.split("=")[0].split(".")[-1] in err
    assert "ValueError" not in err and "MisconfigurationException" not in err, err


def test_ckpt_path_last_takes_the_newest_run_the_configured_engine_can_read(tmp_path):
    from omegaconf import OmegaConf

    from sru_lightning.app.runs.checkpoints import RUN_CONFIG_KEY
    from sru_lightning.app.runs.ckpt_path import resolve_checkpoint

    settings = {"model": {"hidden_size": 16}, "data": {"seq_len": 8}}
    older = tmp_path / "outputs" / "ddp" / "checkpoints" / "last.ckpt"
    older.parent.mkdir(parents=True)
    torch.save({"global_step": 5, RUN_CONFIG_KEY: settings, **V1}, older)
    os.utime(older, (1_000, 1_000))
    # a newer ZeRO-2 run of the same model and data: a folder of shards a DDP trainer cannot read
    shards = tmp_path / "outputs" / "zero2" / "checkpoints" / "last.ckpt" / "checkpoint"
    shards.mkdir(parents=True)
    torch.save({"global_step": 9, RUN_CONFIG_KEY: settings, **V1}, shards / "mp_rank_00_model_states.pt")
    other_model = tmp_path / "outputs" / "wide" / "checkpoints" / "last.ckpt"
    other_model.parent.mkdir(parents=True)
    torch.save({"global_step": 7, RUN_CONFIG_KEY: {**settings, "model": {"hidden_size": 32}}, **V1}, other_model)
    cfg = OmegaConf.create(
        {**settings, "ckpt_path": "last", "resume_dir": str(tmp_path / "outputs"), "trainer": {"strategy": "ddp"}}
    )
    assert resolve_checkpoint(cfg, "fit", tmp_path / "new") == str(older.absolute())
    deepspeed = OmegaConf.merge(
        cfg, {"trainer": {"strategy": {"_target_": "sru_lightning.strategies.DeepSpeedStrategy"}}}
    )
    assert resolve_checkpoint(deepspeed, "fit", tmp_path / "new") == str(shards.parent.absolute())


def validated_steps(run: Path) -> list[int]:
    with open(next(run.glob("csv/**/metrics.csv"))) as handle:
        return sorted(int(row["step"]) for row in csv.DictReader(handle) if row.get("val_bpc"))


@pytest.mark.slow
def test_a_stop_on_a_step_due_for_validation_keeps_that_validation(tmp_path):
    """val_check_interval=2: the stop lands while step 4 (due for validation) trains; the
    validation of step 4 runs before the fit stops, and the resumed fit validates as the
    uninterrupted one does."""
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    assert fit(straight, 8) == 0
    assert interrupted_resume_fresh(stopped, 8, at_step=3) == 1
    assert result_of(stopped)["optimizer_steps"] == 4 and validated_steps(stopped)[-1] == 3
    assert resume(stopped, 8) == 0
    assert validated_steps(stopped) == validated_steps(straight)
    assert step_losses(stopped) == pytest.approx(step_losses(straight), rel=1e-6), "the resume is exact"


def step_losses(run: Path) -> dict[int, float]:
    with open(next(run.glob("csv/**/metrics.csv"))) as handle:
        return {int(row["step"]): float(row["train_loss"]) for row in csv.DictReader(handle) if row.get("train_loss")}


def interrupted_resume_fresh(run: Path, max_steps: int, at_step: int) -> int:
    return fit(run, max_steps, *stop_by_sigterm(at_step))


@pytest.mark.slow
def test_evaluating_a_run_fitted_with_other_callbacks_prints_no_advice_about_them(tmp_path):
    """A run fitted with `callbacks=none` holds the state of a checkpoint callback the evaluation
    does not have: evaluating restores no callback state, so Lightning's advice to add it is
    not printed."""
    from helpers import preloaded

    run = tmp_path / "run"
    assert fit(run, 2, "callbacks=none") == 0
    result = preloaded.run(
        [sys.executable, "-m", "sru_lightning", "validate", f"ckpt_path={run}", f"hydra.run.dir={tmp_path / 'v'}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "step 2 of" in result.stdout
    assert "callbacks used to create the checkpoint" not in result.stdout + result.stderr


# --------------------------------------------------------------------------------------------
# one run per folder
def folder_state(root: Path) -> dict[str, tuple[str, int]]:
    """Every file under `root` (the bytes and the time written) and every folder."""
    state = {}
    for path in sorted(root.rglob("*")):
        name = str(path.relative_to(root))
        state[name] = (digest(path), path.stat().st_mtime_ns) if path.is_file() else ("folder", 0)
    return state


@pytest.mark.slow
@pytest.mark.parametrize("held", ["finished", "interrupted"])
def test_a_resume_of_another_run_into_a_runs_folder_is_refused_and_leaves_it_untouched(tmp_path, capsys, held):
    run, other = tmp_path / "runs" / "A", tmp_path / "runs" / "B"
    assert fit(other, 2, "seed=7") == 0
    if held == "interrupted":  # only interrupted.ckpt, as a run stopped before its first validation
        assert interrupted_resume_fresh(run, 8, at_step=1) == 1
        assert [path.name for path in (run / "checkpoints").iterdir()] == ["interrupted.ckpt"]
    else:
        assert fit(run, 2) == 0
    before = folder_state(run)
    for setting in (other, RunFolder(other).latest.path):
        capsys.readouterr()
        assert fit(run, 6, f"ckpt_path={setting}") == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "already holds checkpoints of an earlier run" in err[0], err
        assert folder_state(run) == before, f"a refused resume of {setting} changed {run}"
    # a refused evaluation of the run leaves no evaluations/ folder in it
    assert cli.main(["validate", f"hydra.run.dir={run}", "model.net.hidden_size=32"]) == 2
    assert folder_state(run) == before
    # the same run copied (or moved) elsewhere is recognised, and continues there
    copy = tmp_path / "runs" / "B copy"
    shutil.copytree(other, copy)
    assert fit(copy, 4, f"ckpt_path={other}") == 0
    assert RunFolder(copy).latest.step == 4 and result_of(copy)["ckpt_step"] == 2
    if held == "finished":  # the copy continued further; the original takes its newest weights back
        assert fit(other, 6, f"ckpt_path={copy}") == 0
        assert result_of(other)["ckpt_step"] == 4 and RunFolder(other).latest.step == 6


def test_a_refused_command_leaves_no_new_folder_behind(tmp_path, capsys):
    """The default run directory is outputs/<date>/<time>: a refusal removes it and the folders
    made around it, and leaves a folder that was there before."""
    assert cli.main(["validate", *STEPS, "ckpt_path=last"]) == 2
    assert "found no checkpoint" in capsys.readouterr().err
    assert not (tmp_path / "outputs").exists(), sorted(map(str, tmp_path.rglob("*")))
    (tmp_path / "outputs" / "mine").mkdir(parents=True)
    assert cli.main(["fit", *STEPS, "ckpt_path=missing.ckpt"]) == 2
    assert sorted(path.name for path in (tmp_path / "outputs").iterdir()) == ["mine"]


FOLDERS = ("a", "b", "c")
COMMANDS = ("fit", "stopped fit", "resume other", "auto", "last", "copy", "validate")


def saved_seeds(run: Path) -> set:
    """The seeds the run's checkpoints and its config trained with: each fresh fit of the property
    test below has its own seed, so two seeds in one folder are two runs' files."""
    from omegaconf import OmegaConf

    from sru_lightning.app.runs.checkpoints import RUN_CONFIG_KEY

    seeds = {torch.load(path, weights_only=True)[RUN_CONFIG_KEY]["seed"] for path in run.glob("checkpoints/*.ckpt")}
    if seeds and (run / ".hydra" / "config.yaml").is_file():
        seeds.add(OmegaConf.load(run / ".hydra" / "config.yaml").seed)
    return seeds


@pytest.mark.slow  # about 30 fits of a few seconds
@hypothesis.settings(
    max_examples=8, deadline=None, suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture]
)
@hypothesis.given(
    commands=st.lists(
        st.tuples(st.sampled_from(COMMANDS), st.sampled_from(FOLDERS), st.sampled_from(FOLDERS)),
        min_size=3,
        max_size=5,
    )
)
@hypothesis.example(commands=[("stopped fit", "a", "a"), ("fit", "b", "b"), ("resume other", "a", "b")])
def test_no_command_leaves_one_folder_holding_two_runs_files(tmp_path_factory, monkeypatch, commands):
    """Random fits, stops, resumes (of the folder's own run, another's, the latest), copies and
    evaluations over a few folders: every folder's checkpoints and config stay one run's, and a
    refused command changes nothing anywhere."""
    root = tmp_path_factory.mktemp("folders")
    monkeypatch.chdir(root)
    for index, (command, folder, other) in enumerate(commands):
        run, steps, seed = root / folder, 2 * (index + 1), f"seed={100 + index}"
        before = folder_state(root)
        if command == "fit":
            status = fit(run, steps, seed)
        elif command == "stopped fit":
            status = fit(run, steps + 4, seed, *stop_by_sigterm(at_step=1))
        elif command == "resume other":
            status = fit(run, steps, f"ckpt_path={root / other}")
        elif command in ("auto", "last"):
            status = fit(run, steps, f"ckpt_path={command}", "resume_dir=.")
        elif command == "copy":
            if (root / other).is_dir() and not run.exists():
                shutil.copytree(root / other, run)
            continue
        else:
            status = cli.main(["validate", *STEPS, f"hydra.run.dir={run}", f"ckpt_path={root / other}"])
        if status == 2:
            assert folder_state(root) == before, f"refused {command} {folder} {other} changed files"
        for held in FOLDERS:
            seeds = saved_seeds(root / held)
            assert len(seeds) <= 1, f"after {commands[: index + 1]}, {held} holds the files of runs {seeds}"
