"""`data=shards`: training, evaluation and generation from a prepared folder (``python -m
sru_lightning prepare``), read by memory map one window at a time.

Nothing is tokenized at start: the vocabulary, the token level and whether the data packs
documents come from the folder's index, and the batches are those of the in-memory module the
corpus was prepared from (:mod:`.mapped_streams`). The folder is only read.
"""

from __future__ import annotations

from collections.abc import Mapping

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader

from .base import SPLITS, check_batch_layout
from .mapped_streams import MappedDocumentRows, MappedPackedDocuments, MappedStreams, MappedTokens
from .sampling import ResumableDataLoader
from .shards import PreparedCorpus
from .streams import unigram_bits_from_counts
from .tokens import TokenCodec, token_unit


class ShardDataModule(pl.LightningDataModule):
    """Batches of a prepared corpus (`path`: the folder `prepare` wrote).

    `tokenizer` and `vocab_size` are the index's: left null they are read from it; set, they must
    agree with it (a corpus is prepared again for another vocabulary). `num_workers` DataLoader
    workers each read their own windows; `verify` checks every file's SHA-256 before the first
    batch (it reads the whole folder once; sizes and headers are always checked).
    """

    #: the token ids are the prepared ones: a checkpoint's vocabulary must be this one
    reads_prepared_ids = True

    def __init__(
        self,
        path: str | None = None,
        batch_size: int = 32,
        seq_len: int = 128,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
        verify: bool = False,
        tokenizer: str | None = None,
        vocab_size: int | None = None,
    ) -> None:
        super().__init__()
        owner = type(self).__name__
        if path is None or str(path) == "":
            raise ValueError(f"{owner}: `data.path` is not set; set data.path=/path/to/a/folder/written/by/prepare")
        check_batch_layout(owner, batch_size, seq_len, eval_batch_size)
        if not isinstance(num_workers, int) or isinstance(num_workers, bool) or num_workers < 0:
            raise ValueError(f"{owner}: `data.num_workers` must be an integer >= 0, got {num_workers!r}")
        self.prepared = PreparedCorpus(path, verify=bool(verify))
        self.path = self.prepared.folder
        self.batch_size, self.seq_len = batch_size, seq_len
        self.eval_batch_size = eval_batch_size or batch_size
        self.num_workers = num_workers
        self._codec = TokenCodec.from_state_dict(self.prepared.codec_state)
        self.token_level = self._codec.level
        self.tokenizer = "bpe" if self.token_level == "bpe" else None
        self.packs_documents = self.prepared.packs_documents
        self._check_agrees(tokenizer, vocab_size)
        self._tokens = {split: MappedTokens(self.prepared.splits[split].shards) for split in SPLITS}
        self._datasets: dict = {}

    def _check_agrees(self, tokenizer, vocab_size) -> None:
        prepared = f"{self.token_level} level, {self.vocab_size} tokens"
        for key, given, own in (("tokenizer", tokenizer, self.tokenizer), ("vocab_size", vocab_size, self.vocab_size)):
            if given is not None and given != own:
                raise ValueError(
                    f"{type(self).__name__}: `data.{key}`={given!r} conflicts with {self.describe_source()}, "
                    f"prepared at {prepared} (data.{key}={own!r}); leave data.tokenizer and data.vocab_size unset "
                    "(the index sets them), or prepare the corpus again with the vocabulary you want"
                )

    # -- what the index says ----------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.prepared.vocab_size

    @property
    def codec(self) -> TokenCodec:
        return self._codec

    @property
    def token_unit(self) -> str:
        return token_unit(self.token_level)

    def describe_source(self) -> str:
        return self.prepared.describe()

    def decode(self, ids: torch.Tensor) -> str:
        return self._codec.decode(ids.tolist())

    def token_byte_lengths(self) -> torch.Tensor:
        return torch.tensor(self._codec.token_byte_lengths(), dtype=torch.long)

    def unigram_bpc(self, split: str = "val") -> float:
        """Bits per token of `split`'s predicted tokens under a unigram model of the training
        split's, from the counts `prepare` stored (nothing is read again)."""
        if split not in SPLITS:
            raise ValueError(f"unigram_bpc: `split` must be one of {SPLITS}, got {split!r}")
        counts = {name: torch.from_numpy(self.prepared.token_counts(name).copy()) for name in ("train", split)}
        return unigram_bits_from_counts(counts["train"], counts[split])

    def check_sizes(self, world_size: int = 1) -> None:
        """Raise ValueError when a split is too short for its batch layout (before training)."""
        splits = ("train",) if self.packs_documents else SPLITS
        for split in splits:
            batch_size = self.batch_size if split == "train" else self.eval_batch_size
            tokens = self.prepared.splits[split].tokens
            needed = batch_size * world_size * self.seq_len + 1
            if tokens < needed:
                size_key = "data.batch_size" if split == "train" else "data.eval_batch_size"
                raise ValueError(
                    f"ShardDataModule: the {split} split of {self.describe_source()} has {tokens} tokens, too few for "
                    f"{batch_size} streams x {world_size} process(es) x data.seq_len={self.seq_len}: it needs at "
                    f"least {needed}; lower {size_key} / data.seq_len or prepare more text"
                )
        for split in ("val", "test") if self.packs_documents else ():
            if int(self.prepared.token_counts(split).sum()) == 0:
                raise ValueError(
                    f"ShardDataModule: the {split} split of {self.describe_source()} has nothing to predict: its "
                    "documents are 1 token long each, and a document's first token is never predicted"
                )

    # -- checkpoints ------------------------------------------------------------------------
    def adopt_vocabulary(self, codec: TokenCodec) -> int:
        """A checkpoint's vocabulary must be the one the shards were prepared with: their ids
        cannot be encoded again. Returns 0 (no word became unknown)."""
        if codec.state_dict() != self._codec.state_dict():
            raise ValueError(
                f"{type(self).__name__}: the checkpoint's vocabulary ({codec.level} level, {codec.vocab_size} tokens) "
                f"is not the one of {self.describe_source()} ({self.token_level} level, {self.vocab_size} tokens), "
                "so their ids mean other tokens; use shards prepared from the checkpoint's data settings (its run's "
                ".hydra/config.yaml), or the in-memory data it was trained on"
            )
        return 0

    def state_dict(self) -> dict:
        return {"token_codec": self._codec.state_dict(), "prepared_corpus": self.prepared.corpus_id}

    def load_state_dict(self, state_dict: dict) -> None:
        saved = state_dict.get("token_codec") if isinstance(state_dict, Mapping) else None
        if isinstance(saved, Mapping):
            self.adopt_vocabulary(TokenCodec.from_state_dict(saved))

    # -- Lightning hooks --------------------------------------------------------------------
    def setup(self, stage: str | None = None) -> None:
        rank, world_size = 0, 1
        if self.trainer is not None:
            rank, world_size = self.trainer.global_rank, self.trainer.world_size
        layout = {"rank": rank, "world_size": world_size}
        for split in SPLITS:
            batch_size = self.batch_size if split == "train" else self.eval_batch_size
            tokens = self._tokens[split]
            if not self.packs_documents:
                self._datasets[split] = MappedStreams(tokens, batch_size, self.seq_len, **layout)
                continue
            documents = self.prepared.splits[split].documents
            dataset_class = MappedPackedDocuments if split == "train" else MappedDocumentRows
            self._datasets[split] = dataset_class(tokens, documents, batch_size, self.seq_len, **layout)

    def _loader(self, split: str) -> DataLoader:
        if split not in self._datasets:
            self.setup()
        # Whole windows in order (the state carries across them); the training loader remembers
        # its position and tells the dataset where a resumed epoch starts.
        loader_class = ResumableDataLoader if split == "train" else DataLoader
        return loader_class(self._datasets[split], batch_size=None, num_workers=self.num_workers)

    def train_dataloader(self) -> DataLoader:
        return self._loader("train")

    def val_dataloader(self) -> DataLoader:
        return self._loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._loader("test")
