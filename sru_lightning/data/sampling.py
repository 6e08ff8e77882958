"""Training data whose position inside the epoch survives a checkpoint.

Lightning 2.x stores the ``state_dict()`` of every training dataloader that has one in the
checkpoint (``loops.fit_loop.state_dict.combined_loader``) and hands it back through
``load_state_dict()`` before it restarts the epoch; a plain ``DataLoader`` has neither, so a
mid-epoch resume would start the epoch over. :class:`ResumableDataLoader` counts the batches
it has handed out and skips them after a resume; with ``shuffle=True`` its order depends only
on (seed, epoch) (:class:`EpochSeededRandomSampler`), the same permutation Lightning's
``DistributedSampler`` draws, so a one-process run and a DDP run see the same global batches.
(When Lightning hands the state over too early to take effect,
:class:`sru_lightning.callbacks.RestoreDataPosition` hands it over again.)
"""

from __future__ import annotations

import itertools
import warnings
from typing import Any

import torch
from torch.utils.data import DataLoader, RandomSampler

from sru_lightning._seeds import global_seed

__all__ = ["EpochSeededRandomSampler", "ResumableDataLoader", "global_seed"]


class EpochSeededRandomSampler(RandomSampler):
    """A random permutation that depends only on ``seed + epoch``.

    Lightning calls ``set_epoch`` at the start of every epoch. The permutation is the one
    ``torch.utils.data.DistributedSampler(shuffle=True, seed=seed)`` draws before it splits
    it between ranks, so under DDP (where Lightning swaps this sampler for a
    ``DistributedSampler``, because it is a ``RandomSampler``) the union of the ranks'
    batches equals this sampler's batch of the global size.
    """

    def __init__(self, data_source, seed: int | None = None) -> None:
        super().__init__(data_source)
        self.seed = global_seed(seed)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __iter__(self):
        generator = torch.Generator()
        generator.manual_seed(self.seed + self.epoch)
        yield from torch.randperm(len(self.data_source), generator=generator).tolist()

    def __len__(self) -> int:
        return len(self.data_source)


class ResumableDataLoader(DataLoader):
    """A ``DataLoader`` whose position inside the epoch survives a checkpoint.

    Takes every ``DataLoader`` argument, plus ``seed`` for the shuffled order
    (default: the seed given to `lightning.seed_everything`). After ``load_state_dict``
    the next ``iter()`` skips the batches the checkpointed run had already consumed.
    Skipped batches are still loaded (then dropped), which is cheap for in-memory
    datasets; the sampler's order is untouched, so it works with any sampler, including
    the ``DistributedSampler`` Lightning injects under DDP. An iterable dataset that can start
    at a batch itself (a ``start_at(batch)`` method, as the memory-mapped shard datasets have)
    is told where to start instead, so nothing before it is read.
    """

    def __init__(
        self, dataset, *args: Any, shuffle: bool | None = None, seed: int | None = None, **kwargs: Any
    ) -> None:
        self.seed = global_seed(seed)
        if shuffle and kwargs.get("sampler") is None and kwargs.get("batch_sampler") is None:
            kwargs["sampler"] = EpochSeededRandomSampler(dataset, seed=self.seed)
            shuffle = None
        super().__init__(dataset, *args, shuffle=shuffle, **kwargs)
        self._batches_yielded = 0
        self._resume_position = 0

    def __iter__(self):
        # A generator: nothing runs until the first batch is requested, which Lightning
        # does only after it has called `set_epoch` on the sampler.
        start, self._resume_position = self._resume_position, 0
        self._batches_yielded = start
        start_at = getattr(self.dataset, "start_at", None)
        if callable(start_at):  # a dataset read by position starts there without reading the rest
            start_at(start)
            batches = super().__iter__()
        else:
            batches = super().__iter__()
            if start:
                batches = itertools.islice(batches, start, None)
        for batch in batches:
            self._batches_yielded += 1
            yield batch

    def state_dict(self) -> dict[str, int]:
        """Position in the current epoch: how many batches have been handed out."""
        num_batches = len(self) if _has_len(self) else -1
        return {"batches_yielded": self._batches_yielded, "num_batches": num_batches}

    def load_state_dict(self, state_dict: dict[str, int]) -> None:
        """Resume the next epoch iteration after ``state_dict["batches_yielded"]`` batches."""
        if "batches_yielded" not in state_dict:
            raise ValueError(
                "ResumableDataLoader.load_state_dict: `state_dict` must have key 'batches_yielded', "
                f"got keys {sorted(state_dict)}"
            )
        position = int(state_dict["batches_yielded"])
        saved_length = int(state_dict.get("num_batches", -1))
        length = len(self) if _has_len(self) else -1
        if saved_length >= 0 and length >= 0 and saved_length != length:
            warnings.warn(
                f"ResumableDataLoader: the checkpoint was taken with {saved_length} batches per "
                f"epoch, this loader has {length}; resuming at batch {min(position, length)} "
                "will not reproduce the interrupted run (dataset, batch_size or device count changed)",
                stacklevel=2,
            )
            position = min(position, length)
        self._resume_position = position


def _has_len(loader: DataLoader) -> bool:
    try:
        len(loader)
    except TypeError:
        return False
    return True
