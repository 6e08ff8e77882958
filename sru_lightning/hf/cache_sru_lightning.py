"""The generation cache of the transformers model: the network's recurrent state, one per layer.

A recurrent network reads on from a state of fixed size (SRU's ``c`` of every layer, the LSTM's
``(h, c)``, SRU++'s ``c`` and each attention layer's memory of at most `memory_length` inputs),
so unlike a key/value cache it does not grow with the text: :meth:`RecurrentStateCache.nbytes`
after 400 tokens is what it was after 1. It is what
:meth:`sru_lightning.nn.LanguageNet.forward` returns and takes back, kept with the count of
tokens read (what ``generate`` asks for with :meth:`get_seq_length`).

Every tensor of a state has the batch on its second axis (:mod:`sru_lightning.nn.carried_state`),
which is all beam search and ``num_return_sequences`` need to reorder or repeat rows. Plain
PyTorch: transformers is not imported here.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from sru_lightning.nn.carried_state import map_state

__all__ = ["RecurrentStateCache"]

#: The batch axis of every tensor of a state.
BATCH_DIM = 1


class RecurrentStateCache:
    """The recurrent state of every layer after the tokens read so far (None before the first).

    ``state`` is the network's own (a tensor or a tuple of tensors); ``seen_tokens`` counts the
    positions read, padding included, as the attention mask does."""

    #: Read by ``generate``: a recurrent state cannot be cut back to an earlier position (assisted
    #: decoding's rollback), nor traced by ``torch.compile`` as a static cache.
    is_compileable = False
    is_croppable = False

    def __init__(self, state: Any = None, seen_tokens: int = 0) -> None:
        self.state = state
        self.seen_tokens = int(seen_tokens)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(seen_tokens={self.seen_tokens}, nbytes={self.nbytes()})"

    def tensors(self) -> list[Tensor]:
        if self.state is None:
            return []
        return [self.state] if isinstance(self.state, Tensor) else list(self.state)

    def nbytes(self) -> int:
        """Bytes held by the state (constant once every attention memory is full)."""
        return sum(tensor.numel() * tensor.element_size() for tensor in self.tensors())

    def update(self, state: Any, new_tokens: int) -> RecurrentStateCache:
        """Keep the state after `new_tokens` more positions; returns the cache."""
        self.state = state
        self.seen_tokens += int(new_tokens)
        return self

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.seen_tokens

    def get_max_length(self) -> int | None:
        return None  # no bound: the state has the same size after any number of tokens

    # -- batch rows (beam search, several sequences per prompt, dropped rows) -----------------
    def _rows(self, function) -> None:
        if self.state is not None:
            self.state = map_state(self.state, function)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._rows(lambda tensor: tensor.index_select(BATCH_DIM, beam_idx.to(tensor.device)))

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._rows(lambda tensor: tensor.repeat_interleave(repeats, dim=BATCH_DIM))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._rows(lambda tensor: tensor.index_select(BATCH_DIM, indices.to(tensor.device)))

    def reset(self) -> None:
        self.state, self.seen_tokens = None, 0
