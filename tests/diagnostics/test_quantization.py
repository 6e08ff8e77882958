"""The int8 diagnostic's measure: validation bits with the state carried between batches, as `validate` does."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from helpers.language_models import language_model

from sru_lightning.diagnostics.quantization import validation_bits


def test_validation_bits_carry_the_state_and_restart_it_when_the_batch_changes():
    torch.manual_seed(0)
    model = language_model(vocab_size=11, embedding_dim=6, hidden_size=8, num_layers=1).eval()
    batches = [torch.randint(0, 11, (2, 6)) for _ in range(3)] + [torch.randint(0, 11, (3, 6))]
    loader = [(tokens[:, :-1], tokens[:, 1:]) for tokens in batches]
    nats, count, state = 0.0, 0, None
    with torch.no_grad():
        for index, (inputs, targets) in enumerate(loader):
            logits, state = model(inputs, None if index in (0, 3) else state)  # batch 3 is wider: a new state
            nats += F.cross_entropy(logits.reshape(-1, 11), targets.reshape(-1), reduction="sum").item()
            count += targets.numel()
    assert math.isclose(validation_bits(model, loader), nats / count / math.log(2), rel_tol=1e-6)
    # Without the carried state the figure differs: the state is what it measures with.
    fresh = sum(
        F.cross_entropy(model(inputs)[0].reshape(-1, 11), targets.reshape(-1), reduction="sum").item()
        for inputs, targets in loader
    )
    assert not math.isclose(fresh / count / math.log(2), nats / count / math.log(2), rel_tol=1e-6)
