"""The prepared-corpus format: token shards and the one index that describes them.

A prepared folder (written by ``python -m sru_lightning prepare``) holds

* ``index.json``: the token codec (vocabulary or tokenizer JSON), the dtype of the ids, each
  split's token count, documents and shard files (each with its size and SHA-256), the token
  counts of each split (for the unigram baseline), the data settings it was prepared from, and
  a checksum of the index itself;
* ``<split>-NNNNN.bin``: the token ids of a split, in order, in the narrowest unsigned dtype that
  holds the vocabulary (little-endian), after a 64-byte header;
* ``<split>-documents.bin``: where the data has separate documents, the int64 offset of each
  document's first token in its split, after the same header.

Every header carries the corpus's id (also in the index), so a shard from another prepared
folder is told apart from this one's even when its size matches. Files are only ever read
(`np.memmap` in mode "r"): training never changes them.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sru_lightning._atomic import write_text

#: The index file's name inside a prepared folder.
INDEX_NAME = "index.json"
#: What the index's `format` field says; anything else is a foreign file.
FORMAT_NAME = "sru_lightning.shards"
FORMAT_VERSION = 1
MAGIC = b"SRUSHARD"
HEADER_BYTES = 64
# magic, format version, dtype code, corpus id (16 bytes), item count; zero padding to 64 bytes
_HEADER = struct.Struct("<8sII16sQ")
DTYPES = {"uint8": 1, "uint16": 2, "uint32": 3, "int64": 4}
SPLITS = ("train", "val", "test")
_REPAIR = "run `python -m sru_lightning prepare` again (with overwrite=true) or copy the whole folder again"


class ShardError(ValueError):
    """A prepared folder that cannot be read as it is: names the file and what to do."""


def token_dtype(vocab_size: int) -> str:
    """The narrowest unsigned dtype that holds every id of a vocabulary of `vocab_size` tokens."""
    if vocab_size <= 2**8:
        return "uint8"
    if vocab_size <= 2**16:
        return "uint16"
    return "uint32"


def shard_name(split: str, number: int) -> str:
    return f"{split}-{number:05d}.bin"


def documents_name(split: str) -> str:
    return f"{split}-documents.bin"


COUNTS_NAME = "token-counts.bin"


def index_checksum(index: dict[str, Any]) -> str:
    """SHA-256 of the index's content without its own `checksum` field (keys sorted)."""
    content = {key: value for key, value in index.items() if key != "checksum"}
    return hashlib.sha256(json.dumps(content, sort_keys=True, ensure_ascii=True).encode("ascii")).hexdigest()


# --------------------------------------------------------------------------------------------
# writing
class ArrayFileWriter:
    """One file of items of `dtype` after the header, hashed as it is written."""

    def __init__(self, path: Path, dtype: str, corpus_id: str) -> None:
        self.path, self.dtype, self.corpus_id = path, dtype, corpus_id
        self.items = 0
        self.digest = hashlib.sha256()
        self.handle = open(path, "wb")
        self._write(self._header(0))  # a placeholder: the count is filled in when the file closes

    def _header(self, items: int) -> bytes:
        header = _HEADER.pack(MAGIC, FORMAT_VERSION, DTYPES[self.dtype], uuid.UUID(self.corpus_id).bytes, items)
        return header.ljust(HEADER_BYTES, b"\0")

    def _write(self, data: bytes | memoryview) -> None:
        try:
            self.handle.write(data)
        except OSError as error:  # a full disk: name the file being written
            raise OSError(error.errno, error.strerror, str(self.path)) from error

    def append(self, values: np.ndarray) -> None:
        data = np.ascontiguousarray(values, dtype=np.dtype(self.dtype).newbyteorder("<"))
        self._write(memoryview(data).cast("B"))
        self.digest.update(memoryview(data).cast("B"))
        self.items += data.size

    def close(self) -> dict[str, Any]:
        """Finish the file; returns its entry in the index."""
        header = self._header(self.items)
        self.handle.seek(0)
        self.handle.write(header)
        self.handle.flush()
        os.fsync(self.handle.fileno())
        self.handle.close()
        return {
            "file": self.path.name,
            "items": self.items,
            "bytes": HEADER_BYTES + self.items * np.dtype(self.dtype).itemsize,
            "sha256": _chained_checksum(header, self.digest),
        }

    def abort(self) -> None:
        if not self.handle.closed:
            self.handle.close()


