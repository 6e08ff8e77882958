"""A corpus of separate documents, packed into rows with their boundaries marked.

Batches are ``(inputs, targets, reset)``: ``reset`` (B, L) is True at each document's first
token, so the recurrence restarts there (see ``reset`` in
:func:`sru_lightning.ops.functional.sru_recurrence`), and a target that is the next document's
first token is :data:`IGNORED` (no document is predicted from another's last token). The flags
are cut into truncated-BPTT windows with the tokens, so the state a window carries over restarts
where a document starts inside it.

* Training rows are the documents joined end to end and cut into ``batch_size`` equal streams,
  as :class:`~sru_lightning.data.streams.ContiguousStreams` cuts a text: no padding, every
  window full.
* Validation and test rows hold whole documents (the longest first, each to the row with the
  fewest tokens so far) and end in ignored padding, so every document is read from its first
  token and its bits per character equal those of the document evaluated alone.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import torch
from torch.utils.data import IterableDataset

from .base import SPLITS, Corpus, LanguageModelDataModule, encode_ids
from .corpora import _readable_path, file_pieces, read_text_file, text_files
from .mapped_streams import assign_rows
from .streams import ContiguousStreams, Vocabulary, unigram_bits_per_token
from .subwords import text_pieces, train_bpe
from .tokens import TokenCodec

# The target index cross-entropy leaves out (torch's default ignore_index).
IGNORED = -100


class PackedDocumentStreams(ContiguousStreams):
    """Training windows ``(inputs, targets, reset)`` of a packed split: the joined documents cut
    into `batch_size` equal streams (each data-parallel rank its own) as
    :class:`~sru_lightning.data.streams.ContiguousStreams` cuts a text, read in windows of
    `seq_len`, with `starts` (True at each document's first token) laid out the same way. Every
    stream's first token counts as a document start (nothing comes before it)."""

    def __init__(
        self,
        tokens: torch.Tensor,
        starts: torch.Tensor,
        batch_size: int,
        seq_len: int,
        *,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        super().__init__(tokens, batch_size, seq_len, rank=rank, world_size=world_size)
        self.starts = starts[self.index].clone()
        self.starts[:, 0] = True

    def __iter__(self):
        for k in range(self.num_windows):
            span = slice(k * self.seq_len, (k + 1) * self.seq_len + 1)
            tokens, starts = self.streams[:, span].long(), self.starts[:, span]
            targets = torch.where(starts[:, 1:], torch.full_like(tokens[:, 1:], IGNORED), tokens[:, 1:])
            yield tokens[:, :-1], targets, starts[:, :-1]


class WholeDocumentRows(IterableDataset):
    """Evaluation windows ``(inputs, targets, reset)``: `batch_size` rows per rank, each a run of
    whole documents, padded at its end (padding targets are :data:`IGNORED`)."""

    def __init__(
        self,
        documents: list[torch.Tensor],
        batch_size: int,
        seq_len: int,
        *,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        super().__init__()
        assignment = assign_rows([document.numel() for document in documents], batch_size * world_size)
        rows = [[documents[index] for index in row] for row in assignment]
        mine = rows[rank::world_size]
        longest = max([sum(d.numel() for d in row) for row in rows] + [2])
        self.seq_len = seq_len
        self.num_windows = math.ceil((longest - 1) / seq_len)
        width = self.num_windows * seq_len + 1
        self.tokens = torch.zeros(len(mine), width, dtype=torch.long)
        self.targets = torch.full((len(mine), width - 1), IGNORED, dtype=torch.long)
        self.starts = torch.zeros(len(mine), width, dtype=torch.bool)
        for r, row in enumerate(mine):
            position = 0
            for document in row:
                n = document.numel()
                self.tokens[r, position : position + n] = document
                self.targets[r, position : position + n - 1] = document[1:]
                self.starts[r, position] = True
                position += n
            self.starts[r, position:] = True  # padding: each step on its own, nothing carried

    def __len__(self) -> int:
        return self.num_windows

    def __iter__(self):
        for k in range(self.num_windows):
            span = slice(k * self.seq_len, (k + 1) * self.seq_len)
            yield self.tokens[:, span], self.targets[:, span], self.starts[:, span]


class DocumentsDataModule(LanguageModelDataModule):
    """Separate documents, character level (or BPE, learned from the training documents): a folder
    of text files (one document per file, in order of their paths) or a JSON Lines file (one
    document per line, its text under `field`).

    Documents are split into train / validation / test by `val_fraction` / `test_fraction` of the
    documents (at least one each), and batches carry the documents' boundaries (see the module).
    """

    #: batches are (inputs, targets, reset): the model must restart its state at each document
    packs_documents = True

    def __init__(
        self,
        path: str | None = None,
        field: str = "text",
        val_fraction: float = 0.1,
        test_fraction: float = 0.1,
        encoding: str = "utf-8",
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        self.path = _readable_path(
            path, "data.path", "DocumentsDataModule", "a folder of text files or a JSON Lines file"
        )
        for name, value in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
            if not isinstance(value, (int, float)) or not 0.0 < value < 0.5:
                raise ValueError(f"DocumentsDataModule: `data.{name}` must be in (0, 0.5), got {value!r}")
        if not isinstance(field, str) or not field:
            raise ValueError(f"DocumentsDataModule: `data.field` must be a non-empty string, got {field!r}")
        self.field = field
        self.val_fraction, self.test_fraction = float(val_fraction), float(test_fraction)
        self.encoding = encoding
        self._documents: dict[str, list[torch.Tensor]] = {}

    def describe_source(self) -> str:
        return f"data.path={str(self.path)!r}"

    # -- reading ----------------------------------------------------------------------------
    def read_documents(self) -> list[str]:
        """The documents' texts, in order; empty documents are left out."""
        if self.path.is_dir():
            texts = [self._read_file(file) for file in text_files(self.path)]
        else:
            texts = self._read_json_lines(self.path)
        texts = [text for text in texts if text]
        if len(texts) < 3:
            raise ValueError(
                f"DocumentsDataModule: `data.path`={str(self.path)!r} must hold at least 3 non-empty documents "
                f"(one each for training, validation and test), got {len(texts)}"
            )
        return texts

    def _read_file(self, file: Path) -> str:
        return read_text_file(file, self.encoding, "DocumentsDataModule")

    def _read_json_lines(self, file: Path) -> list[str]:
        return list(self.iter_json_lines(file))

    def iter_json_lines(self, file: Path) -> Iterator[str]:
        """The documents' texts of a JSON Lines file, one line at a time (read in pieces)."""
        number = 0
        for piece in file_pieces(file, self.encoding, "DocumentsDataModule"):
            # Lines end at "\n" only: str.splitlines() would also cut at U+2028, U+0085 ..., which
            # JSON allows unescaped inside a string. A piece ends at a line's end.
            for line in piece.removesuffix("\n").split("\n"):
                number += 1
                if not line.strip():
                    continue
                yield self._json_line_text(line, number, file)

    def _json_line_text(self, line: str, number: int, file: Path) -> str:
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(
                f"DocumentsDataModule: line {number} of `data.path`={str(file)!r} must be a JSON object "
                f"(one document per line), got invalid JSON: {error}"
            ) from None
        if not isinstance(record, dict) or not isinstance(record.get(self.field), str):
            got = sorted(record) if isinstance(record, dict) else type(record).__name__
            raise ValueError(
                f"DocumentsDataModule: line {number} of `data.path`={str(file)!r} must be an object with a "
                f"string under `data.field`={self.field!r}, got {got}"
            )
        return record[self.field]

    # -- corpus -----------------------------------------------------------------------------
    def _split_documents(self) -> dict[str, list[str]]:
        texts = self.read_documents()
        n_val = max(1, math.floor(len(texts) * self.val_fraction))
        n_test = max(1, math.floor(len(texts) * self.test_fraction))
        n_train = len(texts) - n_val - n_test
        return {"train": texts[:n_train], "val": texts[n_train : n_train + n_val], "test": texts[n_train + n_val :]}

    def _joined(self, vocab_size: int, itos: list[str] | None) -> Corpus:
        joined = {split: torch.cat(documents) for split, documents in self._documents.items()}
        return Corpus(joined["train"], joined["val"], joined["test"], vocab_size, itos)

    def load_corpus(self) -> Corpus:
        texts = self._split_documents()
        vocab = Vocabulary("".join(text for split in SPLITS for text in texts[split]))
        self._documents = {split: [vocab.encode(text) for text in texts[split]] for split in SPLITS}
        return self._joined(len(vocab), vocab.itos)

    def load_bpe_corpus(self) -> Corpus:
        """Each document in BPE tokens of a vocabulary learned from the training documents alone
        (or adopted from a checkpoint)."""
        texts = self._split_documents()
        if self._codec is None:
            pieces = (piece for text in texts["train"] for piece in text_pieces(text))
            self._codec = TokenCodec("bpe", tokenizer=train_bpe(pieces, self.bpe_vocab_size))
        self._documents = {split: [encode_ids(self._codec, text) for text in texts[split]] for split in SPLITS}
        return self._joined(self._codec.vocab_size, None)

    def documents(self, split: str) -> list[torch.Tensor]:
        """The token ids of each document of `split`, in order."""
        if split not in SPLITS:
            raise ValueError(f"DocumentsDataModule.documents: `split` must be one of {SPLITS}, got {split!r}")
        self.corpus  # noqa: B018  (loads the documents)
        return self._documents[split]

    def unigram_bpc(self, split: str = "val") -> float:
        """Bits per character of `split` under a unigram model fitted on the training split, over
        the characters the model predicts: every document's but its first (no character comes
        before a document's first, so the model is never asked for it)."""
        if split not in SPLITS:
            raise ValueError(f"unigram_bpc: `split` must be one of {SPLITS}, got {split!r}")
        predicted = {name: torch.cat([d[1:] for d in self.documents(name)]) for name in ("train", split)}
        return unigram_bits_per_token(predicted["train"], predicted[split], self.vocab_size)

    def check_predictions(self) -> None:
        """Raise ValueError when a split has nothing to predict: all its documents are one
        character long (a document's first character is never predicted)."""
        for split in SPLITS:
            documents = self.documents(split)
            if any(document.numel() > 1 for document in documents):
                continue
            setting = {"train": "", "val": " (data.val_fraction)", "test": " (data.test_fraction)"}[split]
            raise ValueError(
                f"DocumentsDataModule: the {split} split{setting} of {self.describe_source()} has nothing to "
                f"predict: its {len(documents)} document(s) are 1 character long each, and a document's first "
                "character is never predicted; it needs a document of at least 2 characters"
            )

    def starts(self, split: str) -> torch.Tensor:
        """(tokens of `split`,) bool: True at each document's first token."""
        flags = [torch.zeros(document.numel(), dtype=torch.bool) for document in self.documents(split)]
        for flag in flags:
            flag[0] = True
        return torch.cat(flags)

    def adopt_vocabulary(self, codec) -> int:
        unknown = super().adopt_vocabulary(codec)
        if codec.level == "bpe":  # the documents are encoded again when the corpus is next read
            return unknown
        # The splits were encoded again with the same lengths: cut them into the same documents.
        for split in SPLITS:
            lengths = [document.numel() for document in self._documents[split]]
            self._documents[split] = list(torch.split(getattr(self.corpus, split), lengths))
        return unknown

    def check_sizes(self, world_size: int = 1) -> None:
        self.check_predictions()
        needed = self.batch_size * world_size * self.seq_len + 1
        if self.corpus.train.numel() < needed:
            raise ValueError(
                f"DocumentsDataModule: the training documents of {self.describe_source()} hold "
                f"{self.corpus.train.numel()} tokens, too few for {self.batch_size} streams x {world_size} "
                f"process(es) x data.seq_len={self.seq_len}: they need at least {needed}; use more documents "
                "or lower data.batch_size / data.seq_len"
            )

    # -- Lightning hooks --------------------------------------------------------------------
    def setup(self, stage: str | None = None) -> None:
        rank, world_size = 0, 1
        if self.trainer is not None:
            rank, world_size = self.trainer.global_rank, self.trainer.world_size
        self.check_predictions()
        self._datasets["train"] = PackedDocumentStreams(
            self.corpus.train, self.starts("train"), self.batch_size, self.seq_len, rank=rank, world_size=world_size
        )
        for split in ("val", "test"):
            self._datasets[split] = WholeDocumentRows(
                self.documents(split), self.eval_batch_size, self.seq_len, rank=rank, world_size=world_size
            )
