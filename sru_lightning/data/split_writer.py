"""The final ids of a prepared corpus into its shards, split by split, with the token counts
and document offsets the index records (:mod:`.shards`); shared by every token level of
:mod:`.prepare`."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from . import shards
from .sources import CorpusReading
from .tokens import TokenCodec

SPLITS = shards.SPLITS


def count_ids(ids: np.ndarray, vocab_size: int) -> np.ndarray:
    """(vocab_size,) int64: how often each id occurs (torch's bincount: several times numpy's)."""
    import torch

    if ids.dtype == np.uint16 and vocab_size <= 2**15:
        signed = ids.view(np.int16)  # the same values: no copy
    elif ids.dtype == np.uint8:
        signed = ids
    else:
        signed = ids.astype(np.int64, copy=False)
    return torch.bincount(torch.from_numpy(np.ascontiguousarray(signed)), minlength=vocab_size).numpy()


def document_split(count: int, reading: CorpusReading) -> tuple[int, int]:
    """(training documents, validation documents) of `count`, as the documents module splits them."""
    if count < 3:
        raise ValueError(
            f"{reading.owner}: `data.path` must hold at least 3 non-empty documents (one each for training, "
            f"validation and test), got {count}"
        )
    n_val = max(1, math.floor(count * reading.val_fraction))
    n_test = max(1, math.floor(count * reading.test_fraction))
    return count - n_val - n_test, n_val


class SplitsWriter:
    """The final ids of each split into its shards, the token counts of what each split predicts,
    the documents' offsets, and the index describing them."""

    def __init__(self, preparation, codec: TokenCodec) -> None:
        self.preparation, self.codec = preparation, codec
        self.folder, self.corpus_id = preparation.folder, preparation.corpus_id
        self.dtype = shards.token_dtype(codec.vocab_size)
        self.shard_tokens = max(1, int(preparation.options.shard_mb * 2**20) // np.dtype(self.dtype).itemsize)
        self.counts = np.zeros((len(SPLITS), codec.vocab_size), dtype=np.int64)
        self.splits: dict[str, dict[str, Any]] = {}
        self.current: shards.SplitWriter | None = None
        self.split = ""
        self.packs_documents = preparation.reading.layout == "documents"
        self._counting = ThreadPoolExecutor(max_workers=1, thread_name_prefix="count-ids")

    def begin(self, split: str) -> None:
        self.split = split
        self.current = shards.SplitWriter(self.folder, split, self.dtype, self.corpus_id, self.shard_tokens)
        self.splits[split] = {"documents": None, "document_count": None}

    def append(self, ids: np.ndarray) -> None:
        ids = ids.astype(self.dtype, copy=False)
        # counted on a second core while this one hashes and writes (both release the GIL)
        counting = self._counting.submit(count_ids, ids, self.codec.vocab_size)
        self.current.append(ids)
        self.counts[SPLITS.index(self.split)] += counting.result()

    def set_documents(self, offsets: np.ndarray, scratch=None, positions=None, mapping=None) -> None:
        """The documents' first tokens (offsets within the split): recorded, and left out of the
        counts (no model is asked for a document's first token). Their ids are read from
        `scratch` at `positions` (through `mapping`) unless the caller subtracts them itself."""
        entry = shards.write_array_file(self.folder / shards.documents_name(self.split), offsets, self.corpus_id)
        self.splits[self.split].update(documents=entry, document_count=int(offsets.size))
        if scratch is not None and positions.size:
            first = np.asarray(scratch[positions])
            first = first if mapping is None else mapping[first]
            self.uncount(first)

    def uncount(self, first_ids: np.ndarray) -> None:
        self.counts[SPLITS.index(self.split)] -= count_ids(first_ids, self.codec.vocab_size)

    def end(self) -> None:
        shard_entries = self.current.close()
        self.splits[self.split].update(tokens=self.current.tokens, shards=shard_entries)
        self.current = None

    def abort(self) -> None:
        self._counting.shutdown()
        if self.current is not None:
            self.current.abort()

    def index(self) -> dict[str, Any]:
        self._counting.shutdown()
        counts = shards.write_array_file(self.folder / shards.COUNTS_NAME, self.counts.reshape(-1), self.corpus_id)
        return {
            "format": shards.FORMAT_NAME,
            "version": shards.FORMAT_VERSION,
            "corpus_id": self.corpus_id,
            "codec": self.codec.state_dict(),
            "token_level": self.codec.level,
            "vocab_size": self.codec.vocab_size,
            "dtype": self.dtype,
            "packs_documents": self.packs_documents,
            "splits": self.splits,
            "token_counts": counts,
        }
