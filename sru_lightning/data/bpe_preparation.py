"""`prepare` at BPE level: count the text (where its splits are fractions of it), learn the
vocabulary from the first `bpe_sample_mb` MB of the training split, then encode every split in
pieces cut where byte-level BPE always starts a new word (:func:`.subwords.text_pieces`), so the
ids equal those of the whole text, each distinct word encoded once (:mod:`.bpe_words`).

`extra` records the seconds of learning and of encoding apart: learning runs `tokenizers`' own
pre-tokenizer over the sample, and is the slower of the two per MB."""

from __future__ import annotations

import codecs
import itertools
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

import numpy as np

from . import subwords
from .bpe_words import WordTable
from .piece_encoding import ordered_map
from .sources import CorpusReading
from .split_writer import SplitsWriter, document_split
from .streams import split_by_fractions
from .subwords import text_pieces, train_bpe
from .tokens import TokenCodec

SPLITS = ("train", "val", "test")

Routed = tuple[str, int, str]  # (split, document number or -1, text)


def prepare_bpe(preparation) -> tuple[dict[str, Any], int]:
    reading = preparation.reading
    total_chars = document_count = None
    if reading.layout in ("fractions", "documents"):
        with preparation.bar(f"counting {reading.owner}", "char") as bar:
            total_chars, document_count = _count(reading, bar)
    doc_split = document_split(document_count, reading) if reading.layout == "documents" else None

    sample_chars = preparation.options.bpe_sample_mb * 2**20
    routed = _safe(_routed(reading, total_chars, doc_split))
    train_pieces = (text for _, _, text in itertools.takewhile(lambda item: item[0] == "train", routed))
    sample = _FirstCharacters(train_pieces, sample_chars)
    started = time.perf_counter()
    with preparation.bar("learning the BPE vocabulary", "char") as bar:
        tokenizer_json = train_bpe(_counted(sample, bar), preparation.bpe_vocab_size)
    preparation.extra.update(bpe_sample_chars=sample.taken, learning_seconds=time.perf_counter() - started)
    codec = TokenCodec("bpe", tokenizer=tokenizer_json)

    writer = SplitsWriter(preparation, codec)
    order = iter(SPLITS)
    current: str | None = None
    offsets: list[int] = []
    firsts: list[int] = []

    def switch_to(split: str) -> None:
        nonlocal current
        while current != split:
            if current is not None:
                _end(writer, offsets, firsts)
            current = next(order)
            writer.begin(current)

    read_units = 0
    last_document = None
    started = time.perf_counter()
    pending: deque = deque()  # (split, document) of the pieces in flight, in order

    def texts_only() -> Iterator[str]:
        for split, document, text in _safe(_routed(reading, total_chars, doc_split)):
            pending.append((split, document))
            yield text

    encoded = ordered_map(
        _encode,
        texts_only(),
        preparation.options.worker_count(),
        initializer=_start_encoding,
        initargs=(tokenizer_json, writer.dtype),
        # one process per core: `tokenizers` in each uses one thread (set before the workers start,
        # it also keeps `tokenizers` from warning that its threads were forked)
        child_environment={"TOKENIZERS_PARALLELISM": "false"},
    )
    with preparation.bar(f"encoding {reading.owner}", "char", total_chars) as bar:
        for length, ids in encoded:
            split, document = pending.popleft()
            switch_to(split)
            if document >= 0 and document != last_document and ids.size:
                offsets.append(writer.current.tokens)
                firsts.append(int(ids[0]))
                last_document = document
            writer.append(ids)
            read_units += length
            bar.update(length)
        switch_to("test")
        _end(writer, offsets, firsts)
    preparation.extra["encoding_seconds"] = time.perf_counter() - started
    return writer.index(), read_units


#: The table of a process that encodes (each worker keeps its own): `_start_encoding` sets it.
_TABLE: WordTable | None = None
_IDS_DTYPE = "int32"


def _start_encoding(tokenizer_json: str, dtype: str) -> None:
    global _TABLE, _IDS_DTYPE
    from tokenizers import Tokenizer

    _TABLE, _IDS_DTYPE = WordTable(Tokenizer.from_str(tokenizer_json)), dtype


def _encode(text: str) -> tuple[int, np.ndarray]:
    """(characters of `text`, its ids in the shards' dtype: what comes back from a worker)."""
    return len(text), _TABLE.encode(text).astype(_IDS_DTYPE)


def _end(writer, offsets: list[int], firsts: list[int]) -> None:
    if writer.packs_documents:
        writer.set_documents(np.asarray(offsets, dtype=np.int64))
        writer.uncount(np.asarray(firsts, dtype=np.int64))
    offsets.clear()
    firsts.clear()
    writer.end()


