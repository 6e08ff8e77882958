"""A resumed fit draws the random numbers the uninterrupted one drew.

Lightning does not checkpoint RNG states, and the data pipeline draws from the global
generator at unpredictable moments (every ``iter(DataLoader)`` draws a worker seed).
:class:`SeedEveryBatch` reseeds the generators before every training batch from (seed, batch
index, rank), so dropout after a resume is the dropout the uninterrupted run used.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from sru_lightning._seeds import global_seed

__all__ = ["SeedEveryBatch"]


class SeedEveryBatch(Callback):
    """Reseed Python, NumPy and torch (CPU and every GPU) before each training batch.

    The seed is derived from (``seed``, the batch index counted over the whole fit, the
    global rank), all of which Lightning restores from a checkpoint; a resumed run therefore
    draws the same dropout masks as the uninterrupted one, whatever else consumed random
    numbers in between. ``seed`` defaults to the seed given to `lightning.seed_everything`.
    """

    def __init__(self, seed: int | None = None) -> None:
        super().__init__()
        self.seed = seed

    @staticmethod
    def batch_seed(seed: int, batch_index: int, rank: int) -> int:
        """A well-mixed 63-bit seed for one (seed, batch, rank) triple."""
        digest = hashlib.blake2b(f"{seed}/{batch_index}/{rank}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little") >> 1

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        batch_index = trainer.fit_loop.epoch_loop.total_batch_idx
        value = self.batch_seed(global_seed(self.seed), batch_index, trainer.global_rank)
        random.seed(value)
        if pl_module.device.type in ("cpu", "cuda"):
            # torch.manual_seed also walks every other device backend (about 0.1 ms a batch on
            # a CPU); these two are the generators a CPU or CUDA fit draws from.
            torch.default_generator.manual_seed(value)
            if torch.cuda.is_available():
                torch.cuda.manual_seed_all(value)
        else:
            torch.manual_seed(value)
        try:
            import numpy
        except ImportError:
            return
        numpy.random.seed(value % 2**32)
