"""The search that stops weak trials early (hparams_search=speedrun: Optuna with successive
halving on the share of each trial's budget), end to end on tiny fits: the weak trials are pruned
at the first look and recorded so, and an interrupted search continues in its folder."""

from __future__ import annotations

import csv
import importlib.util
import json

import pytest

from sru_lightning.app import cli

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("hydra_plugins.hydra_optuna_sweeper") is None,
        reason="the search needs the `sweepers` extra: pip install 'sru_lightning[sweepers]'",
    ),
]

# Everything fixed but the learning rate, on tiny fits bounded by steps (the budget's share is of
# max_steps) that validate every 5 steps: the pruner's first look (11%) is step 5 of 45.
TINY_SEARCH = [
    "hparams_search=speedrun",
    "debug=tiny",
    "logger=none",
    "+trainer.enable_progress_bar=false",
    "+trainer.enable_model_summary=false",
    "trainer.max_time=null",
    "trainer.max_epochs=-1",
    "trainer.max_steps=45",
    "trainer.val_check_interval=5",
    "model=sru",
    "model/optimizer=adamw",
    "model.net.hidden_size=32",
    "model.net.num_layers=1",
    "model.net.embedding_dim=16",
    "model.net.dropout=0.0",
    "model.net.tie_weights=false",
    "trainer.precision=32-true",
    "data.seq_len=32",
    "data.batch_size=8",
]
GOOD, USELESS = 0.03, 1e-7


def trials_table(sweep_dir) -> list[dict]:
    with open(sweep_dir / "trials.csv", newline="") as handle:
        return list(csv.DictReader(handle))


def search(sweep_dir, *extra: str) -> int:
    return cli.main(["fit", *TINY_SEARCH, f"hydra.sweep.dir={sweep_dir}", *extra])


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def test_trials_that_cannot_win_are_pruned_at_the_first_look(tmp_path, capsys):
    sweep_dir = tmp_path / "search"
    status = search(
        sweep_dir,
        "hydra.sweeper.n_trials=5",
        "hydra.sweeper.sampler.n_startup_trials=5",
        f"model.optimizer.lr=choice({GOOD},{USELESS})",
    )
    assert status == 0, capsys.readouterr().err
    rows = trials_table(sweep_dir)
    assert [int(row["trial"]) for row in rows] == [0, 1, 2, 3, 4]
    seen_good = False
    pruned = 0
    for row in rows:  # job folder n is trial n
        lr = float(row["model.optimizer.lr"])
        record = json.loads((sweep_dir / row["trial"] / "result.json").read_text())
        if lr == GOOD:
            assert row["state"] == "complete" and record["optimizer_steps"] == 45
            seen_good = True
        elif seen_good:  # a trial that does not learn, after one that does: stopped at 11% (step 5)
            assert row["state"] == "pruned" and row["pruned_at_percent"] == "11", row
            assert record["optimizer_steps"] == 5
            assert float(row["value"]) == pytest.approx(record["metrics"]["val_bpc"])
            pruned += 1
    assert pruned >= 1, f"the seeded sampler gave no useless trial after a good one: {rows}"
    good = [float(row["value"]) for row in rows if float(row["model.optimizer.lr"]) == GOOD]
    useless = [float(row["value"]) for row in rows if float(row["model.optimizer.lr"]) == USELESS]
    assert max(good) < min(useless)
    assert (sweep_dir / "search.db").is_file()


def test_an_interrupted_search_continues_its_cut_trial_and_runs_only_the_trials_left(tmp_path, capsys):
    import optuna

    sweep_dir = tmp_path / "search"
    space = ["hydra.sweeper.pruner=null", "model.optimizer.lr=choice(0.01,0.02)"]
    assert search(sweep_dir, "hydra.sweeper.n_trials=2", *space) == 0, capsys.readouterr().err
    first = {n: (sweep_dir / n / "result.json").read_bytes() for n in ("0", "1")}
    # What an interruption leaves in the storage: a trial asked and started, never told.
    study = optuna.load_study(study_name="sru_speedrun", storage=f"sqlite:///{sweep_dir / 'search.db'}")
    cut = study.ask({"model.optimizer.lr": optuna.distributions.CategoricalDistribution([0.01, 0.02])})
    assert cut.number == 2

    status = search(sweep_dir, "hydra.sweeper.n_trials=4", "ckpt_path=auto", *space)
    assert status == 0, capsys.readouterr().err
    rows = trials_table(sweep_dir)
    assert [(row["trial"], row["state"]) for row in rows] == [(str(n), "complete") for n in range(4)]
    assert float(rows[2]["model.optimizer.lr"]) == cut.params["model.optimizer.lr"]
    record = json.loads((sweep_dir / "2" / "result.json").read_text())
    assert f"model.optimizer.lr={cut.params['model.optimizer.lr']}" in record["overrides"]
    assert {n: (sweep_dir / n / "result.json").read_bytes() for n in ("0", "1")} == first  # not run again
    assert (sweep_dir / "3" / "result.json").is_file()
