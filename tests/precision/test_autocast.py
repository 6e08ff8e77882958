"""Plain torch.autocast("cpu", dtype=torch.float16) training steps, no Lightning: the fp32 and
half policies store the recurrence in the dtype they promise, gradients flow, loss falls."""

import pytest
import torch
from torch import nn

from sru_lightning.nn import SRU, set_recurrence_policy
from sru_lightning.ops import trace_storage_dtypes


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 16)
        self.rnn = SRU(16, 16, num_layers=2, bidirectional=True)
        self.head = nn.Linear(32, 10)

    def forward(self, tokens):
        h, _ = self.rnn(self.embed(tokens))  # embedding output stays fp32 under autocast
        return self.head(h)


@pytest.mark.parametrize("policy, storage", [("fp32", torch.float32), ("half", torch.float16), ("auto", torch.float16)])
def test_autocast_fp16_training_steps(policy, storage):
    model = Tagger()
    assert len(set_recurrence_policy(model, policy)) == 2
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-2)
    tokens = torch.randint(0, 10, (6, 4))
    targets = (tokens * 3) % 10
    losses = []
    with trace_storage_dtypes() as calls:
        for _ in range(8):
            optimizer.zero_grad()
            with torch.autocast("cpu", dtype=torch.float16):
                logits = model(tokens)
                loss = nn.functional.cross_entropy(logits.float().reshape(-1, 10), targets.reshape(-1))
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    assert {call.storage_dtype for call in calls} == {storage}
    assert {call.accumulation_dtype for call in calls} == {torch.float32}
    assert {call.direction for call in calls} == {"forward", "backward"}
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in model.parameters())
    assert losses[-1] < losses[0], losses
