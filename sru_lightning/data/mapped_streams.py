"""The batch layouts of :mod:`.streams` and :mod:`.documents`, read from prepared shards by
memory map one window at a time: memory and start-up do not grow with the corpus.

Each dataset yields exactly what its in-memory counterpart yields for the same token ids
(:class:`~.streams.ContiguousStreams`, :class:`~.documents.PackedDocumentStreams`,
:class:`~.documents.WholeDocumentRows`): the same streams for each data-parallel rank, read in
the same windows. A DataLoader worker reads only its own windows (every `num_workers`-th, which
the loader hands out in order), and a resumed epoch starts at its window without reading the
ones before (`start_at`, called by :class:`~.sampling.ResumableDataLoader`).
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Sequence

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from .shards import ArrayFile

# The target index cross-entropy leaves out (torch's default ignore_index), as in .documents.
IGNORED = -100


class MappedTokens:
    """The token ids of one split: its shard files read as one sequence. The maps are opened on
    first read in each process (a DataLoader worker opens its own), never pickled."""

    def __init__(self, shards: Sequence[ArrayFile]) -> None:
        self.shards = tuple(shards)
        self.bounds = np.cumsum([0, *(shard.items for shard in self.shards)]).tolist()
        self._maps: list | None = None

    def __len__(self) -> int:
        return self.bounds[-1]

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_maps"] = None
        return state

    def read(self, start: int, stop: int) -> np.ndarray:
        """The ids at positions [start, stop), as one array."""
        if self._maps is None:
            self._maps = [shard.open() for shard in self.shards]
        first = bisect.bisect_right(self.bounds, start) - 1
        if stop <= self.bounds[first + 1]:  # the usual case: inside one shard
            base = self.bounds[first]
            return self._maps[first][start - base : stop - base]
        parts, position = [], start
        for number in range(first, len(self.shards)):
            base, end = self.bounds[number], self.bounds[number + 1]
            parts.append(self._maps[number][position - base : min(stop, end) - base])
            position = min(stop, end)
            if position >= stop:
                break
        return np.concatenate(parts)


class _WindowDataset(IterableDataset):
    """Windows 0..num_windows-1, each worker its own, starting at `start_at`'s window."""

    num_windows = 0

    def __init__(self) -> None:
        super().__init__()
        self.first_window = 0

    def __len__(self) -> int:
        return self.num_windows

    def start_at(self, window: int) -> None:
        """The next iteration starts at `window` (a resumed epoch), without reading those before."""
        self.first_window = int(window)

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        for k in range(self.first_window + worker, self.num_windows, workers):
            yield self.window(k)

    def window(self, k: int):
        raise NotImplementedError


class MappedStreams(_WindowDataset):
    """`(inputs, targets)` windows of `batch_size` streams per rank, as ContiguousStreams cuts them."""

    def __init__(
        self, tokens: MappedTokens, batch_size: int, seq_len: int, *, rank: int = 0, world_size: int = 1
    ) -> None:
        super().__init__()
        total_rows = batch_size * world_size
        stream_len = (len(tokens) - 1) // total_rows
        if stream_len < seq_len:
            raise ValueError(
                f"{type(self).__name__}: {len(tokens)} tokens are too few for batch_size={batch_size} "
                f"x world_size={world_size} streams of seq_len={seq_len}; need at least {total_rows * seq_len + 1}"
            )
        self.tokens, self.seq_len = tokens, seq_len
        self.num_windows = stream_len // seq_len
        self.row_starts = (np.arange(total_rows, dtype=np.int64) * stream_len)[rank::world_size]

    def read_rows(self, k: int) -> np.ndarray:
        """(rows, seq_len + 1) int64: window k's tokens and the next one."""
        offset = k * self.seq_len
        rows = np.empty((self.row_starts.size, self.seq_len + 1), dtype=np.int64)
        for row, start in enumerate(self.row_starts.tolist()):
            rows[row] = self.tokens.read(start + offset, start + offset + self.seq_len + 1)
        return rows

    def window(self, k: int):
        window = torch.from_numpy(self.read_rows(k))
        return window[:, :-1], window[:, 1:]


