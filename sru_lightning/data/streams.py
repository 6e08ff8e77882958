"""Token ids laid out for truncated backpropagation through time.

A split is one long sequence of token ids. It is cut into `batch_size` equal streams and
read left to right in windows of `seq_len` steps, so row b of window k continues row b of
window k-1: a recurrent model may carry its hidden state from one batch to the next.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import torch
from torch.utils.data import IterableDataset

from .tokens import END_OF_LINE


class ContiguousStreams(IterableDataset):
    """Yields `(inputs, targets)` pairs of shape `(batch_size, seq_len)`, in order.

    `rank`/`world_size` give each data-parallel process its own equal share of the streams,
    so every process sees the same number of windows and keeps row-wise contiguity.
    """

    def __init__(
        self,
        token_ids: torch.Tensor,
        batch_size: int,
        seq_len: int,
        *,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        super().__init__()
        for name, value in (("batch_size", batch_size), ("seq_len", seq_len), ("world_size", world_size)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{type(self).__name__}: `{name}` must be a positive integer, got {value!r}")
        if not 0 <= rank < world_size:
            raise ValueError(f"{type(self).__name__}: `rank` must be in [0, {world_size}), got {rank!r}")
        if token_ids.dim() != 1:
            raise ValueError(f"{type(self).__name__}: `token_ids` must be 1-D, got shape {tuple(token_ids.shape)}")
        total_rows = batch_size * world_size
        # One token more than the inputs need, for the last target.
        stream_len = (token_ids.numel() - 1) // total_rows
        if stream_len < seq_len:
            raise ValueError(
                f"{type(self).__name__}: {token_ids.numel()} tokens are too few for batch_size={batch_size} "
                f"x world_size={world_size} streams of seq_len={seq_len}; need at least "
                f"{total_rows * seq_len + 1}"
            )
        self.seq_len = seq_len
        self.num_windows = stream_len // seq_len
        used = self.num_windows * seq_len
        # Rows are interleaved across ranks by whole streams; `used + 1` keeps the shifted targets.
        starts = torch.arange(total_rows) * stream_len
        rows = starts[rank::world_size]
        offsets = torch.arange(used + 1)
        # Where each stream's tokens sit in `token_ids` (rows, used + 1): other per-token data
        # (a document's start flags) is laid out the same way through it.
        self.index = rows[:, None] + offsets[None, :]
        self.streams = token_ids[self.index]

    def __len__(self) -> int:
        return self.num_windows

    def __iter__(self):
        for k in range(self.num_windows):
            start = k * self.seq_len
            window = self.streams[:, start : start + self.seq_len + 1].long()
            yield window[:, :-1], window[:, 1:]


class Vocabulary:
    """Maps tokens (characters, words or bytes) to ids and back; ids follow sorted order."""

    def __init__(self, tokens: Iterable[str], unknown: str | None = None) -> None:
        symbols = sorted(set(tokens))
        if unknown is not None and unknown in symbols:
            symbols.remove(unknown)
        self.unknown = unknown
        self.itos: list[str] = ([unknown] if unknown is not None else []) + symbols
        self.stoi = {token: index for index, token in enumerate(self.itos)}

    def __len__(self) -> int:
        return len(self.itos)

    def encode(self, tokens: Sequence[str]) -> torch.Tensor:
        dtype = torch.int16 if len(self) < 2**15 else torch.int32
        if isinstance(tokens, str) and all(len(symbol) == 1 for symbol in self.itos):
            return self._encode_characters(tokens).to(dtype)
        if self.unknown is None:
            missing = set(tokens) - self.stoi.keys()
            if missing:
                raise ValueError(
                    f"Vocabulary: tokens {sorted(missing)[:5]!r} are not in the vocabulary of {len(self)} symbols"
                )
            ids = [self.stoi[token] for token in tokens]
        else:
            unk = self.stoi[self.unknown]
            ids = [self.stoi.get(token, unk) for token in tokens]
        return torch.tensor(ids, dtype=dtype)

    def _encode_characters(self, text: str) -> torch.Tensor:
        # Vectorised: code points through a lookup table (tens of millions of characters).
        code_points = torch.frombuffer(bytearray(text.encode("utf-32-le")), dtype=torch.int32).long()
        symbol_points = torch.tensor([ord(symbol) for symbol in self.itos], dtype=torch.long)
        size = int(max(code_points.max().item() if code_points.numel() else 0, symbol_points.max().item())) + 1
        table = torch.full((size,), -1, dtype=torch.long)
        table[symbol_points] = torch.arange(len(self.itos))
        ids = table[code_points]
        missing = ids < 0
        if missing.any():
            if self.unknown is None:
                unseen = sorted({chr(c) for c in code_points[missing][:1000].tolist()})
                raise ValueError(f"Vocabulary: tokens {unseen[:5]!r} are not in the vocabulary of {len(self)} symbols")
            ids[missing] = self.stoi[self.unknown]
        return ids


def unigram_bits_per_token(train_ids: torch.Tensor, eval_ids: torch.Tensor, vocab_size: int) -> float:
    """Cross-entropy (bits per token) of `eval_ids` under train-set token frequencies.

    Add-one smoothing gives tokens unseen in training a finite cost. This is the bar any
    model that reads context must clear.
    """
    train_counts = torch.bincount(train_ids.long(), minlength=vocab_size)
    return unigram_bits_from_counts(train_counts, torch.bincount(eval_ids.long(), minlength=vocab_size))


def unigram_bits_from_counts(train_counts: torch.Tensor, eval_counts: torch.Tensor) -> float:
    """`unigram_bits_per_token` from each split's count of every token id."""
    counts = train_counts.double() + 1.0
    log2_probs = torch.log2(counts / counts.sum())
    eval_counts = eval_counts.double()
    return float(-(eval_counts * log2_probs).sum() / eval_counts.sum())


def split_by_fractions(length: int, val_fraction: float, test_fraction: float) -> tuple[slice, slice, slice]:
    """Contiguous train/val/test slices: train first, then validation, then test."""
    for name, value in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
        if not 0.0 < value < 0.5:
            raise ValueError(f"data.{name} must be in (0, 0.5), got {value!r}")
    n_val = math.floor(length * val_fraction)
    n_test = math.floor(length * test_fraction)
    n_train = length - n_val - n_test
    return slice(0, n_train), slice(n_train, n_train + n_val), slice(n_train + n_val, length)


def word_tokens(text: str, end_of_line: str = END_OF_LINE) -> list[str]:
    """Whitespace-separated words with an end-of-line token per line (the wikitext convention)."""
    tokens: list[str] = []
    for line in text.splitlines():
        words = line.split()
        if words:
            tokens.extend(words)
            tokens.append(end_of_line)
    return tokens
