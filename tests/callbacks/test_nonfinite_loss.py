"""StopOnNonFiniteLoss stops a real fit on a NaN or Inf training loss, naming the step, and
leaves a fit with finite losses alone."""

from __future__ import annotations

import math

import pytest
import torch
from helpers.tiny_regression import Regression
from helpers.tiny_trainer import tiny_trainer

from sru_lightning.callbacks.nonfinite_loss import NonFiniteLossError, StopOnNonFiniteLoss


class LossWithAnOffset(Regression):
    """A tiny regression whose loss gets `offset` added at batch `bad_batch` of the first epoch.

    A constant offset has no gradient, so the weights stay finite and later losses are finite
    again: what the callback sees is exactly the loss of that one batch.
    """

    def __init__(self, bad_batch: int | None = None, offset: float = math.nan):
        super().__init__(samples=16, batch_size=4)
        self.bad_batch, self.offset = bad_batch, offset
        self.batches_run = 0

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.batches_run += 1
        if batch_idx == self.bad_batch and self.current_epoch == 0:
            loss = loss + self.offset
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def fit(model, callback, tmp_path, **trainer_args):
    trainer = tiny_trainer(
        max_epochs=2, accelerator="cpu", default_root_dir=tmp_path, callbacks=[callback], **trainer_args
    )
    trainer.fit(model)
    return trainer


@pytest.mark.parametrize("offset, shown", [(math.nan, "nan"), (math.inf, "inf")])
def test_a_non_finite_loss_stops_the_fit_naming_the_step(tmp_path, offset, shown):
    model = LossWithAnOffset(bad_batch=2, offset=offset)
    with pytest.raises(NonFiniteLossError) as stopped:
        fit(model, StopOnNonFiniteLoss(), tmp_path)
    # batch 2's optimizer step has run when the batch ends: the trainer is at step 3
    assert str(stopped.value).startswith(
        f"the training loss is {shown} at optimizer step 3 (epoch 0, batch 2); training stopped. Likely causes: "
    )
    assert "trainer.gradient_clip_val" in str(stopped.value)
    assert model.batches_run == 3, "the fit went on after the non-finite loss"


def test_the_likely_causes_leave_out_clipping_when_it_is_set(tmp_path):
    with pytest.raises(NonFiniteLossError) as stopped:
        fit(LossWithAnOffset(bad_batch=0), StopOnNonFiniteLoss(), tmp_path, gradient_clip_val=1.0)
    assert "gradient_clip_val" not in str(stopped.value)
    assert "the learning rate is too high" in str(stopped.value)


def test_finite_losses_do_not_stop_the_fit(tmp_path):
    model = LossWithAnOffset()
    trainer = fit(model, StopOnNonFiniteLoss(), tmp_path)
    assert trainer.global_step == 8 and model.batches_run == 8


def test_a_loss_between_two_checks_is_not_looked_at(tmp_path):
    # check_every_n_steps=2 reads the loss of batches 0 and 2 only; the NaN of batch 1 passes.
    model = LossWithAnOffset(bad_batch=1)
    trainer = fit(model, StopOnNonFiniteLoss(check_every_n_steps=2), tmp_path)
    assert trainer.global_step == 8


@pytest.mark.parametrize("value", [0, -1, True, 1.5])
def test_a_bad_check_interval_is_refused(value):
    with pytest.raises(ValueError, match=f"`check_every_n_steps` must be a positive integer, got {value!r}"):
        StopOnNonFiniteLoss(check_every_n_steps=value)
