"""A tiny fit whose losses depend on data order and dropout draws, and a callback that signals
the test process at a given step: the pieces the interruption and resume tests share."""

from __future__ import annotations

import os

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from sru_lightning.data import ResumableDataLoader

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
            optimizer, max_lr=0.02, total_steps=self.trainer.estimated_stepping_batches
        )
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
        max_steps=MAX_STEPS,
        max_epochs=10,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
        callbacks=callbacks,
    )
