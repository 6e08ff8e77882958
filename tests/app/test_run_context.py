"""One command's run context (sru_lightning/app/runs/context.py) and the Hydra launch that
hands errors back as raised (sru_lightning/app/hydra_launch.py)."""

from __future__ import annotations

import importlib
import os
import pickle
import sys

import pytest

from sru_lightning.app.hydra_launch import PRIVATE_NAMES, run_hydra
from sru_lightning.app.runs.context import RunContext, activated, active_context
from sru_lightning.app.runs.folder import RunFolder


@pytest.mark.parametrize("module", sorted(PRIVATE_NAMES))
def test_the_private_hydra_names_the_launch_uses_are_there(module):
    missing = [name for name in PRIVATE_NAMES[module] if not hasattr(importlib.import_module(module), name)]
    assert missing == [], f"{module} no longer has {missing}: update sru_lightning/app/hydra_launch.py"


def _config_dir(tmp_path):
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "config.yaml").write_text("value: 1\nhydra:\n  run:\n    dir: " + str(tmp_path / "run") + "\n")
    return str(conf)


def test_a_task_runs_with_the_overrides_given_and_sys_argv_untouched(tmp_path):
    seen = []
    argv = list(sys.argv)
    run_hydra(["value=7"], lambda cfg: seen.append(cfg.value), config_path=_config_dir(tmp_path), config_name="config")
    assert seen == [7] and sys.argv == argv


def test_errors_come_back_raised_without_hydras_environment_variable(tmp_path, monkeypatch):
    from hydra.errors import ConfigCompositionException

    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    conf = _config_dir(tmp_path)

    def task(cfg):
        assert "HYDRA_FULL_ERROR" not in os.environ
        raise KeyError("from the task")

    with pytest.raises(KeyError, match="from the task"):  # Hydra alone would print and exit with 1
        run_hydra([], task, config_path=conf, config_name="config")
    with pytest.raises(ConfigCompositionException, match="nope"):
        run_hydra(["nope=1"], task, config_path=conf, config_name="config")
    assert "HYDRA_FULL_ERROR" not in os.environ


def test_the_active_context_is_the_commands_until_it_ends_and_its_holds_go_back(tmp_path):
    context = RunContext("validate", ("seed=1",))
    assert active_context() is not context and active_context().command == "fit"  # none active
    with activated(context):
        assert active_context() is context
        hold = context.held.take(tmp_path, context.command)
        assert (tmp_path / RunFolder.HOLD_FILE).is_file() and len(context.held) == 1
    assert active_context() is not context
    assert not (tmp_path / RunFolder.HOLD_FILE).exists() and not hold.owned and len(context.held) == 0


def test_a_context_pickled_into_a_job_process_carries_the_command_only(tmp_path):
    """Joblib's and submitit's launchers pickle the task, and the context it closes over."""
    context = RunContext("fit", ("-m", "seed=1,2"))
    context.held.take(tmp_path, "fit")
    context.found.evaluated_runs[tmp_path / "evaluation"] = tmp_path
    copy = pickle.loads(pickle.dumps(context))
    assert (copy.command, copy.overrides) == ("fit", ("-m", "seed=1,2"))
    assert len(copy.held) == 0 and copy.found.evaluated_runs == {}
    context.held.release_all()


def test_an_evaluation_knows_the_run_it_was_pointed_at(tmp_path):
    context = RunContext("test")
    context.found.evaluated_runs[(tmp_path / "run" / "evaluations" / "test-1").absolute()] = tmp_path / "run"
    assert context.evaluated_run(tmp_path / "run" / "evaluations" / "test-1") == tmp_path / "run"
    assert context.evaluated_run(tmp_path / "other") is None
    context.found.output_subdir = ".meta"
    assert context.attempt_config_path(tmp_path) == tmp_path / ".meta" / RunFolder.CONFIG_FILE


@pytest.mark.parametrize(
    "flags,message",
    [
        (
            ["--cfg", "job", "--run"],
            "only one of --run, --multirun, --cfg, --info, --shell-completion may be given, got --run and --cfg",
        ),
        (["--resolve"], "`--resolve` must come with `--cfg` or `--help`, got neither"),
    ],
)
def test_hydra_flags_that_conflict_are_a_usage_error_in_one_line(flags, message, capsys, monkeypatch, tmp_path):
    from sru_lightning.app import cli

    monkeypatch.chdir(tmp_path)
    assert cli.main(["fit", *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