def _chained_checksum(header: bytes, data_digest) -> str:
    """The files' checksum: SHA-256 of (SHA-256 of the header, SHA-256 of the data), so it is
    computed while writing, without reading the file back."""
    return hashlib.sha256(hashlib.sha256(header).digest() + data_digest.digest()).hexdigest()


def stored_checksum(path: Path) -> str:
    """`_chained_checksum` of a file as it is on disk."""
    data_digest = hashlib.sha256()
    with open(path, "rb") as handle:
        header = handle.read(HEADER_BYTES)
        while chunk := handle.read(1 << 24):
            data_digest.update(chunk)
    return _chained_checksum(header, data_digest)


class SplitWriter:
    """The token shards of one split, a new file every `shard_tokens` tokens."""

    def __init__(self, folder: Path, split: str, dtype: str, corpus_id: str, shard_tokens: int) -> None:
        self.folder, self.split, self.dtype, self.corpus_id = folder, split, dtype, corpus_id
        self.shard_tokens = shard_tokens
        self.shards: list[dict[str, Any]] = []
        self.current: ArrayFileWriter | None = None
        self.tokens = 0

    def append(self, ids: np.ndarray) -> None:
        start = 0
        while start < ids.size:
            if self.current is None:
                self.current = ArrayFileWriter(
                    self.folder / shard_name(self.split, len(self.shards)), self.dtype, self.corpus_id
                )
            room = self.shard_tokens - self.current.items
            piece = ids[start : start + room]
            self.current.append(piece)
            start += piece.size
            if self.current.items >= self.shard_tokens:
                self.shards.append(self.current.close())
                self.current = None
        self.tokens += ids.size

    def close(self) -> list[dict[str, Any]]:
        if self.current is not None:
            self.shards.append(self.current.close())
            self.current = None
        return self.shards

    def abort(self) -> None:
        if self.current is not None:
            self.current.abort()


def write_array_file(path: Path, values: np.ndarray, corpus_id: str) -> dict[str, Any]:
    writer = ArrayFileWriter(path, "int64", corpus_id)
    writer.append(values.astype(np.int64, copy=False))
    return writer.close()


def new_corpus_id() -> str:
    return str(uuid.uuid4())


def write_index(folder: Path, index: dict[str, Any]) -> Path:
    """`index.json` with its checksum, written under a temporary name and renamed."""
    index = dict(index)
    index["checksum"] = index_checksum(index)
    return write_text(folder / INDEX_NAME, json.dumps(index, indent=1, sort_keys=True) + "\n", durable=True)


# --------------------------------------------------------------------------------------------
# reading
@dataclass(frozen=True)
class ArrayFile:
    """One checked file of the folder: its path, item count and dtype (data after the header)."""

    path: Path
    items: int
    dtype: str

    def open(self) -> np.memmap | np.ndarray:
        if self.items == 0:
            return np.zeros(0, dtype=self.dtype)
        return np.memmap(self.path, dtype=np.dtype(self.dtype).newbyteorder("<"), mode="r", offset=HEADER_BYTES)


@dataclass(frozen=True)
class PreparedSplit:
    tokens: int
    shards: tuple[ArrayFile, ...]
    documents: ArrayFile | None  # offsets of the documents' first tokens; None without documents


