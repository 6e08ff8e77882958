"""Byte-level BPE ids of long texts at several times `tokenizers`' own speed, the same ids.

`tokenizers` spends most of an encoding on each word's bookkeeping (a normalised string with
its alignments, offsets, token strings), about 2 MB of text per CPU-second whatever the size of
the batch. Text is mostly made of a few thousand distinct words, so here:

* the stretches of ASCII text are split into words by Python's `re` with the byte-level
  pre-tokenizer's own pattern, restricted to ASCII where it means the same thing (letters
  ``A-Za-z``, numbers ``0-9``, white space ``\\t\\n\\v\\f\\r`` and the space);
* each distinct word is encoded once by `tokenizers` (its ids depend on the word alone) and
  kept in a table; a text's ids are gathered from the table with numpy;
* the stretches holding any other character are encoded by `tokenizers` itself (and kept in
  the table too). A stretch starts and ends before an ASCII white space that follows a printable
  ASCII character, where the pre-tokenizer always starts a new word (no word holds both), so
  the stretches encode to the ids of the whole.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator

import numpy as np

#: The byte-level pre-tokenizer's pattern (GPT-2's) on ASCII text: ``\\p{L}`` is ``A-Za-z``,
#: ``\\p{N}`` is ``0-9``, and ``\\s`` with re.ASCII is the pattern's white space there.
ASCII_WORDS = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+""", re.ASCII)
_NON_ASCII = re.compile(r"[^\x00-\x7f]+")
#: Where the pre-tokenizer always starts a new word: an ASCII white space after a printable
#: ASCII character (the cut is between the two).
_WORD_START = re.compile(r"[!-~][\t\n\x0b\x0c\r ]")
#: The last such cut up to a point (``match(text, start, end)``; the cut is at the match's end).
_LAST_WORD_START = re.compile(r".*[!-~](?=[\t\n\x0b\x0c\r ])", re.DOTALL)
#: Distinct words kept; past it the table starts again (a corpus of many rare words stays flat).
MAX_WORDS = 1 << 20


def ascii_stretches(text: str) -> Iterator[tuple[bool, str]]:
    """(whether the stretch is ASCII, stretch) covering `text` in order, each cut where the
    pre-tokenizer always starts a new word (see the module), the stretches with other
    characters as short as that allows."""
    if text.isascii():
        if text:
            yield True, text
        return
    position = 0
    for match in _NON_ASCII.finditer(text):
        if match.start() < position:  # inside the previous non-ASCII stretch
            continue
        before = _LAST_WORD_START.match(text, position, match.start())
        start = position if before is None else before.end()
        after = _WORD_START.search(text, match.end())
        end = len(text) if after is None else after.start() + 1
        if start > position:
            yield True, text[position:start]
        yield False, text[start:end]
        position = end
    if position < len(text):
        yield True, text[position:]


class WordTable:
    """A byte-level BPE tokenizer's ids of texts, through a table of the distinct words seen."""

    def __init__(self, tokenizer) -> None:
        from tokenizers import Tokenizer, pre_tokenizers

        self.tokenizer = tokenizer
        # the same vocabulary applied to one word at a time: the bytes' symbols, no splitting
        self.word_tokenizer = Tokenizer.from_str(tokenizer.to_str())
        self.word_tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        self._reset()

    def _reset(self) -> None:
        self.numbers: dict[str, int] = {}  # word -> its row
        self.starts = np.zeros(0, dtype=np.int64)  # per row: where its ids start in `ids`
        self.lengths = np.zeros(0, dtype=np.int64)
        self.ids = np.zeros(0, dtype=np.int32)

    def encode(self, text: str) -> np.ndarray:
        """The ids (int32) of `text`, equal to ``tokenizer.encode(text).ids``."""
        if text.isascii():
            items = ASCII_WORDS.findall(text)
        else:  # the words of the ASCII stretches, the other stretches whole
            items = []
            for is_ascii, stretch in ascii_stretches(text):
                if is_ascii:
                    items += ASCII_WORDS.findall(stretch)
                else:
                    items.append(stretch)
        numbers = self.numbers
        new = [item for item in set(items) if item not in numbers]
        if new:
            if len(numbers) + len(new) > MAX_WORDS:
                self._reset()
                numbers = self.numbers
                new = list(set(items))
            self._learn(new)
        rows = np.fromiter(map(numbers.__getitem__, items), dtype=np.int64, count=len(items))
        lengths = self.lengths[rows]
        ends = np.cumsum(lengths)
        # token k of the text, the j-th of its item's row r: ids[starts[r] + j]
        positions = np.repeat(self.starts[rows] - (ends - lengths), lengths) + np.arange(ends[-1] if ends.size else 0)
        return self.ids[positions]

    def _learn(self, items: list[str]) -> None:
        """Encode new `items` and add them to the table: the ASCII words in one call, one word at
        a time; the other stretches by the tokenizer itself (its pre-tokenizer splits them)."""
        words = [item for item in items if item.isascii()]
        stretches = [item for item in items if not item.isascii()]
        word_ids, lengths = np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.int64)
        if words:
            encoding = self.word_tokenizer.encode_batch([words], is_pretokenized=True, add_special_tokens=False)[0]
            word_ids = np.asarray(encoding.ids, dtype=np.int32)
            lengths = np.bincount(np.asarray(encoding.word_ids, dtype=np.int64), minlength=len(words))
        if stretches:
            encoded = [entry.ids for entry in self.tokenizer.encode_batch(stretches, add_special_tokens=False)]
            word_ids = np.concatenate([word_ids, np.fromiter(itertools.chain.from_iterable(encoded), dtype=np.int32)])
            lengths = np.concatenate([lengths, np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))])
        first = len(self.numbers)
        self.numbers.update(zip(words + stretches, range(first, first + len(items))))
        self.starts = np.concatenate([self.starts, self.ids.size + np.cumsum(lengths) - lengths])
        self.lengths = np.concatenate([self.lengths, lengths])
        self.ids = np.concatenate([self.ids, word_ids])
