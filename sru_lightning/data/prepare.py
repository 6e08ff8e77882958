"""Prepare a corpus once: read it in pieces, encode it with every core, write token shards and
their index (:mod:`.shards`) into a hidden folder beside `out`, and rename that into place.

Byte, character and word levels read the text once: each piece is encoded against a vocabulary
of its own in worker processes (:mod:`.piece_encoding`), its provisional ids written to a
scratch file; when all is read the vocabulary is known (characters by code point over all the
text, words of the training split) and one pass over the scratch file writes the final ids,
split by split. A BPE vocabulary is learned first, from the first `bpe_sample_mb` MB of the
training split (all of it when it is smaller), then the text is read again and encoded in
worker processes (:mod:`.bpe_preparation`).

The ids are those the in-memory data module computes from the same text and settings, so a fit
from the shards sees the same batches.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sru_lightning._atomic import put_in_place

from . import shards
from .piece_encoding import ProvisionalVocabulary, look_up, ordered_map, read_ahead, word_symbols
from .sources import CorpusReading, Part
from .split_writer import SplitsWriter, document_split
from .streams import split_by_fractions
from .tokens import UNKNOWN_WORD, TokenCodec

SPLITS = shards.SPLITS
#: Tokens read back from the scratch file at a time.
_FINAL_CHUNK = 1 << 24


@dataclass
class PrepareOptions:
    """How to prepare (what is prepared comes from the data module)."""

    workers: int = 0  # processes that split words or encode BPE pieces; 0: every core this process may use
    shard_mb: float = 256  # size of a token shard
    # training text a BPE vocabulary is learned from (its first MB): learning costs about four
    # times encoding per MB, and 8 MB of Python sources give a vocabulary of 4000 tokens that
    # compresses held-out text as well as one learned from 27 MB (docs/corpus.md)
    bpe_sample_mb: int = 8
    progress: bool = True  # progress bars on stderr (when it is a terminal)

    def worker_count(self) -> int:
        return self.workers or len(os.sched_getaffinity(0))


@dataclass
class Prepared:
    """What `prepare_corpus` wrote."""

    folder: Path
    index: dict[str, Any]
    read_units: int  # characters (bytes for enwik8) read
    seconds: float
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def tokens(self) -> int:
        return sum(split["tokens"] for split in self.index["splits"].values())


# --------------------------------------------------------------------------------------------
# the folder
def owned_files(out: Path) -> list[Path]:
    """The files of an existing, non-empty `out` that overwrite=true may remove: its index and the
    files the index lists. A ValueError when `out` holds anything else (nothing is removed then)."""

    def refuse(reason: str) -> ValueError:
        return ValueError(
            f"`out`={str(out)!r} cannot be replaced: {reason}; overwrite=true replaces only a folder written by "
            "`python -m sru_lightning prepare` that holds nothing else (move it away or choose another `out`)"
        )

    if not out.is_dir() or out.is_symlink():
        raise refuse("it is not a folder")
    try:  # the index alone says what is ours: a damaged shard of it may still be replaced
        index = json.loads((out / shards.INDEX_NAME).read_text(encoding="utf-8"))
        if index.get("format") != shards.FORMAT_NAME:
            raise ValueError(f"its {shards.INDEX_NAME} is not prepare's")
        listed = {shards.INDEX_NAME, index["token_counts"]["file"]}
        for split in index["splits"].values():
            listed.update(shard["file"] for shard in split["shards"])
            if split.get("documents"):
                listed.add(split["documents"]["file"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise refuse(f"it has no readable {shards.INDEX_NAME} of a prepared corpus ({error})") from None
    present = {path.name for path in out.iterdir()}
    others = sorted(present - listed)
    if others:
        raise refuse(f"it holds {others[:3]} besides the files its index lists")
    return [out / name for name in sorted(present)]


def prepare_corpus(
    reading: CorpusReading,
    token_level: str,
    out,
    *,
    bpe_vocab_size: int | None = None,
    overwrite: bool = False,
    options: PrepareOptions | None = None,
    source: dict[str, Any] | None = None,
) -> Prepared:
    """Prepare `reading` at `token_level` (byte, char, word or bpe) into the folder `out`."""
    options = options or PrepareOptions()
    out = Path(str(out)).expanduser().absolute()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        if not overwrite:
            raise ValueError(
                f"`out`={str(out)!r} already exists and is not empty; choose another folder or pass overwrite=true "
                "to replace a corpus prepared there"
            )
        owned_files(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.incomplete-", dir=out.parent))
    started = time.perf_counter()
    try:
        writer = _Preparation(reading, token_level, staging, options, bpe_vocab_size)
        index, read_units = writer.run()
        index["source"] = source or {}
        index["settings"] = {
            "shard_mb": options.shard_mb,
            "bpe_sample_mb": options.bpe_sample_mb if token_level == "bpe" else None,
            "workers": options.worker_count(),
        }
        shards.write_index(staging, index)
        _publish(staging, out, overwrite)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return Prepared(out, index, read_units, time.perf_counter() - started, writer.extra)


def _publish(staging: Path, out: Path, overwrite: bool) -> None:
    """Rename the finished `staging` folder to `out`; an old prepared `out` (overwrite) loses
    only its own files, and only now that the new one is complete."""
    umask = os.umask(0)
    os.umask(umask)
    for path in staging.iterdir():  # read-only: a run reads them, nothing writes them again
        path.chmod(0o444 & ~umask)
    os.chmod(staging, 0o777 & ~umask)
    if out.exists():
        if any(out.iterdir()):
            for path in owned_files(out):
                path.unlink()
        out.rmdir()
    put_in_place(staging, out)  # `out` is gone: a plain rename


# --------------------------------------------------------------------------------------------
class _Preparation:
    def __init__(self, reading: CorpusReading, level: str, folder: Path, options: PrepareOptions, bpe_size):
        self.reading, self.level, self.folder, self.options = reading, level, folder, options
        self.bpe_vocab_size = bpe_size
        self.corpus_id = shards.new_corpus_id()
        self.extra: dict[str, Any] = {}

    def bar(self, description: str, unit: str, total: int | None = None):
        from tqdm import tqdm

        return tqdm(
            desc=description,
            unit=unit,
            unit_scale=True,
            total=total,
            disable=None if self.options.progress else True,
            leave=False,
            dynamic_ncols=True,
        )

    def run(self) -> tuple[dict[str, Any], int]:
        if self.level == "bpe":
            from .bpe_preparation import prepare_bpe

            return prepare_bpe(self)
        return self._provisional_then_final()

    # -- byte, char and word levels -------------------------------------------------------------
    def _provisional_then_final(self) -> tuple[dict[str, Any], int]:
        unit = self.reading.unit
        scratch_path = self.folder / "provisional.scratch"
        vocabulary = ProvisionalVocabulary(unit)
        scratch_dtype = {"byte": np.uint8, "char": np.uint16, "word": np.uint32}[unit]
        position, read_units = 0, 0
        part_starts: list[tuple[str | None, int]] = []  # (split name or None, first token) per part
        document_starts: list[int] = []
        bar = self.bar(f"reading {self.reading.owner}", "char" if unit != "byte" else "B")
        with open(scratch_path, "wb") as scratch, bar:
            for split, started, piece, result in self._encoded_pieces():
                if started:
                    part_starts.append((split, position))
                    document_starts.append(position)
                read_units += len(piece)
                bar.update(len(piece))
                if unit == "byte":
                    ids = np.frombuffer(piece, dtype=np.uint8)
                elif unit == "char":
                    ids = vocabulary.char_ids(piece)
                else:
                    ids = vocabulary.word_ids(*result, position)
                scratch.write(memoryview(np.ascontiguousarray(ids, dtype=scratch_dtype)).cast("B"))
                position += ids.size
        total = position
        ranges = self._split_ranges(total, part_starts, document_starts)
        if unit == "byte":
            codec, mapping = TokenCodec("byte"), None
        elif unit == "char":
            itos, mapping = vocabulary.char_itos()
            codec = TokenCodec("char", itos)
        else:
            itos, mapping = vocabulary.word_itos(ranges["train"][1], UNKNOWN_WORD)
            codec = TokenCodec("word", itos, unknown=UNKNOWN_WORD)
        scratch = np.memmap(scratch_path, dtype=scratch_dtype, mode="r") if total else np.zeros(0, scratch_dtype)
        writer = SplitsWriter(self, codec)
        if mapping is not None:  # looked up straight into the shards' dtype
            mapping = mapping.astype(writer.dtype)
        documents = np.asarray(document_starts, dtype=np.int64) if self.reading.layout == "documents" else None
        with self.bar("writing shards", "tok", total) as bar:
            for split in SPLITS:
                start, stop = ranges[split]
                writer.begin(split)
                # the next chunk's final ids are gathered while this one is hashed and written
                for ids in read_ahead(_final_ids(scratch, mapping, start, stop)):
                    writer.append(ids)
                    bar.update(ids.size)
                if documents is not None:
                    inside = documents[(documents >= start) & (documents < stop)]
                    writer.set_documents(inside - start, scratch, inside, mapping)
                writer.end()
        del scratch
        scratch_path.unlink()
        return writer.index(), read_units

    def _encoded_pieces(self) -> Iterator[tuple[str | None, bool, Any, Any]]:
        """(split or None, whether a part (document) starts, piece, the worker's encoding) in order;
        empty documents are left out, as the documents module leaves them out."""
        encode = word_symbols if self.reading.unit == "word" else None  # the others: vectorised here
        tagged = read_ahead(_tagged_pieces(self.reading.parts()))  # the next piece is read meanwhile
        if encode is None:
            for split, started, piece in tagged:
                yield split, started, piece, None
            return
        pending: deque = deque()  # the tags of the pieces in flight, in order

        def pieces_only():
            for split, started, piece in tagged:
                pending.append((split, started, piece))
                yield piece

        for result in ordered_map(encode, pieces_only(), self.options.worker_count()):
            split, started, piece = pending.popleft()
            yield split, started, piece, result

    def _split_ranges(
        self, total: int, part_starts: list[tuple[str | None, int]], document_starts: list[int]
    ) -> dict[str, tuple[int, int]]:
        reading = self.reading
        if reading.layout == "fractions":
            slices = split_by_fractions(total, reading.val_fraction, reading.test_fraction)
            return {split: (part.start, part.stop) for split, part in zip(SPLITS, slices)}
        if reading.layout == "sizes":
            n_train, n_val, n_test = reading.sizes
            return {"train": (0, n_train), "val": (n_train, n_train + n_val), "test": (n_train + n_val, total)}
        if reading.layout == "named":
            starts = {split: start for split, start in part_starts}
            return {
                "train": (0, starts["val"]),
                "val": (starts["val"], starts["test"]),
                "test": (starts["test"], total),
            }
        n_train, n_val = document_split(len(document_starts), reading)
        bounds = [*document_starts, total]
        return {
            "train": (0, bounds[n_train]),
            "val": (bounds[n_train], bounds[n_train + n_val]),
            "test": (bounds[n_train + n_val], total),
        }


def _final_ids(scratch: np.ndarray, mapping: np.ndarray | None, start: int, stop: int) -> Iterator[np.ndarray]:
    """The final ids of the provisional ones at [start, stop) of `scratch`, a chunk at a time."""
    for chunk_start in range(start, stop, _FINAL_CHUNK):
        chunk = np.asarray(scratch[chunk_start : min(stop, chunk_start + _FINAL_CHUNK)])
        yield chunk if mapping is None else look_up(mapping, chunk)


def _tagged_pieces(parts: Iterator[Part]) -> Iterator[tuple[str | None, bool, Any]]:
    """(split or None, True at the first non-empty piece of each part, piece) of every non-empty
    piece; a part without any is left out."""
    for split, pieces in parts:
        started = False
        for piece in pieces:
            if not piece:
                continue
            yield split, not started, piece
            started = True
