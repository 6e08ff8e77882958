"""`trainer=ddp_cpu` (2 processes, gloo) trains the language model exactly like one process
with the same global batch and seed.

Each DDP rank reads half of the global batch's streams (batch_size 4 per rank against 8 in
one process) and DDP averages the gradients, so the two runs take the same optimizer steps
up to float rounding in the gradient all-reduce. Dropout is off: its masks would differ
between one process and two. Compared: the validation bits-per-character curve (the
torchmetrics mean is synchronised over ranks, so rank 0 logs the global value), the training
loss and bits per character of every step (logged as the mean over ranks, not rank 0's half
of the batch) and the final weights.
"""

from __future__ import annotations

import csv
import os
import sys
from pathlib import Path

import pytest
import torch
from helpers import preloaded

REPO = Path(__file__).resolve().parents[2]
GLOBAL_BATCH, MAX_STEPS, VALIDATE_EVERY = 8, 20, 5
# float32 sums in a different order (per-rank losses, then the all-reduce): a few ulps.
VAL_BPC_TOLERANCE = dict(rel=1e-5, abs=1e-5)
# Rank 0's own half of the batch is off by up to ~1e-3 from the global batch's loss.
TRAIN_LOSS_TOLERANCE = dict(rel=1e-5, abs=1e-5)
WEIGHT_TOLERANCE = 1e-5

TINY_FIT = [
    "data.seq_len=16",
    "model.net.embedding_dim=16",
    "model.net.hidden_size=32",
    "model.net.num_layers=2",
    "model.net.dropout=0",
    f"trainer.max_steps={MAX_STEPS}",
    f"trainer.val_check_interval={VALIDATE_EVERY}",
    "trainer.limit_val_batches=2",
    "trainer.log_every_n_steps=1",
    "seed=11",
]


def fit_in_this_process(run_dir: Path, *overrides: str) -> Path:
    """The one-process run: the same command line, run in the test's process."""
    from sru_lightning.app import cli

    # no progress bar drawn into the test's captured output; it does not touch the training
    assert cli.main(["fit", f"hydra.run.dir={run_dir}", *TINY_FIT, *overrides, "~callbacks.rich_progress_bar"]) == 0
    return run_dir


def fit(run_dir: Path, *overrides: str) -> Path:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "sru_lightning", "fit", f"hydra.run.dir={run_dir}", *TINY_FIT, *overrides]
    completed = preloaded.run(
        command, cwd=REPO, env=env, capture_output=True, text=True, timeout=400, preload_children=True
    )
    assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-3000:]
    return run_dir


def validation_curve(run_dir: Path) -> dict[int, float]:
    with (run_dir / "csv" / "metrics.csv").open() as handle:
        return {int(row["step"]): float(row["val_bpc"]) for row in csv.DictReader(handle) if row.get("val_bpc")}


def training_curves(run_dir: Path) -> dict[str, dict[int, float]]:
    """The per-step `train_loss` and `train_bpc` rows of metrics.csv, by optimizer step."""
    curves: dict[str, dict[int, float]] = {"train_loss": {}, "train_bpc": {}}
    with (run_dir / "csv" / "metrics.csv").open() as handle:
        for row in csv.DictReader(handle):
            for name, curve in curves.items():
                if row.get(name):
                    curve[int(row["step"])] = float(row[name])
    return curves


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert checkpoint["global_step"] == MAX_STEPS
    return checkpoint["state_dict"]


@pytest.mark.slow
def test_ddp_cpu_matches_one_process_with_the_same_global_batch(tmp_path):
    single = fit_in_this_process(tmp_path / "single", "trainer=cpu", f"data.batch_size={GLOBAL_BATCH}")
    ddp = fit(tmp_path / "ddp", "trainer=ddp_cpu", f"data.batch_size={GLOBAL_BATCH // 2}")

    expected, got = validation_curve(single), validation_curve(ddp)
    checkpoints = [VALIDATE_EVERY * k - 1 for k in range(1, MAX_STEPS // VALIDATE_EVERY + 1)]
    assert sorted(expected) == sorted(got) == checkpoints
    for step in checkpoints:
        assert got[step] == pytest.approx(expected[step], **VAL_BPC_TOLERANCE), f"val_bpc at step {step}"
    assert expected[checkpoints[-1]] < expected[checkpoints[0]], "the model must actually learn"

    for name, expected_curve in training_curves(single).items():
        got_curve = training_curves(ddp)[name]
        assert sorted(expected_curve) == sorted(got_curve) and len(expected_curve) == MAX_STEPS, name
        differences = {
            step: (got_curve[step], loss)
            for step, loss in expected_curve.items()
            if got_curve[step] != pytest.approx(loss, **TRAIN_LOSS_TOLERANCE)
        }
        assert not differences, f"{name} (two processes, one process) differs at steps {differences}"

    single_weights, ddp_weights = final_weights(single), final_weights(ddp)
    assert single_weights.keys() == ddp_weights.keys()
    largest = max(
        (single_weights[k].float() - ddp_weights[k].float()).abs().max().item()
        for k in single_weights
        if single_weights[k].is_floating_point()
    )
    assert largest < WEIGHT_TOLERANCE, f"weights differ by up to {largest:.2e}"
    # the training really ran in two processes: Lightning's launcher gives rank 1 its own Hydra job
    assert (ddp / "train_ddp_process_1.log").exists()


@pytest.mark.slow
def test_ddp_cpu_from_shards_matches_one_process(tmp_path):
    # Each rank maps the same prepared files and reads only its own streams.
    from sru_lightning.data import PydocDataModule
    from sru_lightning.data.prepare import PrepareOptions, prepare_corpus
    from sru_lightning.data.sources import reading_of

    module = PydocDataModule()
    options = PrepareOptions(workers=1, shard_mb=0.1, progress=False)  # several shards per split
    folder = prepare_corpus(reading_of(module), module.token_level, tmp_path / "shards", options=options).folder
    shards = ("data=shards", f"data.path={folder}")
    single = fit_in_this_process(tmp_path / "single", "trainer=cpu", *shards, f"data.batch_size={GLOBAL_BATCH}")
    ddp = fit(tmp_path / "ddp", "trainer=ddp_cpu", *shards, f"data.batch_size={GLOBAL_BATCH // 2}")
    expected, got = validation_curve(single), validation_curve(ddp)
    assert sorted(expected) == sorted(got) and expected
    for step, value in expected.items():
        assert got[step] == pytest.approx(value, **VAL_BPC_TOLERANCE), f"val_bpc at step {step}"
    single_weights, ddp_weights = final_weights(single), final_weights(ddp)
    largest = max((single_weights[k] - ddp_weights[k]).abs().max().item() for k in single_weights)
    assert largest < WEIGHT_TOLERANCE, f"weights differ by up to {largest:.2e}"
    assert (ddp / "train_ddp_process_1.log").exists()
