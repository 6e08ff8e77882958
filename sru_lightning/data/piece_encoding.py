"""Pieces of a corpus to token ids in worker processes, for `prepare`.

Before the whole corpus has been read, its vocabulary is not known (characters sort by code
point over all the text; words come from the training split alone), so each piece is encoded
against a vocabulary of its own: the symbols it holds, and per token the index of its symbol.
The main process maps those to provisional ids (in order of first appearance), and to the final
ids once every piece has been read. Worker processes run the per-character and per-word work,
so every core encodes; a bounded number of pieces is in flight at a time, so memory stays flat.
"""

from __future__ import annotations

import multiprocessing
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

from .streams import word_tokens

#: Unicode's code points: the size of a per-character lookup table.
CODE_POINTS = 0x110000


def char_symbols(piece: str) -> tuple[np.ndarray, np.ndarray, None]:
    """(code points the piece holds, ascending; per character the index of its code point; None)."""
    code_points = np.frombuffer(piece.encode("utf-32-le"), dtype=np.uint32)
    present = np.zeros(CODE_POINTS, dtype=bool)
    present[code_points] = True
    symbols = np.flatnonzero(present).astype(np.uint32)
    lookup = np.zeros(CODE_POINTS, dtype=np.uint32)
    lookup[symbols] = np.arange(symbols.size, dtype=np.uint32)
    return symbols, lookup[code_points], None


def word_symbols(piece: str) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(the words the piece holds, in order of appearance; per token the index of its word; per
    word the index of its first token), with the end-of-line token closing each line, as
    :func:`~sru_lightning.data.streams.word_tokens` splits a text."""
    local: dict[str, int] = {}
    ids, firsts = [], []
    for position, token in enumerate(word_tokens(piece)):
        index = local.get(token)
        if index is None:
            index = local[token] = len(local)
            firsts.append(position)
        ids.append(index)
    return list(local), np.asarray(ids, dtype=np.uint32), np.asarray(firsts, dtype=np.int64)


def ordered_map(function: Callable[[Any], Any], items: Iterable[Any], workers: int) -> Iterator[Any]:
    """`map(function, items)` on `workers` processes, in order, with at most 2 x `workers` items
    in flight (multiprocessing's own imap reads all of `items` ahead)."""
    if workers <= 1:
        yield from map(function, items)
        return
    with multiprocessing.get_context().Pool(workers) as pool:
        pending: deque = deque()
        for item in items:
            pending.append(pool.apply_async(function, (item,)))
            if len(pending) >= 2 * workers:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()


class ProvisionalVocabulary:
    """Symbols (code points or words) numbered in order of first appearance, and for words the
    position of the first token of each (what decides whether it is in the training split)."""

    def __init__(self, unit: str) -> None:
        self.unit = unit
        self.table = np.full(CODE_POINTS, -1, dtype=np.int64) if unit == "char" else None
        self.words: dict[str, int] = {}
        self.first_position: list[int] = []
        self.size = 0

    def ids(self, symbols, local_ids: np.ndarray, firsts: np.ndarray | None, position: int) -> np.ndarray:
        """The provisional ids of a piece's tokens (`symbols`, `local_ids`, `firsts` from the
        worker); `position` is the piece's first token's position in the corpus."""
        if self.unit == "char":
            known = self.table[symbols]
            new = symbols[known < 0]
            self.table[new] = np.arange(self.size, self.size + new.size)
            self.size += new.size
            mapping = self.table[symbols]
        else:
            mapping = np.empty(len(symbols), dtype=np.int64)
            for index, word in enumerate(symbols):
                known = self.words.get(word)
                if known is None:
                    known = self.words[word] = self.size
                    self.size += 1
                    self.first_position.append(position + int(firsts[index]))
                mapping[index] = known
        return mapping[local_ids] if local_ids.size else np.zeros(0, dtype=np.int64)

    def char_itos(self) -> tuple[list[str], np.ndarray]:
        """(the characters sorted by code point, provisional id -> final id)."""
        code_points = np.flatnonzero(self.table >= 0)
        final = np.empty(self.size, dtype=np.int64)
        final[self.table[code_points]] = np.arange(code_points.size)
        return [chr(point) for point in code_points], final

    def word_itos(self, train_tokens: int, unknown: str) -> tuple[list[str], np.ndarray]:
        """(the vocabulary: the unknown word, then the training split's words sorted; provisional
        id -> final id, a word first seen after the training split -> the unknown word)."""
        in_train = sorted(
            word for word, index in self.words.items() if self.first_position[index] < train_tokens and word != unknown
        )
        itos = [unknown, *in_train]
        stoi = {word: index for index, word in enumerate(itos)}
        final = np.zeros(self.size, dtype=np.int64)
        for word, index in self.words.items():
            final[index] = stoi.get(word, 0)
        return itos, final
