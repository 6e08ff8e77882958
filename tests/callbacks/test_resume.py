"""Interrupted fits resume exactly: the data position and the random numbers after a resume
(in process; the end-to-end version, a real `python -m sru_lightning fit` killed with
SIGTERM/SIGINT, lives in tests/app/test_signals.py)."""

from __future__ import annotations

import signal

import lightning.pytorch as pl
import pytest
import torch
from helpers.interruptible_fit import MAX_STEPS, STOP_AT_STEP, DropoutRegressor, SignalAtStep, make_trainer
from lightning.pytorch.callbacks import OnExceptionCheckpoint
from torch.utils.data import DataLoader

from sru_lightning.callbacks import GracefulInterrupt, RestoreDataPosition, SeedEveryBatch
from sru_lightning.data import ResumableDataLoader


def resume_callbacks(enabled=True):
    return [SeedEveryBatch(), RestoreDataPosition()] if enabled else []


def losses_of_uninterrupted_run(tmp_path, loader_cls=ResumableDataLoader, seed_callback=True, step_schedule=False):
    pl.seed_everything(0)
    model = DropoutRegressor(loader_cls, step_schedule)
    callbacks = resume_callbacks(seed_callback)
    make_trainer(tmp_path / "full", callbacks).fit(model)
    return model.step_losses


def interrupt_and_resume(tmp_path, signum, loader_cls=ResumableDataLoader, seed_callback=True, step_schedule=False):
    """Run until a signal at STOP_AT_STEP, then resume the checkpoint in a fresh model."""
    checkpoint_dir = tmp_path / "ckpt"
    seeding = resume_callbacks(seed_callback)

    pl.seed_everything(0)
    interrupted = DropoutRegressor(loader_cls, step_schedule)
    stop = [OnExceptionCheckpoint(checkpoint_dir), GracefulInterrupt(), SignalAtStep(STOP_AT_STEP, signum)]
    # Lightning ends a SIGTERM'd fit with SystemExit; the first SIGINT behaves the same.
    with pytest.raises(SystemExit) as stopped:
        make_trainer(tmp_path / "interrupted", seeding + stop).fit(interrupted)
    assert stopped.value.code is None, "the clean stop, not the KeyboardInterrupt abort"
    checkpoint = checkpoint_dir / "on_exception.ckpt"
    assert checkpoint.is_file(), "no checkpoint was left by the interrupted fit"
    assert max(interrupted.step_losses) == STOP_AT_STEP - 1, "training did not stop at the batch boundary"

    pl.seed_everything(0)  # the same seed as the interrupted run, as a rerun of its config has
    torch.manual_seed(123)  # but a different generator state: nothing may depend on it
    resumed = DropoutRegressor(loader_cls, step_schedule)
    make_trainer(tmp_path / "resumed", list(seeding)).fit(resumed, ckpt_path=str(checkpoint))
    return resumed.step_losses


@pytest.mark.parametrize(
    "signum, step_schedule",
    [(signal.SIGTERM, False), (signal.SIGINT, False), (signal.SIGTERM, True)],
    ids=["SIGTERM", "SIGINT", "SIGTERM-step-schedule"],
)
def test_mid_epoch_resume_reproduces_uninterrupted_losses(tmp_path, signum, step_schedule):
    expected = losses_of_uninterrupted_run(tmp_path, step_schedule=step_schedule)
    resumed = interrupt_and_resume(tmp_path, signum, step_schedule=step_schedule)
    assert sorted(resumed) == list(range(STOP_AT_STEP, MAX_STEPS))
    for step, loss in resumed.items():
        assert loss == pytest.approx(expected[step], rel=1e-6, abs=1e-7), f"step {step}"


def test_plain_dataloader_and_global_rng_do_not_reproduce(tmp_path):
    # The same experiment without the two fault-tolerance pieces diverges after the resume,
    # which is what makes the test above meaningful.
    expected = losses_of_uninterrupted_run(tmp_path, DataLoader, seed_callback=False)
    resumed = interrupt_and_resume(tmp_path, signal.SIGTERM, DataLoader, seed_callback=False)
    differences = [abs(resumed[step] - expected[step]) for step in resumed]
    assert max(differences) > 1e-4


def test_without_restore_data_position_a_step_schedule_loses_the_data_position(tmp_path):
    # Lightning alone drops the loader state when configure_optimizers has read
    # estimated_stepping_batches; RestoreDataPosition is what makes the test above pass.
    pl.seed_everything(0)
    model = DropoutRegressor(step_schedule=True)
    checkpoint_dir = tmp_path / "ckpt"
    stop = [OnExceptionCheckpoint(checkpoint_dir), SignalAtStep(STOP_AT_STEP, signal.SIGTERM)]
    with pytest.raises(SystemExit):
        make_trainer(tmp_path / "a", [SeedEveryBatch(), *stop]).fit(model)
    positions = {}

    class RecordPosition(pl.Callback):
        def __init__(self, name):
            self.name = name

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            positions.setdefault(self.name, trainer.train_dataloader._batches_yielded)

    for name, extra in (("lightning only", []), ("with RestoreDataPosition", [RestoreDataPosition()])):
        make_trainer(tmp_path / name, [RecordPosition(name), *extra]).fit(
            DropoutRegressor(step_schedule=True), ckpt_path=str(checkpoint_dir / "on_exception.ckpt")
        )
    # 12 batches per epoch: step 17 is the 6th batch of the second epoch
    assert positions == {"lightning only": 1, "with RestoreDataPosition": STOP_AT_STEP % 12 + 1}


def test_seed_every_batch_mixes_seed_batch_and_rank():
    seeds = {SeedEveryBatch.batch_seed(s, b, r) for s in (0, 1) for b in (0, 1, 2) for r in (0, 1)}
    assert len(seeds) == 12
    assert all(0 <= value < 2**63 for value in seeds)
    assert SeedEveryBatch.batch_seed(0, 5, 1) == SeedEveryBatch.batch_seed(0, 5, 1)
