"""TrainingThroughput: tokens per second over the timed batches, the FLOPs of a training batch
counted on the first one (the SRU recurrence included, as FlopCounterMode counts it), and MFU
only where the device's peak is known."""

from __future__ import annotations

import math

import pytest
import torch
from helpers.language_models import language_model as build_language_model
from helpers.tiny_trainer import tiny_trainer
from lightning.fabric.utilities.throughput import measure_flops
from lightning.pytorch import seed_everything

from sru_lightning.callbacks import TrainingThroughput
from sru_lightning.models import SRULanguageModel

VOCAB, BATCH, SEQ_LEN = 12, 4, 8


def language_model() -> SRULanguageModel:
    seed_everything(3, verbose=False)
    return build_language_model(
        vocab_size=VOCAB,
        embedding_dim=8,
        hidden_size=16,
        num_layers=2,
        dropout=0.0,
        optimizer={"_target_": "torch.optim.Adam", "lr": 1e-2},
    )


def windows(steps: int) -> torch.utils.data.DataLoader:
    generator = torch.Generator().manual_seed(5)
    streams = torch.randint(0, VOCAB, (BATCH, steps * SEQ_LEN + 1), generator=generator)
    batches = [
        (streams[:, k * SEQ_LEN : (k + 1) * SEQ_LEN], streams[:, k * SEQ_LEN + 1 : (k + 1) * SEQ_LEN + 1])
        for k in range(steps)
    ]
    return torch.utils.data.DataLoader(batches, batch_size=None)


def fit(steps: int, **options) -> TrainingThroughput:
    throughput = TrainingThroughput(**options)
    trainer = tiny_trainer(max_steps=steps, callbacks=[throughput])
    trainer.fit(language_model(), windows(steps))
    return throughput


def test_a_training_batch_counts_the_forward_and_backward_flops_of_the_model():
    throughput = fit(3)
    model = language_model()
    tokens = torch.zeros(BATCH, SEQ_LEN, dtype=torch.long)
    expected = measure_flops(model, lambda: model(tokens)[0], lambda logits: logits.sum())
    assert expected > 0
    assert throughput.flops_per_batch == pytest.approx(expected, rel=0.01)
    # every batch's tokens, the counted one not timed: two timed batches
    assert throughput.tokens == 3 * BATCH * SEQ_LEN and throughput.timed_tokens == 2 * BATCH * SEQ_LEN
    assert throughput.timed_batches == 2 and throughput.tokens_per_second > 0
    assert throughput.flops_per_second == pytest.approx(2 * throughput.flops_per_batch / throughput.seconds)
    assert throughput.peak_flops is None and throughput.mfu is None  # no known peak for a CPU


def test_mfu_is_the_rate_over_the_devices_peak():
    throughput = fit(2)
    throughput.peak_flops = 4 * throughput.flops_per_second
    assert throughput.mfu == pytest.approx(0.25)


def test_one_batch_is_counted_and_not_timed_so_no_rate_is_made_up():
    throughput = fit(1)
    assert throughput.flops_per_batch > 0 and throughput.tokens == BATCH * SEQ_LEN
    assert math.isnan(throughput.tokens_per_second) and throughput.flops_per_second is None


def test_without_counting_every_batch_is_timed():
    throughput = fit(2, count_flops=False)
    assert throughput.flops_per_batch is None and throughput.flops_per_second is None
    assert throughput.timed_batches == 2 and throughput.tokens_per_second > 0
