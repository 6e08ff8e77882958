"""Language-modelling data: contiguous token streams from local corpora, and a DataLoader whose
position inside the epoch survives a checkpoint."""

from .modules import (
    Corpus,
    Enwik8DataModule,
    LanguageModelDataModule,
    PydocDataModule,
    StdlibDataModule,
    TextDataModule,
)
from .sampling import EpochSeededRandomSampler, ResumableDataLoader, global_seed
from .streams import ContiguousStreams, Vocabulary, unigram_bits_per_token
from .tokens import TokenCodec

__all__ = [
    "ContiguousStreams",
    "Corpus",
    "Enwik8DataModule",
    "EpochSeededRandomSampler",
    "LanguageModelDataModule",
    "PydocDataModule",
    "ResumableDataLoader",
    "StdlibDataModule",
    "TextDataModule",
    "TokenCodec",
    "Vocabulary",
    "global_seed",
    "unigram_bits_per_token",
]
