"""`model.compile`: the Hydra CLI hands the Trainer torch.compile(model) for fit/validate/test; the
checkpoints it writes hold unprefixed names and evaluate the same without compiling."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from helpers import preloaded
from helpers.language_models import language_model
from helpers.tiny_run import TINY_RUN

from sru_lightning.app import cli
from sru_lightning.app.runs.changes import APPLY, rule_for
from sru_lightning.app.runs.run_trainer import _check_compile_fits_strategy
from sru_lightning.app.usage import UsageError
from sru_lightning.models import SRULanguageModel

ROOT = Path(cli.__file__).resolve().parents[2]


def python_m_sru_lightning(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    # Import this checkout's package whether or not it is installed.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    result = preloaded.run(
        [sys.executable, "-m", "sru_lightning", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, f"{args} exited {result.returncode}:\n{result.stderr[-3000:]}"
    return result


def test_compile_is_applied_on_resume_and_evaluation():
    rule = rule_for("model.compile")
    assert (rule.on_fit, rule.on_evaluate) == (APPLY, APPLY)


@pytest.mark.parametrize("value", [True, False, "max-autotune"])
def test_the_model_accepts_a_compile_setting(value):
    model = language_model(vocab_size=7, embedding_dim=4, hidden_size=4, num_layers=1, compile=value)
    handed = model.for_trainer()
    assert (handed is model) == (value is False)
    if value is not False:
        assert handed._orig_mod is model


def test_a_bad_compile_setting_is_a_usage_error(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["fit", *TINY_RUN, "model.compile=fast"]) == 2
    err = capsys.readouterr().err
    assert "`model.compile` must be true, false or a torch.compile mode" in err and "'fast'" in err
    assert "Traceback" not in err


def test_compile_under_a_strategy_lightning_does_not_compile_with_is_refused():
    model = language_model(vocab_size=7, embedding_dim=4, hidden_size=4, num_layers=1, compile=True)
    with pytest.raises(UsageError, match=r"`model.compile` must be false with trainer.strategy=object"):
        _check_compile_fits_strategy(model, types.SimpleNamespace(strategy=object()))
    eager = language_model(vocab_size=7, embedding_dim=4, hidden_size=4, num_layers=1)
    _check_compile_fits_strategy(eager, types.SimpleNamespace(strategy=object()))  # nothing to refuse


@pytest.mark.slow  # starts processes, and compiling takes tens of seconds
def test_a_compiled_fit_saves_plain_weights_that_validate_the_same_uncompiled(tmp_path):
    run, evaluation = tmp_path / "run", tmp_path / "evaluation"
    fitted = python_m_sru_lightning("fit", *TINY_RUN, "model.compile=true", f"hydra.run.dir={run}", cwd=tmp_path)
    # the precision callback found the SRU layer of the compiled model
    assert "SRU layers   1: net.rnn.rnn_lst.0" in fitted.stdout + fitted.stderr

    checkpoint = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert checkpoint["state_dict"] and not [key for key in checkpoint["state_dict"] if "_orig_mod" in key]
    uncompiled = SRULanguageModel(**{**checkpoint["hyper_parameters"], "compile": False})
    uncompiled.load_state_dict(checkpoint["state_dict"])  # strict: every name as the model has it

    validated = python_m_sru_lightning(
        "validate", *TINY_RUN, f"ckpt_path={run}", "model.compile=false", f"hydra.run.dir={evaluation}", cwd=tmp_path
    )
    assert "changed setting: model.compile: True -> False (applied)" in validated.stdout + validated.stderr
    compiled_val = json.loads((run / "result.json").read_text())["metrics"]["val_bpc"]
    eager_val = json.loads((evaluation / "result.json").read_text())["metrics"]["val_bpc"]
    assert eager_val == pytest.approx(compiled_val, abs=1e-5)


@pytest.mark.slow  # starts a process that compiles the default model
def test_bench_compile_prints_the_compiled_to_eager_ratios(tmp_path):
    result = python_m_sru_lightning("bench", "compile", *("length=4", "batch=2", "repeats=1", "warmup=0"), cwd=tmp_path)
    lines = result.stdout.splitlines()
    assert lines[0].startswith("Compile benchmark: default model")
    for kind in ("train step", "inference"):
        row = next(line for line in lines if line.startswith(kind))
        eager, compiled, ratio = (float(cell) for cell in row[len(kind) :].split())
        # the times are printed to 0.01 ms and the ratio, of the unrounded times, to 0.001
        lowest, highest = (compiled - 0.005) / (eager + 0.005), (compiled + 0.005) / (eager - 0.005)
        assert lowest - 0.0005 <= ratio <= highest + 0.0005, (eager, compiled, ratio)