def _count(reading: CorpusReading, bar) -> tuple[int, int]:
    """(characters, non-empty documents) of the whole text."""
    characters = documents = 0
    for _, pieces in reading.parts():
        before = characters
        for piece in pieces:
            characters += len(piece)
            bar.update(len(piece))
        documents += characters > before
    return characters, documents


class _FirstCharacters:
    """The first `limit` characters of the texts, the last one cut to fit; `taken` counts them."""

    def __init__(self, texts: Iterator[str], limit: int) -> None:
        self.texts, self.limit, self.taken = texts, limit, 0

    def __iter__(self) -> Iterator[str]:
        for text in self.texts:
            if self.taken >= self.limit:
                return
            text = text[: self.limit - self.taken]
            self.taken += len(text)
            yield text


def _counted(texts, bar) -> Iterator[str]:
    for text in texts:
        bar.update(len(text))
        yield text


def _routed(reading: CorpusReading, total_chars: int | None, doc_split) -> Iterator[Routed]:
    """(split, document number or -1, text) of the whole corpus, in order, each split's text as
    the in-memory module cuts it."""
    layout = reading.layout
    if layout == "named":
        for split, pieces in reading.parts():
            for piece in pieces:
                yield split, -1, piece
    elif layout == "documents":
        n_train, n_val = doc_split
        number = 0
        for _, pieces in reading.parts():
            started = False
            for piece in pieces:
                if not piece:
                    continue
                split = "train" if number < n_train else "val" if number < n_train + n_val else "test"
                started = True
                yield split, number, piece
            number += started
    elif layout == "fractions":
        slices = split_by_fractions(total_chars, reading.val_fraction, reading.test_fraction)
        yield from _cut(reading, [(split, part.stop) for split, part in zip(SPLITS, slices)])
    else:  # enwik8's bytes, each split decoded as UTF-8 on its own
        yield from _decoded(reading)


def _cut(reading: CorpusReading, ends: list[tuple[str, int]]) -> Iterator[Routed]:
    position, index = 0, 0
    for _, pieces in reading.parts():
        for piece in pieces:
            while piece:
                split, end = ends[index]
                if position >= end and index < len(ends) - 1:
                    index += 1
                    continue
                taken = piece[: max(0, end - position)] if index < len(ends) - 1 else piece
                position += len(taken)
                piece = piece[len(taken) :]
                if taken:
                    yield split, -1, taken


def _decoded(reading: CorpusReading) -> Iterator[Routed]:
    n_train, n_val, n_test = reading.sizes
    bounds = {
        "train": (0, n_train),
        "val": (n_train, n_train + n_val),
        "test": (n_train + n_val, n_train + n_val + n_test),
    }
    position, index = 0, 0
    decoder = codecs.getincrementaldecoder("utf-8")()

    def decode(split: str, data: bytes, final: bool) -> str:
        try:
            return decoder.decode(data, final=final)
        except UnicodeDecodeError as error:
            start, end = bounds[split]
            raise ValueError(
                f"Enwik8DataModule: data.tokenizer=bpe reads text, but the {split} split of `data.path` (bytes {start} "
                f"to {end}) is not UTF-8 ({error.reason}); move the split with data.train_bytes / data.val_bytes / "
                "data.test_bytes so that no character is cut"
            ) from None

    for _, pieces in reading.parts():
        for piece in pieces:
            while piece:
                split = SPLITS[index]
                end = bounds[split][1]
                taken, piece = piece[: end - position], piece[end - position :]
                position += len(taken)
                text = decode(split, taken, final=position >= end)
                if text:
                    yield split, -1, text
                if position >= end:
                    decoder.reset()
                    index = min(index + 1, len(SPLITS) - 1)


def _safe(routed: Iterator[Routed]) -> Iterator[Routed]:
    """The texts of each (split, document) run cut again where byte-level BPE always starts a new
    word, into pieces of about a megabyte: encoding them one by one gives the ids of the whole."""
    key, buffer = None, ""
    for split, document, text in routed:
        if (split, document) != key:
            if buffer:
                yield from ((key[0], key[1], piece) for piece in text_pieces(buffer))
            key, buffer = (split, document), ""
        buffer += text
        if len(buffer) >= 2 * subwords._PIECE_CHARS:
            pieces = list(text_pieces(buffer))
            yield from ((split, document, piece) for piece in pieces[:-1])
            buffer = pieces[-1]
    if buffer:
        yield from ((key[0], key[1], piece) for piece in text_pieces(buffer))
