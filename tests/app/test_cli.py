"""`python -m sru_lightning`: help, dispatch, clear errors, and tiny fit/validate/test/resume runs."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from helpers import preloaded
from helpers.tiny_run import TINY_RUN

from sru_lightning.app import cli

TINY = TINY_RUN


def run_cli(*args: str) -> int:
    return cli.main(list(args))


def result_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "result.json").read_text())


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_help_lists_commands_and_config_groups(capsys):
    assert run_cli("--help") == 0
    out = capsys.readouterr().out
    for word in ("fit", "validate", "test", "bench", "build", "fidelity", "gpu-check"):
        assert f"  {word}" in out
    for group, option in (
        ("model", "sru_large"),
        ("trainer", "ddp_cpu"),
        ("data", "enwik8"),
        ("logger", "tensorboard"),
    ):
        line = next(line for line in out.splitlines() if line.strip().startswith(group))
        assert option in line


def test_hydra_help_of_a_command_shows_groups_and_config(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert run_cli("fit", "--help") == 0
    out = capsys.readouterr().out
    assert "model: lstm, sru, sru_large" in out and "ckpt_path: null" in out


@pytest.mark.parametrize(
    "argv,message",
    [
        (["fitt"], "unknown command 'fitt' (did you mean 'fit'?)"),
        (["model=lstm", "fit"], "the command must come first"),
    ],
)
def test_bad_commands_get_a_short_error(argv, message, capsys):
    assert run_cli(*argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_no_command_prints_usage_and_fails(capsys):
    assert run_cli() == 2
    assert "Commands:" in capsys.readouterr().out


def test_tool_commands_are_dispatched_with_their_arguments(monkeypatch):
    seen = {}
    fake = types.ModuleType("fake_bench")
    fake.main = lambda argv: seen.setdefault("argv", argv) and 3
    monkeypatch.setitem(sys.modules, "fake_bench", fake)
    monkeypatch.setitem(cli.TOOL_COMMANDS, "bench", ("fake_bench", "test double"))
    assert run_cli("bench", "plot=x.png") == 3
    assert seen["argv"] == ["plot=x.png"]


def test_a_missing_tool_module_gets_a_clear_message(monkeypatch, capsys):
    monkeypatch.setitem(cli.TOOL_COMMANDS, "gpu-check", ("sru_lightning.not_there", "test double"))
    assert run_cli("gpu-check") == 1
    assert (
        "command 'gpu-check' is not available: module sru_lightning.not_there is not installed"
        in capsys.readouterr().err
    )


@pytest.mark.parametrize(
    "override,message",
    [
        ("model=transformer", "Could not find 'model/transformer'"),
        ("trainer.no_such_option=1", "Could not override 'trainer.no_such_option'"),
        ("trainer.precision=17-bits", "17-bits"),
        ("model.net.hidden_size=0", "`hidden_size` must be a positive integer, got 0"),
        ("data=text", "`data.path` is not set"),
        ("seed=abc", "`seed` must be an integer"),
        ("ckpt_path=/no/such.ckpt", "`ckpt_path` must be a checkpoint file"),
    ],
)
def test_bad_configuration_gets_a_short_error_without_traceback(override, message, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert run_cli("fit", *TINY, override) == 2  # a usage error, as in every command
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err


def python_m_sru_lightning(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    # Import this checkout's package whether or not it is installed.
    root = str(Path(cli.__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    return preloaded.run(
        [sys.executable, "-m", "sru_lightning", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow  # starts a process
def test_module_entry_point_exit_status_and_message(tmp_path):
    bad = python_m_sru_lightning("fit", "trainer.max_epochs=[1", cwd=tmp_path)
    assert bad.returncode == 2
    assert "trainer.max_epochs=[1" in bad.stderr and "Traceback" not in bad.stderr
    unknown = python_m_sru_lightning("trian", cwd=tmp_path)
    assert unknown.returncode == 2 and "did you mean 'train'" not in unknown.stderr
    assert "unknown command 'trian'" in unknown.stderr


@pytest.mark.slow
def test_fit_validate_test_and_resume(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    first = tmp_path / "outputs" / "first"
    assert run_cli("fit", *TINY, f"hydra.run.dir={first}") == 0
    out = capsys.readouterr().out
    assert "final val_bpc=" in out and "(unigram baseline bpc=" in out
    record = result_of(first)
    assert record["status"] == "completed" and record["command"] == "fit"
    assert record["metrics"]["unigram_bpc"] > 4.0 and "val_bpc" in record["metrics"]
    last = first / "checkpoints" / "last.ckpt"
    assert last.is_file() and (first / "csv" / "metrics.csv").is_file()
    before = digest(last)

    # a fresh fit into that directory would overwrite its checkpoints: refused
    assert run_cli("fit", *TINY, f"hydra.run.dir={first}") == 2
    assert "already holds checkpoints of an earlier run" in capsys.readouterr().err
    assert digest(last) == before

    # validate from a run directory, test from an explicit file
    assert run_cli("validate", *TINY, f"ckpt_path={first}", f"hydra.run.dir={tmp_path / 'val'}") == 0
    assert result_of(tmp_path / "val")["ckpt_path"] == str(last)
    assert result_of(tmp_path / "val")["metrics"]["val_bpc"] == pytest.approx(record["metrics"]["val_bpc"], rel=1e-4)
    assert run_cli("test", *TINY, f"ckpt_path={last}", f"hydra.run.dir={tmp_path / 'test'}") == 0
    assert "test_bpc" in result_of(tmp_path / "test")["metrics"]
    assert "final test_bpc=" in capsys.readouterr().out

    # ckpt_path=last finds the earlier run with the same model/data config and continues it
    second = tmp_path / "outputs" / "second"
    resumed = [o for o in TINY if not o.startswith("trainer.max_epochs")]
    assert run_cli("fit", *resumed, "trainer.max_epochs=2", "ckpt_path=last", f"hydra.run.dir={second}") == 0
    assert result_of(second)["ckpt_path"] == str(last)
    state = torch.load(second / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert state["epoch"] == 1 and state["global_step"] == 6  # 3 steps restored + 3 new
    assert digest(last) == before  # the earlier run's checkpoint is untouched

    # a different model config is never resumed from: a fresh start instead
    third = tmp_path / "outputs" / "third"
    assert run_cli("fit", *TINY, "model.net.hidden_size=24", "ckpt_path=last", f"hydra.run.dir={third}") == 0
    assert "ckpt_path" not in result_of(third)


def test_validate_with_last_but_no_checkpoint_is_an_error(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert run_cli("validate", *TINY, "ckpt_path=last", f"hydra.run.dir={tmp_path / 'v'}") == 2
    assert "`ckpt_path=last` found no checkpoint of a run" in capsys.readouterr().err


def test_a_run_directory_resumes_from_its_newest_checkpoint(tmp_path):
    """The newest checkpoint is the one with the highest step recorded inside, not the newest file."""
    import os

    import torch
    from omegaconf import OmegaConf

    from sru_lightning.app.runs.ckpt_path import resolve_checkpoint
    from sru_lightning.models.checkpoint_format import FORMAT_KEY, FORMAT_VERSION

    checkpoints = tmp_path / "run" / "checkpoints"
    checkpoints.mkdir(parents=True)
    last, interrupted = checkpoints / "last.ckpt", checkpoints / "interrupted.ckpt"
    torch.save({"global_step": 10, FORMAT_KEY: FORMAT_VERSION}, last)
    torch.save({"global_step": 15, FORMAT_KEY: FORMAT_VERSION}, interrupted)
    os.utime(last, (3_000, 3_000))  # written later, but holds an earlier step
    os.utime(interrupted, (2_000, 2_000))
    cfg = OmegaConf.create({"ckpt_path": str(tmp_path / "run")})
    assert resolve_checkpoint(cfg, "fit", tmp_path / "new") == str(interrupted.absolute())
    torch.save({"global_step": 20, FORMAT_KEY: FORMAT_VERSION}, last)  # a later save supersedes the interruption
    os.utime(last, (1_000, 1_000))
    assert resolve_checkpoint(cfg, "fit", tmp_path / "new") == str(last.absolute())
