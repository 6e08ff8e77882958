"""A tiny SRU model learns a memory task on CPU in every storage dtype the CPU supports.

Task: read random tokens from an 8-symbol vocabulary and output, at step t, the token seen
at step t-2. Without memory the best cross-entropy is chance, ln 8 = 2.08; the test asks the
mean of the last 5 losses to be below 1.0 and below half the mean of the first 5.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from sru_lightning.nn import SRU
from sru_lightning.ops import trace_storage_dtypes

VOCAB, DELAY, LENGTH, BATCH, STEPS = 8, 2, 12, 32, 60


class DelayedRecall(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 16)
        self.rnn = SRU(16, 32, num_layers=2, bidirectional=False)
        self.head = nn.Linear(32, VOCAB)

    def forward(self, tokens):
        return self.head(self.rnn(self.embed(tokens))[0])


# regime -> (parameter dtype, autocast dtype or None, recurrence storage dtype under "auto")
REGIMES = {
    "fp32": (torch.float32, None, torch.float32),
    "fp64": (torch.float64, None, torch.float64),
    "bf16-mixed": (torch.float32, torch.bfloat16, torch.bfloat16),
    "fp16-mixed": (torch.float32, torch.float16, torch.float16),
    "bf16-true": (torch.bfloat16, None, torch.bfloat16),
    "fp16-true": (torch.float16, None, torch.float16),
}


def train(regime: str) -> tuple[list[float], set]:
    param_dtype, autocast_dtype, _ = REGIMES[regime]
    torch.manual_seed(0)
    data = torch.Generator().manual_seed(0)
    model = DelayedRecall().to(param_dtype)
    # eps must survive fp16 storage (1e-8 rounds to 0 there).
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, eps=1e-4 if param_dtype == torch.float16 else 1e-8)
    losses = []
    with trace_storage_dtypes() as calls:
        for _ in range(STEPS):
            tokens = torch.randint(VOCAB, (LENGTH, BATCH), generator=data)
            targets = torch.roll(tokens, DELAY, dims=0)
            with torch.autocast("cpu", dtype=autocast_dtype or torch.bfloat16, enabled=autocast_dtype is not None):
                logits = model(tokens)
            loss = nn.functional.cross_entropy(logits[DELAY:].float().reshape(-1, VOCAB), targets[DELAY:].reshape(-1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return losses, {call.storage_dtype for call in calls}


@pytest.mark.slow
@pytest.mark.parametrize("regime", list(REGIMES))
def test_tiny_sru_learns_delayed_recall(regime):
    losses, storage_dtypes = train(regime)
    assert storage_dtypes == {REGIMES[regime][2]}, "the recurrence ran in an unexpected storage dtype"
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert math.isfinite(last)
    assert first > 1.9, f"start should be near chance (ln 8 = 2.08), got {first:.3f}"
    assert last < 1.0 and last < 0.5 * first, f"{regime}: loss {first:.3f} -> {last:.3f}"
