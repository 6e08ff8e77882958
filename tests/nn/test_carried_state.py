"""CarriedState: the per-stage state a model carries from batch to batch, and its checkpoint entry."""

from __future__ import annotations

import pytest
import torch

from sru_lightning.nn import CarriedState


def test_a_kept_state_is_detached_and_starts_the_next_batch_of_the_same_size_only():
    carried = CarriedState()
    c = torch.randn(2, 3, 4, requires_grad=True) * 2
    carried.keep("train", c)
    assert not carried.get("train").requires_grad
    assert carried.initial("train", 3) is carried.get("train")
    assert carried.initial("train", 4) is None  # another batch layout: zeros
    assert carried.initial("val", 3) is None
    carried.reset("train")
    assert carried.initial("train", 3) is None


def test_tuple_states_and_a_disabled_carry():
    carried = CarriedState()
    state = (torch.zeros(1, 2, 3), torch.ones(5, 2, 3))
    carried.keep("val", state)
    assert isinstance(carried.initial("val", 2), tuple)
    carried.reset()
    assert "val" not in carried
    off = CarriedState(enabled=False)
    off.keep("train", torch.zeros(1, 2, 3))
    assert off.initial("train", 2) is None
    with pytest.raises(ValueError, match="`enabled` must be true or false, got 'yes'"):
        CarriedState(enabled="yes")


def test_the_checkpoint_entry_round_trips_and_refuses_another_world_size():
    carried = CarriedState()
    assert carried.checkpoint_entry() is None
    state = (torch.randn(1, 2, 3), torch.randn(4, 2, 3))
    carried.keep("train", state)
    entry = carried.checkpoint_entry("train", world_size=1)
    assert entry["world_size"] == 1 and len(entry["per_rank"]) == 1
    restored = CarriedState()
    assert restored.restore(entry, "train", world_size=1, rank=0)
    assert all(torch.equal(a, b) for a, b in zip(restored.initial("train", 2), state))
    assert not CarriedState().restore(entry, "train", world_size=2, rank=1)
