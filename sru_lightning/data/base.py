"""The base of the language-modelling data modules: the vocabulary and its codec, the batch layout,
the loaders, the checkpoint state and the size checks every corpus shares."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader

from .sampling import ResumableDataLoader
from .streams import ContiguousStreams, Vocabulary, split_by_fractions, unigram_bits_per_token
from .subwords import MIN_BPE_VOCAB_SIZE, text_pieces, train_bpe
from .tokens import UNKNOWN_WORD, TokenCodec, token_unit

SPLITS = ("train", "val", "test")
#: `data.tokenizer` values: a vocabulary learned from the training split in place of the corpus's own tokens.
TOKENIZERS = ("bpe",)


def check_tokenizer(owner: str, tokenizer: str | None, vocab_size: int | None) -> None:
    """Raise ValueError unless `data.tokenizer` / `data.vocab_size` are null / null or bpe / an integer >= 257."""
    if tokenizer is not None and tokenizer not in TOKENIZERS:
        raise ValueError(
            f"{owner}: `data.tokenizer` must be null (the corpus's own tokens) or one of {', '.join(TOKENIZERS)}, "
            f"got {tokenizer!r}"
        )
    if tokenizer is None:
        if vocab_size is not None:
            raise ValueError(
                f"{owner}: `data.vocab_size` sets the size of a learned vocabulary and needs data.tokenizer=bpe, "
                f"got data.vocab_size={vocab_size!r} without it (this corpus's own tokens have a fixed vocabulary)"
            )
        return
    if not isinstance(vocab_size, int) or isinstance(vocab_size, bool) or vocab_size < MIN_BPE_VOCAB_SIZE:
        raise ValueError(
            f"{owner}: `data.vocab_size` must be an integer >= {MIN_BPE_VOCAB_SIZE} with data.tokenizer={tokenizer} "
            f"(the 256 bytes and at least one merge), got {vocab_size!r}"
        )


def check_batch_layout(owner: str, batch_size, seq_len, eval_batch_size) -> None:
    """Raise ValueError unless `data.batch_size` and `data.seq_len` are positive integers and
    `data.eval_batch_size` one or null."""
    for name, value in (("batch_size", batch_size), ("seq_len", seq_len)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{owner}: `data.{name}` must be a positive integer, got {value!r}")
    if eval_batch_size is not None and (not isinstance(eval_batch_size, int) or eval_batch_size < 1):
        raise ValueError(f"{owner}: `data.eval_batch_size` must be a positive integer or null, got {eval_batch_size!r}")


def encode_ids(codec: TokenCodec, text: str) -> torch.Tensor:
    """The BPE token ids of `text` as a compact tensor (int16 when the vocabulary allows), built
    part by part: a long text's ids never sit in one Python list."""
    dtype = torch.int16 if codec.vocab_size < 2**15 else torch.int32
    parts = [torch.tensor(ids, dtype=dtype) for ids in codec.encode_in_parts(text)]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=dtype)


@dataclass(frozen=True)
class Corpus:
    """Token ids of the three splits and the vocabulary size they index into."""

    train: torch.Tensor
    val: torch.Tensor
    test: torch.Tensor
    vocab_size: int
    itos: list[str] | None = None  # id -> token; None for byte level (id == byte value) and BPE (see the codec)


