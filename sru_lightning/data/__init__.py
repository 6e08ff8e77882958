"""Language-modelling data: contiguous token streams from local corpora, separate documents
packed into rows with their boundaries, and a DataLoader whose position inside the epoch survives
a checkpoint."""

from .base import Corpus, LanguageModelDataModule
from .corpora import Enwik8DataModule, PydocDataModule, StdlibDataModule, TextDataModule
from .documents import DocumentsDataModule
from .sampling import EpochSeededRandomSampler, ResumableDataLoader, global_seed
from .streams import ContiguousStreams, Vocabulary, unigram_bits_per_token
from .tokens import TokenCodec

__all__ = [
    "ContiguousStreams",
    "Corpus",
    "DocumentsDataModule",
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
