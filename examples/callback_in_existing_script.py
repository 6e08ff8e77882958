"""Add SRU layers and the precision callback to an existing Lightning script (no Hydra).

The model below is an ordinary LightningModule; the only sru_lightning pieces are the
`SRU` layer (a drop-in for nn.LSTM's calling convention) and `SRUPrecisionCallback` in the
Trainer's callbacks. Switch `--precision` freely: the callback picks the recurrence's storage
dtype for each regime, so mixed dtypes never reach the kernel.

    python examples/callback_in_existing_script.py --precision bf16-mixed
    python examples/callback_in_existing_script.py --precision 16-mixed --accelerator gpu
"""

from __future__ import annotations

import argparse
import math

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import nn

from sru_lightning.callbacks import SRUPrecisionCallback
from sru_lightning.callbacks.nonfinite_loss import StopOnNonFiniteLoss
from sru_lightning.data import PydocDataModule
from sru_lightning.nn import SRU


class CharModel(pl.LightningModule):
    """A user's own model: embedding, a recurrent stack, a linear read-out."""

    def __init__(self, vocab_size: int, hidden_size: int = 128) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, hidden_size)
        self.rnn = SRU(hidden_size, hidden_size, num_layers=2)  # was: nn.LSTM(hidden_size, hidden_size, 2)
        self.readout = nn.Linear(hidden_size, vocab_size)

    def loss(self, batch):
        inputs, targets = batch
        output, _ = self.rnn(self.embedding(inputs.t()))  # time-major, like nn.LSTM
        logits = self.readout(output).transpose(0, 1)
        return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1))

    def training_step(self, batch, batch_idx):
        loss = self.loss(batch)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self.loss(batch), prog_bar=True)

    def configure_optimizers(self):
        # Under 16-true the weights are float16, where Adam's default eps (1e-8) rounds to 0
        # and a parameter with a tiny gradient then gets an inf/NaN update.
        eps = 1e-4 if self.dtype == torch.float16 else 1e-8
        return torch.optim.Adam(self.parameters(), lr=3e-3, eps=eps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precision", default="bf16-mixed")
    parser.add_argument("--accelerator", default="auto")
    parser.add_argument("--max-steps", type=int, default=100)
    args = parser.parse_args()

    data = PydocDataModule(batch_size=16, seq_len=64)
    model = CharModel(data.vocab_size)
    trainer = pl.Trainer(
        accelerator=args.accelerator,
        devices=1,
        precision=args.precision,
        max_steps=args.max_steps,
        limit_val_batches=5,
        logger=False,
        enable_checkpointing=False,
        # the one added line, plus a guard that stops on a NaN loss instead of training on
        callbacks=[SRUPrecisionCallback(policy="auto"), StopOnNonFiniteLoss()],
    )
    trainer.fit(model, datamodule=data)
    (result,) = trainer.validate(model, datamodule=data, verbose=False)
    if not math.isfinite(result["val_loss"]):
        raise SystemExit(f"val_loss={result['val_loss']}: the model diverged")
    print(f"val_loss={result['val_loss']:.3f} nats/char")


if __name__ == "__main__":
    main()
