"""Language-modelling data: contiguous token streams from local corpora, separate documents
packed into rows with their boundaries, corpora prepared once into token shards and read by
memory map or streamed by LitData, and a DataLoader whose position inside the epoch survives
a checkpoint.

The names below are imported on first use, so a module that needs only the token codec
(`sru_lightning.data.tokens`, as reading a weights folder does) does not import Lightning.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "Corpus": ".base",
    "LanguageModelDataModule": ".base",
    "Enwik8DataModule": ".corpora",
    "PydocDataModule": ".corpora",
    "StdlibDataModule": ".corpora",
    "TextDataModule": ".corpora",
    "DocumentsDataModule": ".documents",
    "ShardDataModule": ".shard_module",
    "LitDataModule": ".litdata_module",
    "PreparedCorpus": ".shards",
    "ShardError": ".shards",
    "EpochSeededRandomSampler": ".sampling",
    "ResumableDataLoader": ".sampling",
    "global_seed": ".sampling",
    "ContiguousStreams": ".streams",
    "Vocabulary": ".streams",
    "unigram_bits_per_token": ".streams",
    "TokenCodec": ".tokens",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module_name = _EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module 'sru_lightning.data' has no attribute {name!r}")
    value = getattr(importlib.import_module(module_name, __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(__all__)
