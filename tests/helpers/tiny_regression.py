"""A LightningModule of the callback tests: a linear regression on a fixed random dataset, one
process, finite losses, milliseconds a step."""

from __future__ import annotations

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Regression(pl.LightningModule):
    """`samples` points of 2 features whose target is their sum, in batches of `batch_size`."""

    def __init__(self, samples: int = 16, batch_size: int = 4) -> None:
        super().__init__()
        self.net = nn.Linear(2, 1)
        self.samples, self.batch_size = samples, batch_size

    def train_dataloader(self):
        inputs = torch.randn(self.samples, 2, generator=torch.Generator().manual_seed(0))
        return DataLoader(TensorDataset(inputs, inputs.sum(1, keepdim=True)), batch_size=self.batch_size)

    def training_step(self, batch, batch_idx):
        inputs, targets = batch
        return nn.functional.mse_loss(self.net(inputs), targets)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)
