"""Language-modelling data: contiguous token streams from local corpora."""

from .modules import (
    Corpus,
    Enwik8DataModule,
    LanguageModelDataModule,
    PydocDataModule,
    StdlibDataModule,
    TextDataModule,
)
from .streams import ContiguousStreams, Vocabulary, unigram_bits_per_token
from .tokens import TokenCodec

__all__ = [
    "ContiguousStreams",
    "Corpus",
    "Enwik8DataModule",
    "LanguageModelDataModule",
    "PydocDataModule",
    "StdlibDataModule",
    "TextDataModule",
    "TokenCodec",
    "Vocabulary",
    "unigram_bits_per_token",
]
