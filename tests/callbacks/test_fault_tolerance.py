"""Interrupted fits resume exactly: in-process checks of the fault-tolerance pieces.

The end-to-end version (a real `python -m sru_lightning fit` killed with SIGTERM/SIGINT)
lives in tests/app/test_signals.py.
"""

from __future__ import annotations

import os
import signal

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import OnExceptionCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from sru_lightning.callbacks.fault_tolerance import (
    EpochSeededRandomSampler,
    GracefulInterrupt,
    InterruptionCheckpoint,
    RestoreDataPosition,
    ResumableDataLoader,
    SeedEveryBatch,
    interruption_cause,
)

NUM_SAMPLES, BATCH_SIZE = 48, 4  # 12 batches per epoch
MAX_STEPS = 30  # two and a half epochs
STOP_AT_STEP = 17  # mid-epoch of the second epoch


class DropoutRegressor(pl.LightningModule):
    """Tiny model whose losses depend on data order and on dropout draws."""

    def __init__(self, loader_cls=ResumableDataLoader, step_schedule=False):
        super().__init__()
        self.step_schedule = step_schedule
        self.net = nn.Sequential(nn.Linear(3, 16), nn.Tanh(), nn.Dropout(0.3), nn.Linear(16, 1))
        generator = torch.Generator().manual_seed(1)
        inputs = torch.randn(NUM_SAMPLES, 3, generator=generator)
        self.dataset = TensorDataset(inputs, inputs.sum(1, keepdim=True).sin())
        self.loader_cls = loader_cls
        self.step_losses: dict[int, float] = {}

    def train_dataloader(self):
        if self.loader_cls is ResumableDataLoader:
            return ResumableDataLoader(self.dataset, batch_size=BATCH_SIZE, shuffle=True, seed=7)
        return DataLoader(self.dataset, batch_size=BATCH_SIZE, shuffle=True)

    def training_step(self, batch, batch_idx):
        inputs, targets = batch
        loss = nn.functional.mse_loss(self.net(inputs), targets)
        self.step_losses[self.global_step] = loss.item()
        return loss

    def configure_optimizers(self):
        optimizer = torch.optim.Adam(self.parameters(), lr=0.01)
        if not self.step_schedule:
            return optimizer
        # Reading estimated_stepping_batches sets the dataloaders up before the restore.
        schedule = torch.optim.lr_scheduler.OneCycleLR(
            optimizer, max_lr=0.02, total_steps=self.trainer.estimated_stepping_batches)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


class SignalAtStep(pl.Callback):
    """Sends `signum` to this very process once `step` optimizer steps are done."""

    def __init__(self, step: int, signum: int):
        self.step, self.signum = step, signum

    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step == self.step:
            os.kill(os.getpid(), self.signum)


def make_trainer(root, callbacks):
    return pl.Trainer(
        max_steps=MAX_STEPS, max_epochs=10, accelerator="cpu", devices=1, logger=False,
        enable_progress_bar=False, enable_model_summary=False,
        default_root_dir=root, callbacks=callbacks,
    )


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
            DropoutRegressor(step_schedule=True), ckpt_path=str(checkpoint_dir / "on_exception.ckpt"))
    # 12 batches per epoch: step 17 is the 6th batch of the second epoch
    assert positions == {"lightning only": 1, "with RestoreDataPosition": STOP_AT_STEP % 12 + 1}


class DoubleSigint(pl.Callback):
    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step == 3:
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)


def test_a_second_ctrl_c_aborts_at_once_without_a_checkpoint(tmp_path):
    pl.seed_everything(0)
    model = DropoutRegressor()
    graceful = GracefulInterrupt()
    callbacks = [InterruptionCheckpoint(tmp_path / "ckpt", filename="interrupted"), graceful, DoubleSigint()]
    trainer = make_trainer(tmp_path, callbacks)
    with pytest.raises(SystemExit) as stopped:
        trainer.fit(model)
    # Lightning's KeyboardInterrupt path exits with status 1; the graceful SIGTERM path with None
    assert stopped.value.code == 1
    # the abort may land half way through a step: nothing that looks resumable is written
    assert not (tmp_path / "ckpt" / "interrupted.ckpt").exists()
    assert graceful.aborted
    assert interruption_cause(trainer, stopped.value).startswith("aborted by a second Ctrl+C (SIGINT)")


@pytest.mark.parametrize("signum, name", [(signal.SIGINT, "SIGINT (Ctrl+C)"), (signal.SIGTERM, "SIGTERM")])
def test_the_record_names_the_signal_that_stopped_the_fit(tmp_path, signum, name):
    pl.seed_everything(0)
    callbacks = [InterruptionCheckpoint(tmp_path / "ckpt", filename="interrupted"), GracefulInterrupt(),
                 SignalAtStep(5, signum)]
    trainer = make_trainer(tmp_path, callbacks)
    with pytest.raises(SystemExit) as stopped:
        trainer.fit(DropoutRegressor())
    assert interruption_cause(trainer, stopped.value) == f"stopped by {name}"
    checkpoint = torch.load(tmp_path / "ckpt" / "interrupted.ckpt", weights_only=True)
    assert checkpoint["global_step"] == 5
    assert not list((tmp_path / "ckpt").glob("*.partial"))