class MappedPackedDocuments(MappedStreams):
    """`(inputs, targets, reset)` training windows of packed documents, as PackedDocumentStreams
    yields them; `document_starts` (ascending) are the offsets of the documents' first tokens,
    an array or the file that holds them (mapped on first use, in each process)."""

    def __init__(
        self, tokens: MappedTokens, document_starts: ArrayFile | np.ndarray, batch_size: int, seq_len: int, **rank
    ):
        super().__init__(tokens, batch_size, seq_len, **rank)
        self.document_file = document_starts if isinstance(document_starts, ArrayFile) else None
        self._document_starts = None if self.document_file else np.asarray(document_starts, dtype=np.int64)

    def __getstate__(self):
        state = dict(self.__dict__)
        if self.document_file is not None:
            state["_document_starts"] = None
        return state

    def window(self, k: int):
        if self._document_starts is None:
            self._document_starts = self.document_file.open()
        document_starts = self._document_starts
        rows = self.read_rows(k)
        starts = np.zeros(rows.shape, dtype=bool)
        offset = k * self.seq_len
        for row, start in enumerate(self.row_starts.tolist()):
            first = start + offset
            lo, hi = np.searchsorted(document_starts, [first, first + self.seq_len + 1])
            starts[row, np.asarray(document_starts[lo:hi]) - first] = True
        if k == 0:
            starts[:, 0] = True  # nothing comes before a stream's first token
        tokens, flags = torch.from_numpy(rows), torch.from_numpy(starts)
        targets = torch.where(flags[:, 1:], torch.full_like(tokens[:, 1:], IGNORED), tokens[:, 1:])
        return tokens[:, :-1], targets, flags[:, :-1]


def assign_rows(lengths: Sequence[int], total_rows: int) -> list[list[int]]:
    """Documents (by index) to rows: the longest first, each to the row with the fewest tokens so
    far (the lowest-numbered of equals), as WholeDocumentRows lays out evaluation rows."""
    order = sorted(range(len(lengths)), key=lambda index: -lengths[index])
    heap = [(0, row) for row in range(total_rows)]
    rows: list[list[int]] = [[] for _ in range(total_rows)]
    for index in order:
        filled, row = heapq.heappop(heap)
        rows[row].append(index)
        heapq.heappush(heap, (filled + lengths[index], row))
    return rows


class MappedDocumentRows(_WindowDataset):
    """`(inputs, targets, reset)` evaluation windows: whole documents per row, padded at the end,
    as WholeDocumentRows lays them out; only the documents' offsets and lengths are in memory."""

    def __init__(
        self,
        tokens: MappedTokens,
        document_starts: ArrayFile | np.ndarray,
        batch_size: int,
        seq_len: int,
        *,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        super().__init__()
        if isinstance(document_starts, ArrayFile):
            document_starts = document_starts.open()
        starts = np.array(document_starts, dtype=np.int64)
        lengths = np.diff(np.append(starts, len(tokens)))
        rows = assign_rows(lengths.tolist(), batch_size * world_size)
        longest = max([int(lengths[row].sum()) for row in rows] + [2])
        self.tokens, self.seq_len = tokens, seq_len
        self.num_windows = -(-(longest - 1) // seq_len)
        # per row of this rank: the documents' offsets in the split, and where each begins in the row
        self.rows = [
            (starts[row], np.cumsum(np.concatenate([[0], lengths[row]])).astype(np.int64))
            for row in rows[rank::world_size]
        ]

    def window(self, k: int):
        begin, end = k * self.seq_len, (k + 1) * self.seq_len + 1  # one more for the last target
        tokens = np.zeros((len(self.rows), end - begin), dtype=np.int64)
        flags = np.ones((len(self.rows), end - begin), dtype=bool)  # padding: each step on its own
        for row, (offsets, bounds) in enumerate(self.rows):
            filled = int(bounds[-1])
            if begin >= filled:
                continue
            flags[row, : min(end, filled) - begin] = False
            first = int(np.searchsorted(bounds, begin, side="right")) - 1
            for document in range(first, offsets.size):
                lo, hi = int(bounds[document]), int(bounds[document + 1])
                if lo >= end:
                    break
                a, b = max(lo, begin), min(hi, end)
                source = int(offsets[document]) + a - lo
                tokens[row, a - begin : b - begin] = self.tokens.read(source, source + b - a)
                if lo >= begin:
                    flags[row, lo - begin] = True
        inputs, starts = torch.from_numpy(tokens), torch.from_numpy(flags)
        targets = torch.where(starts[:, 1:], torch.full_like(inputs[:, 1:], IGNORED), inputs[:, 1:])
        return inputs[:, :-1], targets, starts[:, :-1]
