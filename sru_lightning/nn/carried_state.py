"""The recurrent state a model carries from one batch to the next, one per stage.

Truncated backpropagation through time reads contiguous streams: each batch starts from the
(detached) final state of the one before, as :func:`sru_lightning.nn.streaming.stream_step`
carries it. :class:`CarriedState` keeps that state per stage ("train", "val", "test"), starts a
stage again from zeros when the batch layout changes, and turns the training state into a
checkpoint entry holding every process's state (and back), so a resumed fit continues it.

A state is what the network returns: a tensor (SRU's ``c``) or a flat tuple of tensors (the
LSTM's ``(h, c)``; SRU++'s ``(c, *memory)``, with the memory's document starts last after packed
documents), batch on the second axis of the first tensor.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

__all__ = ["CarriedState", "map_state"]

State = Tensor | tuple[Tensor, ...]


def map_state(state: State, function: Callable[[Tensor], Tensor]) -> State:
    """Apply `function` to every tensor of a state (a tensor or a tuple of them)."""
    if isinstance(state, Tensor):
        return function(state)
    return tuple(function(tensor) for tensor in state)


def _all_gather(tensor: Tensor, world_size: int) -> list[Tensor]:
    """Every process's `tensor` (same shape on all), on the CPU, indexed by rank."""
    import torch.distributed as dist

    tensor = tensor.contiguous()
    pieces = [torch.empty_like(tensor) for _ in range(world_size)]
    dist.all_gather(pieces, tensor)
    return [piece.cpu() for piece in pieces]


class CarriedState:
    """Per-stage carried state of one process.

    Args:
        enabled: False keeps nothing (every batch starts from zeros).
    """

    def __init__(self, enabled: bool = True) -> None:
        if not isinstance(enabled, bool):
            raise ValueError(f"CarriedState: `enabled` must be true or false, got {enabled!r}")
        self.enabled = enabled
        self._states: dict[str, State] = {}

    def __contains__(self, stage: str) -> bool:
        return stage in self._states

    def get(self, stage: str) -> State | None:
        """The state kept for `stage` as it is (None when there is none)."""
        return self._states.get(stage)

    def initial(self, stage: str, batch_size: int, device: torch.device | str | None = None) -> State | None:
        """The state the next batch of `stage` starts from, on `device`; None (zeros) when nothing is
        carried or the kept state is of another batch size (a new stream layout)."""
        state = self._states.get(stage) if self.enabled else None
        if state is None:
            return None
        first = state if isinstance(state, Tensor) else state[0]
        if first.size(1) != batch_size:
            return None
        if device is not None and first.device != torch.device(device):  # restored from a checkpoint (CPU)
            state = map_state(state, lambda tensor: tensor.to(device))
        return state

    def keep(self, stage: str, state: State) -> None:
        """Keep the (detached) final state of a batch of `stage` for the next one."""
        if self.enabled:
            self._states[stage] = map_state(state, Tensor.detach)

    def reset(self, stage: str | None = None) -> None:
        """Forget the state of one stage (or of all)."""
        if stage is None:
            self._states.clear()
        else:
            self._states.pop(stage, None)

    # -- checkpoints -----------------------------------------------------------------------
    def checkpoint_entry(self, stage: str = "train", world_size: int = 1) -> dict[str, Any] | None:
        """``{"world_size": W, "per_rank": [state of rank 0, ...]}`` on the CPU, None when nothing is
        kept. With `world_size` > 1 every process must call it at once with a state of the same
        shapes (it gathers them through ``torch.distributed``)."""
        state = self._states.get(stage)
        if state is None:
            return None
        if world_size > 1:
            tensors = [state] if isinstance(state, Tensor) else list(state)
            gathered = [_all_gather(tensor, world_size) for tensor in tensors]  # [tensor][rank]
            per_rank = [
                gathered[0][rank] if isinstance(state, Tensor) else tuple(pieces[rank] for pieces in gathered)
                for rank in range(world_size)
            ]
        else:
            per_rank = [map_state(state, Tensor.cpu)]
        return {"world_size": world_size, "per_rank": per_rank}

    def restore(self, entry: Mapping[str, Any], stage: str = "train", world_size: int = 1, rank: int = 0) -> bool:
        """Take this process's state from a :meth:`checkpoint_entry`. False (nothing restored) when
        the entry was written by another number of processes, whose streams this one cannot map."""
        saved_world_size, per_rank = int(entry["world_size"]), list(entry["per_rank"])
        if saved_world_size != world_size:
            return False
        self._states[stage] = per_rank[rank]
        return True
