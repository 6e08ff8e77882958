"""`data=litdata`: training and evaluation from a corpus prepared with ``prepare ... format=litdata``,
streamed by LitData from a local folder or object storage (``s3://...``), on one machine or many.

The vocabulary and the token level come from the folder's index, as with `data=shards`; the
batches are the carried-state contiguous streams of :mod:`.litdata_streams`, each rank reading
its own streams, and the training loader's position is LitData's ``StreamingDataLoader`` state.
"""

from __future__ import annotations

import lightning.pytorch as pl

from .base import SPLITS, check_batch_layout
from .litdata_format import LitDataCorpus, require_litdata
from .litdata_streams import blocks_per_row, stream_loader
from .shard_module import ShardDataModule
from .tokens import TokenCodec


class LitDataModule(ShardDataModule):
    """Batches of a `format=litdata` corpus (`path`: its folder, local or ``s3://...``).

    `num_workers` is 0 (the training process reads) or 1 (one worker reads ahead): more would
    split each rank's streams between workers whose batches do not continue each other.
    `cache_dir` is where LitData keeps the chunks it downloads (its default when null), and
    `max_cache_size` how much of them it keeps (LitData's own forms: "50GB", a byte count).
    `tokenizer` and `vocab_size`, set, must agree with the index.
    """

    def __init__(
        self,
        path: str | None = None,
        batch_size: int = 32,
        seq_len: int = 128,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
        cache_dir: str | None = None,
        max_cache_size: str | int = "50GB",
        tokenizer: str | None = None,
        vocab_size: int | None = None,
    ) -> None:
        pl.LightningDataModule.__init__(self)
        owner = type(self).__name__
        require_litdata("data=litdata")
        if path is None or str(path) == "":
            raise ValueError(
                f"{owner}: `data.path` is not set; set data.path=<folder or s3://bucket/prefix written by prepare "
                "format=litdata>"
            )
        check_batch_layout(owner, batch_size, seq_len, eval_batch_size)
        if num_workers not in (0, 1) or isinstance(num_workers, bool):
            raise ValueError(
                f"{owner}: `data.num_workers` must be 0 or 1, got {num_workers!r}: the carried-state streams of a rank "
                "are read in order by one reader (more workers would take turns and break the streams)"
            )
        self.prepared = LitDataCorpus(str(path))
        self.path = self.prepared.folder
        if self.prepared.chunk_tokens % seq_len:
            raise ValueError(
                f"{owner}: `data.seq_len`={seq_len} does not divide the {self.prepared.chunk_tokens} tokens of each "
                f"chunk of {self.describe_source()} (LitData drops a chunk's last partial block, and the streams "
                "would skip tokens); use a seq_len that divides it (a power of two does), or prepare again with "
                "chunk_tokens=<a multiple of seq_len>"
            )
        self.batch_size, self.seq_len = batch_size, seq_len
        self.eval_batch_size = eval_batch_size or batch_size
        self.num_workers = num_workers
        self.cache_dir, self.max_cache_size = cache_dir, max_cache_size
        self._codec = TokenCodec.from_state_dict(self.prepared.codec_state)
        self.token_level = self._codec.level
        self.tokenizer = "bpe" if self.token_level == "bpe" else None
        self.packs_documents = False
        self._check_agrees(tokenizer, vocab_size)
        self._world_size = 1

    def check_sizes(self, world_size: int = 1) -> None:
        """Raise ValueError when a split is too short for its streams (before training)."""
        for split in SPLITS:
            batch_size = self.batch_size if split == "train" else self.eval_batch_size
            tokens = self.prepared.splits[split].tokens
            if blocks_per_row(tokens, self.seq_len, batch_size * world_size) < 1:
                needed = (batch_size * world_size + 1) * self.seq_len
                size_key = "data.batch_size" if split == "train" else "data.eval_batch_size"
                raise ValueError(
                    f"{type(self).__name__}: the {split} split of {self.describe_source()} has {tokens} tokens, "
                    f"too few for {batch_size} streams x {world_size} process(es) x data.seq_len={self.seq_len}: it "
                    f"needs at least {needed}; lower {size_key} / data.seq_len or prepare more text"
                )

    def setup(self, stage: str | None = None) -> None:
        self._world_size = 1 if self.trainer is None else self.trainer.world_size

    def _loader(self, split: str):
        batch_size = self.batch_size if split == "train" else self.eval_batch_size
        return stream_loader(
            self.prepared.splits[split].input_dir,
            tokens=self.prepared.splits[split].tokens,
            batch_size=batch_size,
            seq_len=self.seq_len,
            world_size=self._world_size,
            num_workers=self.num_workers,
            cache_dir=self.cache_dir,
            max_cache_size=self.max_cache_size,
        )
