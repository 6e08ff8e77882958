"""SIGTERM and Ctrl+C stop a fit at a batch boundary with a checkpoint (in process; the
end-to-end version lives in tests/app/test_signals.py)."""

from __future__ import annotations

import os
import signal

import lightning.pytorch as pl
import pytest
import torch
from helpers import preloaded
from helpers.interruptible_fit import DropoutRegressor, SignalAtStep, make_trainer

from sru_lightning.callbacks import GracefulInterrupt, InterruptionCheckpoint
from sru_lightning.callbacks.graceful_interrupt import interruption_cause


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
    callbacks = [
        InterruptionCheckpoint(tmp_path / "ckpt", filename="interrupted"),
        GracefulInterrupt(),
        SignalAtStep(5, signum),
    ]
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


@pytest.mark.slow  # starts processes or a compiler
def test_the_stop_watchdog_stands_down_when_the_fit_has_ended():
    """A stop that completed must not end the process later: a script, a notebook or a test
    process goes on after an interrupted fit. Inside a fit that cannot finish stopping, the
    same watchdog ends its process (checked in a child process)."""
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
from sru_lightning.callbacks import GracefulInterrupt

graceful = GracefulInterrupt(stop_timeout=0.5)

class StuckStop(pl.Callback):
    def on_train_start(self, trainer, pl_module):
        graceful.start_watchdog(signal.SIGTERM)
        time.sleep(60)  # a stop that never completes, inside trainer.fit

trainer = pl.Trainer(accelerator="cpu", max_steps=1, callbacks=[graceful, StuckStop()], logger=False,
                     enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
trainer.fit(BoringModel())
"""
    child = preloaded.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert child.returncode == 1, child.stderr[-2000:]
    assert "has not finished stopping" in child.stderr


def _interrupted_fit(root, stop_at: int) -> str:
    """A user's script, first part: a fit stopped by SIGTERM after `stop_at` steps; the checkpoint."""
    pl.seed_everything(0)
    callbacks = [
        InterruptionCheckpoint(root / "ckpt", filename="interrupted"),
        GracefulInterrupt(),
        SignalAtStep(stop_at, signal.SIGTERM),
    ]
    with pytest.raises(SystemExit):
        make_trainer(root, callbacks).fit(DropoutRegressor())
    checkpoint = root / "ckpt" / "interrupted.ckpt"
    assert checkpoint.is_file()
    return str(checkpoint)


def _readme_callbacks(root) -> list[pl.Callback]:
    """The callback list docs/fault-tolerance.md gives for a user's own script (same checkpoint folder)."""
    from sru_lightning.callbacks import RestoreDataPosition, SeedEveryBatch, StopOnNonFiniteLoss

    return [
        InterruptionCheckpoint(root / "ckpt", filename="interrupted"),
        GracefulInterrupt(),
        RestoreDataPosition(),
        SeedEveryBatch(seed=0),
        StopOnNonFiniteLoss(),
    ]


def test_a_new_model_fitted_after_an_interruption_starts_fresh(tmp_path, recwarn):
    """The callback never chooses what a fit resumes: Lightning resumes a fit without
    `ckpt_path` from its `OnExceptionCheckpoint`s, which this callback must not be."""
    _interrupted_fit(tmp_path, stop_at=10)
    recwarn.clear()
    model = DropoutRegressor()
    trainer = make_trainer(tmp_path, _readme_callbacks(tmp_path))
    trainer.fit(model)
    assert min(model.step_losses) == 0, f"the new model resumed at step {min(model.step_losses)}"
    assert trainer.global_step == trainer.max_steps
    lightning_guesses = [str(w.message) for w in recwarn if "ckpt_path=None" in str(w.message)]
    assert not lightning_guesses, lightning_guesses


def test_an_interruption_checkpoint_resumes_when_the_caller_passes_it(tmp_path):
    checkpoint = _interrupted_fit(tmp_path, stop_at=10)
    model = DropoutRegressor()
    make_trainer(tmp_path, _readme_callbacks(tmp_path)).fit(model, ckpt_path=checkpoint)
    assert min(model.step_losses) == 10, "the fit continues at the step after the interruption"
    assert not (tmp_path / "ckpt" / "interrupted.ckpt").exists(), "a completed fit supersedes it"


def test_only_a_fit_that_resumed_the_interruption_checkpoint_removes_it(tmp_path):
    """The docs' snippet: `trainer.fit(model)` starts fresh beside an `interrupted.ckpt` it never
    read (another run's, or one the user keeps for later); it and an evaluation of that file leave
    it as it was. The fit that resumes from it and completes supersedes it."""
    import hashlib
    from pathlib import Path

    checkpoint = _interrupted_fit(tmp_path, stop_at=10)
    before = hashlib.sha256(Path(checkpoint).read_bytes()).hexdigest()
    trainer = make_trainer(tmp_path, _readme_callbacks(tmp_path))
    trainer.fit(DropoutRegressor())
    assert os.path.isfile(checkpoint), "a fresh fit removed an interruption checkpoint it never resumed"
    evaluated = _Validated()
    trainer.validate(evaluated, ckpt_path=checkpoint, dataloaders=evaluated.train_dataloader())
    assert os.path.isfile(checkpoint), "an evaluation of the interruption checkpoint removed it"
    assert hashlib.sha256(Path(checkpoint).read_bytes()).hexdigest() == before
    make_trainer(tmp_path, _readme_callbacks(tmp_path)).fit(DropoutRegressor(), ckpt_path=checkpoint)
    assert not os.path.exists(checkpoint), "the fit that resumed it supersedes it"


class _Validated(DropoutRegressor):
    def validation_step(self, batch, batch_idx):
        inputs, targets = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(inputs), targets))
