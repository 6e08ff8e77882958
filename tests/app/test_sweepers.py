"""Hyperparameter search and launchers people use with Hydra, end to end on tiny fits:
the Optuna sweeper (TPE, conf/hparams_search/lm_optuna.yaml), the joblib launcher and the
submitit local launcher. They are the `sweepers` extra (installed by the `test` extra)."""

from __future__ import annotations

import csv
import importlib.util
import math

import pytest
import yaml
from helpers.tiny_run import TINY_RUN

from sru_lightning.app import cli, sweep

TINY = [*TINY_RUN, "+trainer.enable_progress_bar=false"]


def needs(plugin: str):
    return pytest.mark.skipif(
        importlib.util.find_spec(f"hydra_plugins.{plugin}") is None,
        reason=f"needs {plugin.replace('_', '-')}: pip install 'sru_lightning[sweepers]'",
    )


def summary_rows(sweep_dir) -> list[dict]:
    with open(sweep_dir / "summary.csv", newline="") as handle:
        return list(csv.DictReader(handle))


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def test_the_task_returns_the_monitored_metric_and_nan_for_a_failure():
    completed = {"status": "completed", "monitor": "val_bpc", "metrics": {"val_bpc": 2.5, "train_loss": 1.0}}
    assert sweep.optimized_value(completed) == 2.5
    assert math.isnan(sweep.optimized_value({"status": "failed", "monitor": "val_bpc"}))
    assert math.isnan(sweep.optimized_value({"status": "completed", "monitor": "val_bpc", "metrics": {}}))


@pytest.mark.slow
@needs("hydra_optuna_sweeper")
def test_optuna_tpe_search_over_the_shipped_space(tmp_path, capsys):
    sweep_dir = tmp_path / "search"
    status = cli.main(
        [
            "fit",
            "hparams_search=lm_optuna",
            "hydra.sweeper.n_trials=3",
            "hydra.sweeper.sampler.n_startup_trials=2",
            *TINY,
            "model.net.hidden_size=choice(8,16)",
            "model.net.num_layers=1",
            f"hydra.sweep.dir={sweep_dir}",
        ]
    )
    assert status == 0, capsys.readouterr().err
    rows = summary_rows(sweep_dir)
    assert [row["job"] for row in rows] == ["0", "1", "2"]
    assert all(row["status"] == "completed" for row in rows)
    assert all("model.optimizer.lr=" in row["overrides"] for row in rows)
    best = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
    # the summary shows 4 decimals
    assert best["best_value"] == pytest.approx(min(float(row["val_bpc"]) for row in rows), abs=1e-4)


@pytest.mark.slow
@needs("hydra_optuna_sweeper")
def test_optuna_with_a_failing_trial_lists_it_and_goes_on(tmp_path, capsys):
    sweep_dir = tmp_path / "search"
    status = cli.main(
        [
            "fit",
            "-m",
            "hydra/sweeper=optuna",
            "hydra.sweeper.n_trials=3",
            "hydra.sweeper.sampler.seed=1",
            "hydra.sweeper.max_failure_rate=1.0",
            "model.net.rnn=choice(sru,gru)",
            *TINY,
            f"hydra.sweep.dir={sweep_dir}",
        ]
    )
    rows = summary_rows(sweep_dir)
    assert len(rows) == 3
    tried = {row["overrides"].split()[0] for row in rows}
    assert tried == {"model.net.rnn=sru", "model.net.rnn=gru"}, "the seeded sampler tries both"
    for row in rows:  # gru is not a model.net.rnn: that trial fails, is listed, and the search goes on
        assert row["status"] == ("failed" if "model.net.rnn=gru" in row["overrides"] else "completed")
    assert status == 1
    assert "runs did not complete" in capsys.readouterr().err


@pytest.mark.slow
@needs("hydra_optuna_sweeper")
def test_optuna_stopped_by_a_failed_trial_still_writes_the_summary(tmp_path, capsys):
    sweep_dir = tmp_path / "search"
    status = cli.main(
        [  # seed 0 asks gru, then sru, in one batch: one fails, one completes
            "fit",
            "-m",
            "hydra/sweeper=optuna",
            "hydra.sweeper.n_trials=2",
            "hydra.sweeper.sampler.seed=0",
            "model.net.rnn=choice(sru,gru)",
            *TINY,
            f"hydra.sweep.dir={sweep_dir}",
        ]
    )
    assert status == 1 and "the sweep stopped" in capsys.readouterr().err
    rows = summary_rows(sweep_dir)
    assert sorted((row["overrides"].split()[0], row["status"]) for row in rows) == [
        ("model.net.rnn=gru", "failed"),
        ("model.net.rnn=sru", "completed"),
    ]


@pytest.mark.slow
@needs("hydra_joblib_launcher")
def test_joblib_launcher_runs_the_jobs_in_parallel_processes(tmp_path):
    sweep_dir = tmp_path / "sweep"
    assert (
        cli.main(
            [
                "fit",
                "-m",
                "hydra/launcher=joblib",
                "hydra.launcher.n_jobs=2",
                "model.net.dropout=0.0,0.1",
                *TINY,
                f"hydra.sweep.dir={sweep_dir}",
            ]
        )
        == 0
    )
    rows = summary_rows(sweep_dir)
    assert [row["overrides"].split()[0] for row in rows] == ["model.net.dropout=0.0", "model.net.dropout=0.1"]
    assert all(row["status"] == "completed" and float(row["val_bpc"]) > 0 for row in rows)


@pytest.mark.slow
@needs("hydra_submitit_launcher")
def test_submitit_local_launcher_runs_the_jobs(tmp_path):
    sweep_dir = tmp_path / "sweep"
    assert (
        cli.main(
            [
                "fit",
                "-m",
                "hydra/launcher=submitit_local",
                "model.net.dropout=0.0,0.1",
                *TINY,
                "~callbacks.lr_monitor",
                f"hydra.sweep.dir={sweep_dir}",
            ]
        )
        == 0
    )
    rows = summary_rows(sweep_dir)
    assert [row["job"] for row in rows] == ["0", "1"]
    assert all(row["status"] == "completed" and float(row["val_bpc"]) > 0 for row in rows)
    assert "'~callbacks.lr_monitor'" in rows[0]["overrides"]  # as typed, not `=null`
