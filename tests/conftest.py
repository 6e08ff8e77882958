"""Test tiers (see README): fast tests always run; `peer` needs the `sru` package;
`cuda` needs a CUDA GPU and is skipped with the reason everywhere else."""

from __future__ import annotations

import importlib.util

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    has_cuda = torch.cuda.is_available()
    has_peer = importlib.util.find_spec("sru") is not None
    skip_cuda = pytest.mark.skip(reason="needs a CUDA GPU: torch.cuda.is_available() is False")
    skip_peer = pytest.mark.skip(
        reason="needs the `sru` package for parity tests: pip install 'sru_lightning[test]'"
    )
    for item in items:
        if "cuda" in item.keywords and not has_cuda:
            item.add_marker(skip_cuda)
        if "peer" in item.keywords and not has_peer:
            item.add_marker(skip_peer)


@pytest.fixture(autouse=True)
def _seed_everything():
    torch.manual_seed(0)
    yield
