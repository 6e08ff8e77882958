"""PacedRichProgressBar updates the training bar at most `refresh_rate` times a second, and shows
the same final count as Lightning's bar: at an epoch's end, at a `max_steps` stop mid-epoch."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from helpers.tiny_trainer import tiny_trainer
from lightning.pytorch.callbacks import Callback, RichProgressBar
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from sru_lightning.callbacks import PacedRichProgressBar

pytest.importorskip("rich", reason="the Rich progress bar needs the rich package (a Lightning extra)")


class Regression(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(2, 1)

    def train_dataloader(self):
        inputs = torch.randn(64, 2, generator=torch.Generator().manual_seed(0))
        return DataLoader(TensorDataset(inputs, inputs.sum(1, keepdim=True)), batch_size=2)

    def training_step(self, batch, batch_idx):
        inputs, targets = batch
        loss = nn.functional.mse_loss(self.net(inputs), targets)
        self.log("loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class ShownCount(Callback):
    """The training bar's count when each epoch and the fit end (after the bar's own hooks)."""

    def __init__(self, bar: RichProgressBar) -> None:
        self.bar, self.counts = bar, []

    def _count(self) -> int:
        return int(self.bar.progress.tasks[self.bar.train_progress_bar_id].completed)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.counts.append(self._count())

    def on_train_end(self, trainer, pl_module) -> None:
        self.counts.append(self._count())


def _fit(bar: RichProgressBar, tmp_path, monkeypatch, **settings) -> tuple[list[int], int]:
    updates = []
    original = RichProgressBar.on_train_batch_end

    def counted(self, *args, **kwargs):
        updates.append(args[-1])
        return original(self, *args, **kwargs)

    monkeypatch.setattr(RichProgressBar, "on_train_batch_end", counted)
    shown = ShownCount(bar)
    trainer = tiny_trainer(default_root_dir=tmp_path, enable_progress_bar=True, callbacks=[bar, shown], **settings)
    trainer.fit(Regression())
    return shown.counts, len(updates)


def test_the_bar_updates_at_most_refresh_rate_times_a_second_and_ends_on_the_full_count(tmp_path, monkeypatch):
    counts, updates = _fit(PacedRichProgressBar(refresh_rate=1), tmp_path, monkeypatch, max_epochs=2)
    assert counts == [32, 32, 32]  # both epochs end full, and so does the fit
    # 64 batches of a few milliseconds: about the first and the last of each epoch
    assert updates <= 8, updates


def test_a_max_steps_stop_mid_epoch_shows_its_last_step(tmp_path, monkeypatch):
    counts, updates = _fit(PacedRichProgressBar(refresh_rate=1), tmp_path, monkeypatch, max_steps=21)
    assert counts == [21, 21]  # the epoch and the fit end at step 21 of 32, as shown
    assert updates <= 4, updates


def test_lightnings_bar_updates_after_every_batch(tmp_path, monkeypatch):
    # what the paced bar saves: Lightning's own updates the bar at each of the 64 batches
    counts, updates = _fit(RichProgressBar(refresh_rate=1), tmp_path, monkeypatch, max_epochs=2)
    assert counts[:2] == [32, 32] and updates == 64
