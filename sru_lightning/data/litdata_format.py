"""A prepared corpus in LitData's format (``prepare ... format=litdata``): what `data=litdata`
streams from a local folder or object storage, on any number of machines.

The folder holds one LitData dataset per split (``train/``, ``val/``, ``test/``, each written by
``litdata.optimize`` with its tokens loader: the split's token ids in order, in chunks of exactly
`chunk_tokens` tokens but the last) and ``index/``, a LitData dataset of one item: the JSON text
that says what the ids mean (the codec, the dtype, each split's token count and token counts, the
chunk size, the source and its settings). The index is a LitData dataset too, so it is read from
object storage by the same code that reads the tokens.

LitData's tokens loader cuts a chunk into blocks of `seq_len` tokens and drops a chunk's
remainder; with `seq_len` dividing `chunk_tokens`, nothing is dropped and the blocks of a split
follow each other without a gap, which the carried-state streams need (:mod:`.litdata_streams`).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sru_lightning._atomic import put_in_place

from . import shards
from .mapped_streams import MappedTokens

#: What the index's `format` field says.
FORMAT_NAME = "sru_lightning.litdata"
FORMAT_VERSION = 1
INDEX_DATASET = "index"
SPLITS = shards.SPLITS
#: Tokens per chunk: 2**24 (32 MB of uint16 ids), divisible by every power of two up to it.
DEFAULT_CHUNK_TOKENS = 1 << 24
EXTRA_HINT = "pip install 'sru_lightning[data]'"


def require_litdata(setting: str):
    """The `litdata` module; a one-line ValueError naming `setting` and the extra without it."""
    try:
        import litdata
    except ImportError:
        raise ValueError(
            f"`{setting}` needs LitData, which is not installed: install the `data` extra ({EXTRA_HINT})"
        ) from None
    return litdata


def is_remote(path: str) -> bool:
    return "://" in str(path)


def join(path: str, name: str) -> str:
    return f"{str(path).rstrip('/')}/{name}" if is_remote(path) else str(Path(path) / name)


# --------------------------------------------------------------------------------------------
# writing
def _token_range(tokens: MappedTokens, span: tuple[int, int]) -> np.ndarray:
    return np.array(tokens.read(*span))


def _index_text(text: str) -> str:
    return text


def _optimize(litdata, fn, inputs: list, output_dir: Path, **options) -> None:
    # One worker: the items keep the order of `inputs` (the ids are already computed; the work is copying
    # numpy arrays). Forked where the system can (a spawned worker imports the package again, seconds).
    # `optimize` sets the process-wide start method to the one it uses; the process gets its own back,
    # so that what it starts afterwards (dataloader workers, a fit) starts as it would have.
    import multiprocessing

    start_method = multiprocessing.get_start_method(allow_none=True)
    fork = "fork" if "fork" in multiprocessing.get_all_start_methods() else None
    try:
        litdata.optimize(
            fn=fn, inputs=inputs, output_dir=str(output_dir), num_workers=1, verbose=False, start_method=fork, **options
        )
    finally:
        multiprocessing.set_start_method(start_method, force=True)


def write_litdata(prepared: shards.PreparedCorpus, out, *, chunk_tokens: int, overwrite: bool = False) -> dict:
    """Write the corpus of the prepared shards `prepared` into the folder `out` in LitData's
    format, under a hidden name beside it, renamed when complete. Returns the index."""
    litdata = require_litdata("format=litdata")
    if prepared.packs_documents:
        raise ValueError(
            "`format=litdata` writes contiguous token streams; this data has separate documents (data=documents), "
            "whose boundaries LitData's tokens loader does not keep: prepare it with format=shards"
        )
    out = Path(str(out)).expanduser().absolute()
    check_out(out, overwrite)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.incomplete-", dir=out.parent))
    try:
        index = {
            key: prepared.index[key]
            for key in ("codec", "token_level", "vocab_size", "dtype", "corpus_id", "source", "settings")
        }
        index.update(format=FORMAT_NAME, version=FORMAT_VERSION, chunk_tokens=int(chunk_tokens), splits={})
        for split in SPLITS:
            tokens = MappedTokens(prepared.splits[split].shards)
            spans = [(start, min(len(tokens), start + chunk_tokens)) for start in range(0, len(tokens), chunk_tokens)]
            if spans:  # LitData writes no dataset of nothing: an empty split has no folder
                loader = litdata.TokensLoader()
                fn = functools.partial(_token_range, tokens)
                _optimize(litdata, fn, spans, staging / split, chunk_size=chunk_tokens, item_loader=loader)
            index["splits"][split] = {
                "tokens": len(tokens),
                "token_counts": prepared.token_counts(split).tolist(),
            }
        _optimize(litdata, _index_text, [json.dumps(index, sort_keys=True)], staging / INDEX_DATASET, chunk_size=1)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(staging, 0o777 & ~umask)  # mkdtemp's folder is private; the corpus is not
        if out.exists():
            shutil.rmtree(out)
        put_in_place(staging, out)  # `out` is gone: a plain rename
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return index


def check_out(out: Path, overwrite: bool) -> None:
    """`out` may be written: absent, empty, or (with overwrite) a folder this format wrote."""
    if not out.exists() or (out.is_dir() and not any(out.iterdir())):
        return
    if not overwrite:
        raise ValueError(
            f"`out`={str(out)!r} already exists and is not empty; choose another folder or pass overwrite=true "
            "to replace a corpus prepared there"
        )
    present = {path.name for path in out.iterdir()} if out.is_dir() else set()
    ours = {INDEX_DATASET, *SPLITS}
    if not present or not present <= ours or INDEX_DATASET not in present:
        raise ValueError(
            f"`out`={str(out)!r} cannot be replaced: it is not a folder written by `prepare format=litdata` (it holds "
            f"{sorted(present)[:3]}); overwrite=true replaces only such a folder (move it away or choose another `out`)"
        )


# --------------------------------------------------------------------------------------------
# reading
@dataclass(frozen=True)
class LitDataSplit:
    tokens: int
    input_dir: str  # the split's LitData dataset


class LitDataCorpus:
    """A `format=litdata` folder's index, read through LitData (local folder or object storage).
    Answers what :class:`~.shards.PreparedCorpus` answers about the ids."""

    packs_documents = False

    def __init__(self, path: str, setting: str = "data.path") -> None:
        litdata = require_litdata(f"{setting} of data=litdata")
        self.folder = str(path) if is_remote(path) else str(Path(str(path)).expanduser().absolute())
        local = None if is_remote(self.folder) else Path(self.folder)
        if local is not None and not (local / INDEX_DATASET / "index.json").is_file():
            raise ValueError(
                f"`{setting}`={self.folder!r} is not a folder written by `python -m sru_lightning prepare ... "
                f"format=litdata` (it has no {INDEX_DATASET}/index.json); prepare it with format=litdata"
            )
        text = litdata.StreamingDataset(join(self.folder, INDEX_DATASET))[0]
        index = json.loads(text)
        if not isinstance(index, dict) or index.get("format") != FORMAT_NAME or index.get("version") != FORMAT_VERSION:
            got = (index.get("format"), index.get("version")) if isinstance(index, dict) else type(index).__name__
            raise ValueError(
                f"`{setting}`={self.folder!r} holds an index of format {got!r}, expected "
                f"({FORMAT_NAME!r}, {FORMAT_VERSION}): prepare the corpus again with format=litdata"
            )
        self.index: dict[str, Any] = index
        self.corpus_id: str = index["corpus_id"]
        self.dtype: str = index["dtype"]
        self.vocab_size: int = int(index["vocab_size"])
        self.chunk_tokens: int = int(index["chunk_tokens"])
        self.splits = {
            split: LitDataSplit(int(entry["tokens"]), join(self.folder, split))
            for split, entry in index["splits"].items()
        }

    @property
    def codec_state(self) -> dict[str, Any]:
        return self.index["codec"]

    @property
    def source(self) -> dict[str, Any]:
        return self.index.get("source", {})

    def token_counts(self, split: str) -> np.ndarray:
        return np.asarray(self.index["splits"][split]["token_counts"], dtype=np.int64)

    def describe(self) -> str:
        return f"the LitData corpus in {self.folder!r}"