class LanguageModelDataModule(pl.LightningDataModule):
    """Shared batching for all corpora: contiguous `(batch_size, seq_len)` windows per split.

    Subclasses implement `load_corpus()`; it runs once, on first use, and is cached, so the
    vocabulary size is known before the model is built. Checkpoints written by a Trainer keep
    the vocabulary (`state_dict()`), so a model can be used without its corpus.

    ``tokenizer="bpe"`` replaces the corpus's own tokens by a byte-level BPE vocabulary of at most
    `vocab_size` tokens, learned from the training split alone (subclasses give the splits'
    texts through `split_texts()`); evaluating or continuing a checkpoint uses the checkpoint's.
    """

    token_level = "char"  # "byte", "char", "word" or "bpe": what one token id stands for

    def __init__(
        self,
        batch_size: int = 32,
        seq_len: int = 128,
        eval_batch_size: int | None = None,
        tokenizer: str | None = None,
        vocab_size: int | None = None,
    ) -> None:
        super().__init__()
        check_tokenizer(type(self).__name__, tokenizer, vocab_size)
        self.tokenizer = tokenizer
        self.bpe_vocab_size = vocab_size  # the most tokens the learned vocabulary may hold
        if tokenizer == "bpe":
            self.token_level = "bpe"
        self._codec: TokenCodec | None = None  # a learned (or a checkpoint's) vocabulary
        check_batch_layout(type(self).__name__, batch_size, seq_len, eval_batch_size)
        self.batch_size = batch_size
        self.seq_len = seq_len
        self.eval_batch_size = eval_batch_size or batch_size
        self._corpus: Corpus | None = None
        self._datasets: dict[str, ContiguousStreams] = {}

    # -- corpus -----------------------------------------------------------------------------
    def load_corpus(self) -> Corpus:
        raise NotImplementedError

    def split_texts(self) -> tuple[str, str, str]:
        """The texts of the training, validation and test splits (what a BPE vocabulary reads)."""
        raise NotImplementedError(f"{type(self).__name__} does not support data.tokenizer=bpe")

    def load_bpe_corpus(self) -> Corpus:
        """The splits in BPE tokens: a vocabulary learned from the training text alone, unless a
        checkpoint's was adopted (`adopt_vocabulary`)."""
        texts = self.split_texts()
        if self._codec is None:
            self._codec = TokenCodec("bpe", tokenizer=train_bpe(text_pieces(texts[0]), self.bpe_vocab_size))
        train, val, test = (encode_ids(self._codec, text) for text in texts)
        return Corpus(train, val, test, self._codec.vocab_size)

    @property
    def corpus(self) -> Corpus:
        if self._corpus is None:
            self._corpus = self.load_bpe_corpus() if self.token_level == "bpe" else self.load_corpus()
        return self._corpus

    @property
    def vocab_size(self) -> int:
        return self.corpus.vocab_size

    def unigram_bpc(self, split: str = "val") -> float:
        """Bits per token of `split` under a unigram model fitted on the training split."""
        if split not in SPLITS:
            raise ValueError(f"unigram_bpc: `split` must be one of {SPLITS}, got {split!r}")
        return unigram_bits_per_token(self.corpus.train, getattr(self.corpus, split), self.vocab_size)

    def describe_source(self) -> str:
        """Where the text comes from, for error messages."""
        return type(self).__name__

    def check_sizes(self, world_size: int = 1) -> None:
        """Raise ValueError when a split is too short for its batch layout (before training)."""
        fractions = {
            "train": 1.0 - getattr(self, "val_fraction", 0.0) - getattr(self, "test_fraction", 0.0),
            "val": getattr(self, "val_fraction", None),
            "test": getattr(self, "test_fraction", None),
        }
        for split in SPLITS:
            batch_size = self.batch_size if split == "train" else self.eval_batch_size
            tokens = getattr(self.corpus, split).numel()
            needed = batch_size * world_size * self.seq_len + 1
            if tokens >= needed:
                continue
            size_key = "data.batch_size" if split == "train" else "data.eval_batch_size"
            hint = ""
            fraction = fractions.get(split)
            if fraction:
                tokens = math.ceil(needed / fraction)
                hint = f" (the whole text needs about {tokens} tokens at {split} fraction {fraction:g})"
            raise ValueError(
                f"{type(self).__name__}: the {split} split of {self.describe_source()} has {tokens} tokens, too few "
                f"for {batch_size} streams x {world_size} process(es) x data.seq_len={self.seq_len}: it needs at "
                f"least {needed}{hint}; use more text or lower {size_key} / data.seq_len"
            )

    @property
    def token_unit(self) -> str:
        """What metrics count per token: "char" (characters and bytes), "word" or "token" (BPE)."""
        return token_unit(self.token_level)

    @property
    def codec(self) -> TokenCodec:
        """Text <-> token ids for this corpus."""
        if self.token_level == "bpe":
            self.corpus  # noqa: B018  (learns the vocabulary, unless a checkpoint's was adopted)
            return self._codec
        unknown = UNKNOWN_WORD if self.token_level == "word" else None
        return TokenCodec(self.token_level, self.corpus.itos, unknown=unknown)

    def token_byte_lengths(self) -> torch.Tensor:
        """(vocab_size,) long: the UTF-8 bytes each token id stands for (see TokenCodec.token_byte_lengths)."""
        return torch.tensor(self.codec.token_byte_lengths(), dtype=torch.long)

    def _level_setting(self, level: str) -> str:
        if level == "bpe":
            return "data.tokenizer=bpe"
        if self.token_level == "bpe":
            return "data.tokenizer=null" + (f" data.level={level}" if hasattr(self, "level") else "")
        return f"data.level={level}"

    def adopt_vocabulary(self, codec: TokenCodec) -> int:
        """Encode every split with `codec` (a checkpoint's vocabulary) instead of the corpus's own,
        so token ids mean what they meant in training. Returns how many words became the unknown
        word; a character (or word, without an unknown token) `codec` lacks is a ValueError.
        A BPE vocabulary is used as it is: the data's own is not learned."""
        if codec.level != self.token_level and {codec.level, self.token_level} != {"char"}:
            raise ValueError(
                f"{type(self).__name__}: the checkpoint reads {codec.level}-level tokens, but the data "
                f"({self.describe_source()}) is {self.token_level}-level; set {self._level_setting(codec.level)}"
            )
        if codec.level == "bpe":
            if self._codec is None or self._codec.state_dict() != codec.state_dict():
                self._codec, self._corpus, self._datasets = codec, None, {}
            return 0
        own = self.corpus
        if codec.itos is None or own.itos == codec.itos:
            return 0
        unknown_id = codec.stoi.get(codec.unknown) if codec.unknown is not None else None
        splits, unknown = {}, 0
        for split in SPLITS:
            tokens = [own.itos[index] for index in getattr(own, split).tolist()]
            missing = sorted({token for token in tokens if token not in codec.stoi})
            if missing and unknown_id is None:
                kind = "characters" if codec.level == "char" else "words"
                shown = "".join(missing[:10]) if codec.level == "char" else " ".join(missing[:5])
                raise ValueError(
                    f"{type(self).__name__}: the {split} split of {self.describe_source()} holds {kind} "
                    f"{shown!r} that are not in the checkpoint's vocabulary of {codec.vocab_size} {kind}; "
                    "evaluate it on text its vocabulary covers"
                )
            if unknown_id is not None:  # words the checkpoint reads as its unknown word
                unknown += sum(token not in codec.stoi or token == codec.unknown for token in tokens)
            splits[split] = torch.tensor([codec.stoi.get(token, unknown_id) for token in tokens], dtype=torch.long)
        self._corpus = Corpus(splits["train"], splits["val"], splits["test"], codec.vocab_size, list(codec.itos))
        self._datasets = {}
        return unknown

    def decode(self, ids: torch.Tensor) -> str:
        """Text of `ids`: characters (or UTF-8 bytes) joined, words separated by spaces."""
        return self.codec.decode(ids.tolist())

    def state_dict(self) -> dict:
        # Saved in every Trainer checkpoint: what `generate` needs to read and write text.
        return {"token_codec": self.codec.state_dict()}

    def load_state_dict(self, state_dict: dict) -> None:
        """A resumed fit reads the checkpoint's BPE vocabulary, should the one learned again from
        the training split differ from it (other text, another `tokenizers`): ids keep their meaning."""
        saved = state_dict.get("token_codec") if isinstance(state_dict, Mapping) else None
        if self.token_level != "bpe" or not isinstance(saved, Mapping) or saved.get("level") != "bpe":
            return
        codec = TokenCodec.from_state_dict(saved)
        if self._codec is not None and codec.state_dict() == self._codec.state_dict():
            return
        if self._corpus is not None and codec.vocab_size != self.corpus.vocab_size:
            raise ValueError(
                f"{type(self).__name__}: the checkpoint's BPE vocabulary has {codec.vocab_size} tokens, but the one "
                f"learned from {self.describe_source()} has {self.corpus.vocab_size}; resume with the text and "
                "data.vocab_size the checkpoint was trained with"
            )
        self.adopt_vocabulary(codec)

    # -- Lightning hooks --------------------------------------------------------------------
    def setup(self, stage: str | None = None) -> None:
        rank, world_size = 0, 1
        if self.trainer is not None:
            rank, world_size = self.trainer.global_rank, self.trainer.world_size
        for split in SPLITS:
            batch_size = self.batch_size if split == "train" else self.eval_batch_size
            self._datasets[split] = ContiguousStreams(
                getattr(self.corpus, split), batch_size, self.seq_len, rank=rank, world_size=world_size
            )

    def _loader(self, split: str) -> DataLoader:
        if split not in self._datasets:
            self.setup()
        # Batches are already whole windows; the streams' order must be kept for state carry.
        # The training loader remembers its position, so a mid-epoch checkpoint resumes there.
        loader_class = ResumableDataLoader if split == "train" else DataLoader
        return loader_class(self._datasets[split], batch_size=None)

    def train_dataloader(self) -> DataLoader:
        return self._loader("train")

    def val_dataloader(self) -> DataLoader:
        return self._loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._loader("test")


def _split_text(text: str, val_fraction: float, test_fraction: float) -> tuple[str, str, str]:
    train, val, test = split_by_fractions(len(text), val_fraction, test_fraction)
    return text[train], text[val], text[test]


def _char_corpus(text: str, val_fraction: float, test_fraction: float) -> Corpus:
    train, val, test = split_by_fractions(len(text), val_fraction, test_fraction)
    vocab = Vocabulary(text)
    ids = vocab.encode(text)
    return Corpus(ids[train], ids[val], ids[test], len(vocab), vocab.itos)