def test_graceful_interrupt_pickles_for_spawned_processes():
    import pickle

    copy = pickle.loads(pickle.dumps(GracefulInterrupt(stop_timeout=7)))
    assert copy.stop_timeout == 7 and copy.received_signal is None


def test_graceful_interrupt_refuses_a_bad_stop_timeout():
    with pytest.raises(ValueError, match="`stop_timeout` must be a positive number of seconds, got 0"):
        GracefulInterrupt(stop_timeout=0)


def test_graceful_interrupt_restores_the_previous_sigint_handler(tmp_path):
    before = signal.getsignal(signal.SIGINT)
    pl.seed_everything(0)
    make_trainer(tmp_path, [GracefulInterrupt()]).fit(DropoutRegressor())
    assert signal.getsignal(signal.SIGINT) is before


def test_loader_state_counts_batches_and_skips_them_after_load():
    dataset = TensorDataset(torch.arange(10.0))
    loader = ResumableDataLoader(dataset, batch_size=2, shuffle=True, seed=3)
    full_epoch = [batch[0].tolist() for batch in loader]
    iterator = iter(loader)
    next(iterator), next(iterator)
    state = loader.state_dict()
    assert state == {"batches_yielded": 2, "num_batches": 5}

    fresh = ResumableDataLoader(dataset, batch_size=2, shuffle=True, seed=3)
    fresh.load_state_dict(state)
    assert [batch[0].tolist() for batch in fresh] == full_epoch[2:]
    assert fresh.state_dict()["batches_yielded"] == 5
    # the skip applies once: the next epoch starts from its first batch
    assert len(list(fresh)) == 5


def test_loader_state_with_a_different_length_warns():
    loader = ResumableDataLoader(TensorDataset(torch.arange(10.0)), batch_size=5)
    with pytest.warns(UserWarning, match="5 batches per epoch, this loader has 2"):
        loader.load_state_dict({"batches_yielded": 3, "num_batches": 5})
    assert list(loader) == []


def test_loader_load_state_dict_names_the_missing_key():
    loader = ResumableDataLoader(TensorDataset(torch.arange(4.0)), batch_size=2)
    with pytest.raises(ValueError, match="'batches_yielded'"):
        loader.load_state_dict({"position": 1})


def test_epoch_seeded_sampler_matches_distributed_sampler_permutation():
    from torch.utils.data import DistributedSampler

    dataset = list(range(20))
    ours = EpochSeededRandomSampler(dataset, seed=5)
    theirs = DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=5)
    for epoch in (0, 3):
        ours.set_epoch(epoch)
        theirs.set_epoch(epoch)
        assert list(ours) == list(theirs)
    assert list(ours) != list(range(20))


def test_seed_every_batch_mixes_seed_batch_and_rank():
    seeds = {SeedEveryBatch.batch_seed(s, b, r) for s in (0, 1) for b in (0, 1, 2) for r in (0, 1)}
    assert len(seeds) == 12
    assert all(0 <= value < 2**63 for value in seeds)
    assert SeedEveryBatch.batch_seed(0, 5, 1) == SeedEveryBatch.batch_seed(0, 5, 1)


def test_the_stop_watchdog_stands_down_when_the_fit_has_ended():
    """A stop that completed must not end the process later: a script, a notebook or a test
    process goes on after an interrupted fit. Inside a fit that cannot finish stopping, the
    same watchdog ends its process (checked in a child process)."""
    import subprocess
    import sys
    import time

    graceful = GracefulInterrupt(stop_timeout=0.3)
    graceful.start_watchdog(signal.SIGTERM)  # outside any fit: as after trainer.fit returned
    time.sleep(0.8)  # past the timeout: this test process is still here
    graceful.teardown(None, None, "fit")
    assert graceful._stop_finished.is_set()

    code = """
import signal, time
import lightning.pytorch as pl
from lightning.pytorch.demos.boring_classes import BoringModel
from sru_lightning.callbacks.fault_tolerance import GracefulInterrupt

graceful = GracefulInterrupt(stop_timeout=0.5)

class StuckStop(pl.Callback):
    def on_train_start(self, trainer, pl_module):
        graceful.start_watchdog(signal.SIGTERM)
        time.sleep(60)  # a stop that never completes, inside trainer.fit

trainer = pl.Trainer(accelerator="cpu", max_steps=1, callbacks=[graceful, StuckStop()], logger=False,
                     enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
trainer.fit(BoringModel())
"""
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert child.returncode == 1, child.stderr[-2000:]
    assert "has not finished stopping" in child.stderr
