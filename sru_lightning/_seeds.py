"""The run's seed, as the data order and the per-batch seeds read it (below every library package)."""

from __future__ import annotations

import os


def global_seed(seed: int | None = None) -> int:
    """``seed`` when given, else the seed `lightning.seed_everything` recorded, else 0.

    ``PL_GLOBAL_SEED`` is also what Lightning seeds its ``DistributedSampler`` with, so
    defaulting to it keeps one-process and DDP data orders identical.
    """
    if seed is not None:
        return int(seed)
    return int(os.environ.get("PL_GLOBAL_SEED", 0))
