"""ResumableDataLoader keeps its place in the epoch through a state dict, and its shuffled
order is the permutation DistributedSampler draws."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import TensorDataset

from sru_lightning.data import EpochSeededRandomSampler, ResumableDataLoader


def test_loader_state_counts_batches_and_skips_them_after_load():
    dataset = TensorDataset(torch.arange(10.0))
    loader = ResumableDataLoader(dataset, batch_size=2, shuffle=True, seed=3)
    full_epoch = [batch[0].tolist() for batch in loader]
    iterator = iter(loader)
    next(iterator), next(iterator)
    state = loader.state_dict()
    assert state == {"batches_yielded": 2, "num_batches": 5}

    fresh = ResumableDataLoader(dataset, batch_size=2, shuffle=True, seed=3)
    fresh.load_state_dict(state)
    assert [batch[0].tolist() for batch in fresh] == full_epoch[2:]
    assert fresh.state_dict()["batches_yielded"] == 5
    # the skip applies once: the next epoch starts from its first batch
    assert len(list(fresh)) == 5


def test_loader_state_with_a_different_length_warns():
    loader = ResumableDataLoader(TensorDataset(torch.arange(10.0)), batch_size=5)
    with pytest.warns(UserWarning, match="5 batches per epoch, this loader has 2"):
        loader.load_state_dict({"batches_yielded": 3, "num_batches": 5})
    assert list(loader) == []


def test_loader_load_state_dict_names_the_missing_key():
    loader = ResumableDataLoader(TensorDataset(torch.arange(4.0)), batch_size=2)
    with pytest.raises(ValueError, match="'batches_yielded'"):
        loader.load_state_dict({"position": 1})


def test_epoch_seeded_sampler_matches_distributed_sampler_permutation():
    from torch.utils.data import DistributedSampler

    dataset = list(range(20))
    ours = EpochSeededRandomSampler(dataset, seed=5)
    theirs = DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=5)
    for epoch in (0, 3):
        ours.set_epoch(epoch)
        theirs.set_epoch(epoch)
        assert list(ours) == list(theirs)
    assert list(ours) != list(range(20))