class PreparedCorpus:
    """A prepared folder's index, checked against its files (sizes and headers; with
    `verify`, their checksums too). Every problem is a ShardError naming the file."""

    def __init__(self, folder, verify: bool = False, setting: str = "data.path") -> None:
        self.folder = Path(str(folder)).expanduser()
        self.setting = setting
        self.index = self._read_index()
        self.corpus_id: str = self.index["corpus_id"]
        self.dtype: str = self.index["dtype"]
        self.vocab_size: int = int(self.index["vocab_size"])
        self.packs_documents: bool = bool(self.index["packs_documents"])
        self.splits = {split: self._split(split, verify) for split in SPLITS}
        counts_entry = self.index["token_counts"]
        self._counts = self._checked_file(counts_entry, "int64", verify)

    # -- the index ----------------------------------------------------------------------------
    def _read_index(self) -> dict[str, Any]:
        folder, setting = self.folder, self.setting
        if not folder.exists():
            raise ShardError(
                f"`{setting}`={str(folder)!r} does not exist; prepare it with `python -m sru_lightning prepare "
                f"data=<your data> out={folder}`"
            )
        if not folder.is_dir():
            raise ShardError(f"`{setting}`={str(folder)!r} must be a folder written by prepare, got a file")
        path = folder / INDEX_NAME
        if not path.is_file():
            raise ShardError(
                f"{str(path)!r} does not exist: `{setting}` is not a prepared folder, or its prepare did not "
                f"finish; {_REPAIR}"
            )
        try:
            index = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            raise ShardError(f"{str(path)!r} cannot be read as an index ({error}); {_REPAIR}") from None
        if not isinstance(index, dict) or index.get("format") != FORMAT_NAME:
            got = index.get("format") if isinstance(index, dict) else type(index).__name__
            raise ShardError(
                f"{str(path)!r} is not an index written by `python -m sru_lightning prepare` (format "
                f"{got!r}, expected {FORMAT_NAME!r}); point `{setting}` at a prepared folder"
            )
        version = index.get("version")
        if version != FORMAT_VERSION:
            raise ShardError(
                f"{str(path)!r} is in version {version!r} of the format; this sru_lightning reads version "
                f"{FORMAT_VERSION}: prepare the corpus again with it"
            )
        if index.get("checksum") != index_checksum(index):
            raise ShardError(
                f"{str(path)!r} was changed after prepare wrote it (its checksum does not match its content); "
                f"the shards may not be what it says: {_REPAIR}, rather than editing the index"
            )
        return index

    def _checked_file(self, entry: dict[str, Any], dtype: str, verify: bool) -> ArrayFile:
        path = self.folder / entry["file"]
        if not path.is_file():
            raise ShardError(f"{str(path)!r}, listed in {INDEX_NAME}, is missing: the folder is incomplete; {_REPAIR}")
        size = path.stat().st_size
        if size != entry["bytes"]:
            state = "truncated" if size < entry["bytes"] else "longer than written"
            raise ShardError(f"{str(path)!r} is {state} ({size} bytes, {INDEX_NAME} says {entry['bytes']}); {_REPAIR}")
        with open(path, "rb") as handle:
            header = handle.read(HEADER_BYTES)
        magic, _, code, corpus, items = _HEADER.unpack(header[: _HEADER.size])
        if magic != MAGIC or corpus != uuid.UUID(self.corpus_id).bytes or code != DTYPES[dtype]:
            raise ShardError(
                f"{str(path)!r} does not belong to the corpus {INDEX_NAME} describes (its header names another "
                f"prepared corpus); files of two prepared folders were mixed: {_REPAIR}"
            )
        if items != entry["items"]:
            raise ShardError(f"{str(path)!r} holds {items} items, {INDEX_NAME} says {entry['items']}; {_REPAIR}")
        if verify and stored_checksum(path) != entry["sha256"]:
            raise ShardError(f"{str(path)!r} has changed since prepare wrote it (its SHA-256 differs); {_REPAIR}")
        return ArrayFile(path, int(items), dtype)

    def _split(self, split: str, verify: bool) -> PreparedSplit:
        entry = self.index["splits"][split]
        shards = tuple(self._checked_file(shard, self.dtype, verify) for shard in entry["shards"])
        if sum(shard.items for shard in shards) != entry["tokens"]:
            raise ShardError(
                f"the shards of the {split} split in {str(self.folder)!r} do not add up to the {entry['tokens']} "
                f"tokens {INDEX_NAME} says; {_REPAIR}"
            )
        documents = entry.get("documents")
        document_file = None if documents is None else self._checked_file(documents, "int64", verify)
        return PreparedSplit(int(entry["tokens"]), shards, document_file)

    # -- what the index says ------------------------------------------------------------------
    @property
    def codec_state(self) -> dict[str, Any]:
        return self.index["codec"]

    @property
    def source(self) -> dict[str, Any]:
        return self.index.get("source", {})

    def token_counts(self, split: str) -> np.ndarray:
        """(vocab_size,) int64: how often each id is a predicted token of `split` (every token, or
        with documents every token but each document's first)."""
        return np.asarray(self._counts.open()[SPLITS.index(split) * self.vocab_size :][: self.vocab_size])

    def describe(self) -> str:
        return f"the shards in {str(self.folder)!r}"
