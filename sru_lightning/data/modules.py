"""LightningDataModules for language modelling; every corpus is read from local disk."""

from __future__ import annotations

import codecs
import math
import os
import sysconfig
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader

from .sampling import ResumableDataLoader
from .streams import ContiguousStreams, Vocabulary, split_by_fractions, unigram_bits_per_token, word_tokens
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
        for name, value in (("batch_size", batch_size), ("seq_len", seq_len)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{type(self).__name__}: `data.{name}` must be a positive integer, got {value!r}")
        if eval_batch_size is not None and (not isinstance(eval_batch_size, int) or eval_batch_size < 1):
            raise ValueError(
                f"{type(self).__name__}: `data.eval_batch_size` must be a positive integer or null, "
                f"got {eval_batch_size!r}"
            )
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


def _readable_path(path, config_key: str, owner: str, what: str) -> Path:
    if path is None or str(path) == "":
        raise ValueError(f"{owner}: `{config_key}` is not set; set {config_key}=/path/to/{what}")
    resolved = Path(str(path)).expanduser()
    if not resolved.exists():
        raise ValueError(
            f"{owner}: `{config_key}` must point to {what}, got {str(path)!r}, which does not exist "
            f"(relative paths are resolved from {Path.cwd()})"
        )
    return resolved


def text_files(folder: Path) -> list[Path]:
    """The files under `folder`, sorted by path, hidden ones left out as shell globs and ripgrep
    leave them out: a file whose name starts with "." and everything inside a folder whose name
    does (``.git``, ``.ipynb_checkpoints``, ``.venv`` ...). `folder` itself may be hidden."""
    found = []
    for root, folders, files in os.walk(folder):
        folders[:] = [name for name in folders if not name.startswith(".")]  # not walked into
        found.extend(Path(root) / name for name in files if not name.startswith("."))
    return sorted(file for file in found if file.is_file())


def read_text_file(file: Path, encoding: str, owner: str) -> str:
    """The text of `file` (under `data.path`) in `encoding`; a binary file (one holding NUL bytes)
    is named as one, and text in another encoding is told to set `data.encoding`."""
    binary = (
        f"{owner}: {str(file)!r} under `data.path` is a binary file (it holds NUL bytes), not text; "
        "move it out of data.path (hidden files and folders, named with a leading '.', are skipped)"
    )
    try:
        text = file.read_text(encoding=encoding)
    except UnicodeDecodeError as error:
        with open(file, "rb") as handle:
            if b"\0" in handle.read():
                raise ValueError(binary) from None
        raise ValueError(
            f"{owner}: cannot read {str(file)!r} under `data.path` as {encoding} text ({error.reason} at byte "
            f"{error.start}); set data.encoding if it is text in another encoding, or move it out of data.path"
        ) from None
    except OSError as error:
        raise ValueError(f"{owner}: cannot read {str(file)!r} under `data.path`: {error}") from error
    if "\0" in text:  # NUL decodes in utf-8 and latin-1, but no text holds it
        raise ValueError(binary)
    return text


class PydocDataModule(LanguageModelDataModule):
    """English prose shipped with every CPython (`pydoc_data.topics`), character level.

    The topics are joined in sorted-key order, so the split is the same on every machine
    running the same Python version.
    """

    def __init__(self, val_fraction: float = 0.05, test_fraction: float = 0.05, **kwargs) -> None:
        super().__init__(**kwargs)
        split_by_fractions(1, val_fraction, test_fraction)  # validates the fractions now
        self.val_fraction = val_fraction
        self.test_fraction = test_fraction

    def _text(self) -> str:
        from pydoc_data.topics import topics

        return "\n\n".join(topics[key] for key in sorted(topics))

    def load_corpus(self) -> Corpus:
        return _char_corpus(self._text(), self.val_fraction, self.test_fraction)

    def split_texts(self) -> tuple[str, str, str]:
        return _split_text(self._text(), self.val_fraction, self.test_fraction)


class StdlibDataModule(LanguageModelDataModule):
    """The running interpreter's standard-library Python sources, character level.

    Files are read in sorted path order (site-packages excluded) up to `max_chars`.
    """

    def __init__(
        self,
        max_chars: int = 20_000_000,
        val_fraction: float = 0.05,
        test_fraction: float = 0.05,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        if not isinstance(max_chars, int) or max_chars < 10_000:
            raise ValueError(f"StdlibDataModule: `data.max_chars` must be an integer >= 10000, got {max_chars!r}")
        split_by_fractions(1, val_fraction, test_fraction)
        self.max_chars = max_chars
        self.val_fraction = val_fraction
        self.test_fraction = test_fraction

    def load_corpus(self) -> Corpus:
        return _char_corpus(self._text(), self.val_fraction, self.test_fraction)

    def split_texts(self) -> tuple[str, str, str]:
        return _split_text(self._text(), self.val_fraction, self.test_fraction)

    def _text(self) -> str:
        root = Path(sysconfig.get_paths()["stdlib"])
        pieces, total = [], 0
        for file in sorted(root.rglob("*.py")):
            relative = file.relative_to(root)
            if "site-packages" in relative.parts or "dist-packages" in relative.parts:
                continue
            try:
                source = file.read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            pieces.append(source)
            total += len(source)
            if total >= self.max_chars:
                break
        text = "\n".join(pieces)[: self.max_chars]
        if len(text) < 10_000:
            raise ValueError(f"StdlibDataModule: found only {len(text)} characters of sources under {root}")
        return text


class Enwik8DataModule(LanguageModelDataModule):
    """The Hutter Prize enwik8 file (or enwik8.zip), byte level, first 90M/5M/5M bytes.

    Byte values are the token ids (vocabulary 256), as in the character-level LM literature.
    """

    token_level = "byte"

    def __init__(
        self,
        path: str | None = None,
        train_bytes: int = 90_000_000,
        val_bytes: int = 5_000_000,
        test_bytes: int = 5_000_000,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        self.path = _readable_path(path, "data.path", "Enwik8DataModule", "the enwik8 file or enwik8.zip")
        for name, value in (("train_bytes", train_bytes), ("val_bytes", val_bytes), ("test_bytes", test_bytes)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"Enwik8DataModule: `data.{name}` must be a positive integer, got {value!r}")
        self.sizes = (train_bytes, val_bytes, test_bytes)

    def _read(self) -> bytes:
        needed = sum(self.sizes)
        try:
            if zipfile.is_zipfile(self.path):
                with zipfile.ZipFile(self.path) as archive:
                    member = "enwik8" if "enwik8" in archive.namelist() else archive.namelist()[0]
                    with archive.open(member) as handle:
                        return handle.read(needed)
            with open(self.path, "rb") as handle:
                return handle.read(needed)
        except (OSError, zipfile.BadZipFile, IndexError) as error:
            raise ValueError(f"Enwik8DataModule: cannot read `data.path`={str(self.path)!r}: {error}") from error

    def load_corpus(self) -> Corpus:
        data = self._read()
        needed = sum(self.sizes)
        if len(data) < needed:
            raise ValueError(
                f"Enwik8DataModule: `data.path`={str(self.path)!r} holds {len(data)} bytes, but the split "
                f"train_bytes+val_bytes+test_bytes needs {needed}; point data.path at the full enwik8 "
                "or lower data.train_bytes / data.val_bytes / data.test_bytes"
            )
        ids = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        n_train, n_val, _ = self.sizes
        return Corpus(ids[:n_train], ids[n_train : n_train + n_val], ids[n_train + n_val : needed], 256)

    def split_texts(self) -> tuple[str, str, str]:
        data = self._read()
        n_train, n_val, n_test = self.sizes
        bounds = {"train": (0, n_train), "val": (n_train, n_train + n_val), "test": (n_train + n_val, sum(self.sizes))}
        texts = []
        for split, (start, end) in bounds.items():
            try:
                texts.append(data[start:end].decode("utf-8"))
            except UnicodeDecodeError as error:
                raise ValueError(
                    f"Enwik8DataModule: data.tokenizer=bpe reads text, but the {split} split of "
                    f"`data.path`={str(self.path)!r} (bytes {start} to {end}) is not UTF-8 at its byte "
                    f"{error.start} ({error.reason}); move the split with data.train_bytes / data.val_bytes / "
                    "data.test_bytes so that no character is cut"
                ) from None
        return tuple(texts)


class TextDataModule(LanguageModelDataModule):
    """Any local text: a file, or a folder of files, at character or word level.

    A folder holding files whose names contain `train`, `valid`/`val` and `test` (wikitext's
    `wiki.train.tokens` ...) uses those splits. Otherwise all text files (sorted by path) are
    joined and split by `val_fraction` / `test_fraction`. At word level the vocabulary comes
    from the training split and unseen words map to `<unk>`.
    """

    LEVELS = ("char", "word")

    def __init__(
        self,
        path: str | None = None,
        level: str = "char",
        val_fraction: float = 0.05,
        test_fraction: float = 0.05,
        encoding: str = "utf-8",
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        self.path = _readable_path(path, "data.path", "TextDataModule", "a text file or a folder of text files")
        if level not in self.LEVELS:
            raise ValueError(f"TextDataModule: `data.level` must be one of {self.LEVELS}, got {level!r}")
        if self.tokenizer is not None and level != "char":
            raise ValueError(
                f"TextDataModule: data.tokenizer={self.tokenizer} learns its tokens from the text's bytes, so "
                f"`data.level` must stay char (its default), got {level!r}"
            )
        split_by_fractions(1, val_fraction, test_fraction)
        self.level = level
        self.token_level = self.tokenizer or level
        self.val_fraction = val_fraction
        self.test_fraction = test_fraction
        try:
            codecs.lookup(encoding)
        except (LookupError, TypeError):
            raise ValueError(
                f"TextDataModule: `data.encoding` must be a text encoding Python knows (utf-8, latin-1, ...), "
                f"got {encoding!r}"
            ) from None
        self.encoding = encoding

    def describe_source(self) -> str:
        return f"data.path={str(self.path)!r}"

    def _read_file(self, file: Path) -> str:
        text = read_text_file(file, self.encoding, "TextDataModule")
        if not text.strip():
            raise ValueError(
                f"TextDataModule: {str(file)!r} under `data.path` holds no text; a language model needs "
                "a file of at least a few thousand characters"
            )
        return text

    def _named_splits(self, files: list[Path]) -> dict[str, Path] | None:
        found: dict[str, Path] = {}
        for file in files:
            name = file.name.lower()
            for split, keys in (("train", ("train",)), ("val", ("valid", "val")), ("test", ("test",))):
                if any(key in name for key in keys):
                    found.setdefault(split, file)
                    break
        return found if len(found) == 3 else None

    def _texts(self) -> tuple[str, str, str] | str:
        if self.path.is_file():
            return self._read_file(self.path)
        files = text_files(self.path)
        if not files:
            raise ValueError(f"TextDataModule: `data.path`={str(self.path)!r} is a folder without files")
        named = self._named_splits(files)
        if named is not None:
            return tuple(self._read_file(named[split]) for split in SPLITS)
        return "\n".join(self._read_file(file) for file in files)

    def split_texts(self) -> tuple[str, str, str]:
        texts = self._texts()
        return _split_text(texts, self.val_fraction, self.test_fraction) if isinstance(texts, str) else texts

    def load_corpus(self) -> Corpus:
        texts = self._texts()
        if self.level == "char":
            if isinstance(texts, str):
                return _char_corpus(texts, self.val_fraction, self.test_fraction)
            vocab = Vocabulary("".join(texts))
            train, val, test = (vocab.encode(text) for text in texts)
            return Corpus(train, val, test, len(vocab), vocab.itos)
        if isinstance(texts, str):
            tokens = word_tokens(texts)
            train_slice, val_slice, test_slice = split_by_fractions(len(tokens), self.val_fraction, self.test_fraction)
            split_tokens = (tokens[train_slice], tokens[val_slice], tokens[test_slice])
        else:
            split_tokens = tuple(word_tokens(text) for text in texts)
        vocab = Vocabulary(split_tokens[0], unknown=UNKNOWN_WORD)
        train, val, test = (vocab.encode(tokens) for tokens in split_tokens)
        return Corpus(train, val, test, len(vocab), vocab.itos)
