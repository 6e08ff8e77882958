"""TrialPruning reports the validation metric of a real fit at the share of its budget used, and
stops the fit at the validation where the search's trial says it is pruned."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from sru_lightning.callbacks.trial_pruning import TrialPruning


class RecordingTrial:
    """A stand-in for an Optuna trial (the callback's only contact with a search): it records the
    reports and answers `should_prune` from a list of decisions, one per report."""

    def __init__(self, decisions: list[bool]) -> None:
        self.decisions = list(decisions)
        self.reports: list[tuple[float, int]] = []
        self.user_attrs: dict[str, object] = {}

    def report(self, value: float, step: int) -> None:
        self.reports.append((value, step))

    def should_prune(self) -> bool:
        return self.decisions[len(self.reports) - 1]

    def set_user_attr(self, key: str, value: object) -> None:
        self.user_attrs[key] = value


class Regression(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(2, 1)

    def _loader(self):
        inputs = torch.randn(40, 2, generator=torch.Generator().manual_seed(0))
        return DataLoader(TensorDataset(inputs, inputs.sum(1, keepdim=True)), batch_size=4)

    train_dataloader = val_dataloader = _loader

    def training_step(self, batch, batch_idx):
        return nn.functional.mse_loss(self.net(batch[0]), batch[1])

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", nn.functional.mse_loss(self.net(batch[0]), batch[1]))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def fit(trial, tmp_path, max_steps=40, num_sanity_val_steps=2):
    trainer = pl.Trainer(
        max_steps=max_steps,
        val_check_interval=5,
        check_val_every_n_epoch=None,
        num_sanity_val_steps=num_sanity_val_steps,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        callbacks=[TrialPruning(trial, "val_loss")],
    )
    trainer.fit(Regression())
    return trainer


def test_every_validation_is_reported_at_its_share_of_max_steps(tmp_path):
    trial = RecordingTrial([False] * 8)
    trainer = fit(trial, tmp_path)
    assert trainer.global_step == 40
    assert [step for _, step in trial.reports] == [12, 25, 38, 50, 62, 75, 88, 100]  # not the sanity check
    assert trial.reports[-1][0] == pytest.approx(trainer.callback_metrics["val_loss"].item())
    assert trial.user_attrs == {}


def test_a_pruned_trial_stops_at_that_validation_and_says_where(tmp_path):
    trial = RecordingTrial([False, True, False])
    trainer = fit(trial, tmp_path)
    assert trainer.global_step == 10
    assert len(trial.reports) == 2 and trial.user_attrs == {"pruned_at": 25}


def test_monitor_must_be_a_metric_name():
    with pytest.raises(ValueError, match="`monitor` must be a metric name, got ''"):
        TrialPruning(RecordingTrial([]), "")
