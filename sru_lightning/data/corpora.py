"""The corpora: where each data module's text comes from (Python's own docs and sources, enwik8,
any local text file or folder); every corpus is read from local disk."""

from __future__ import annotations

import codecs
import os
import sysconfig
import zipfile
from collections.abc import Iterator
from pathlib import Path

import torch

from .base import SPLITS, Corpus, LanguageModelDataModule, _char_corpus, _split_text
from .streams import Vocabulary, split_by_fractions, word_tokens
from .tokens import UNKNOWN_WORD

#: Characters `file_pieces` reads at a time from a text file (then up to the end of that line).
PIECE_CHARS = 1 << 22


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


def file_pieces(file: Path, encoding: str, owner: str, piece_chars: int | None = None) -> Iterator[str]:
    """The text of `file` in pieces of about `piece_chars` characters (bytes, in an encoding
    where a line break is one byte), each ending at a line break (the last at the file's end),
    decoded and with line ends translated as `Path.read_text` does. A binary file or text in
    another encoding is refused as `read_text_file` refuses it."""
    piece_chars = piece_chars or PIECE_CHARS
    if file.stat().st_size <= piece_chars:  # the common small file: read whole, with its checks
        yield read_text_file(file, encoding, owner)
        return
    binary = (
        f"{owner}: {str(file)!r} under `data.path` is a binary file (it holds NUL bytes), not text; "
        "move it out of data.path (hidden files and folders, named with a leading '.', are skipped)"
    )
    line_bytes = codecs.lookup(encoding).name in LINE_BYTE_ENCODINGS
    try:
        if line_bytes:
            yield from _byte_line_pieces(file, encoding, piece_chars, binary)
            return
        with open(file, encoding=encoding) as handle:
            while True:
                piece = handle.read(piece_chars)
                if not piece:
                    return
                piece += handle.readline()
                if "\0" in piece:
                    raise ValueError(binary)
                yield piece
    except UnicodeDecodeError as error:
        raise ValueError(
            f"{owner}: cannot read {str(file)!r} under `data.path` as {encoding} text ({error.reason}); set "
            "data.encoding if it is text in another encoding, or move it out of data.path"
        ) from None
    except OSError as error:
        raise ValueError(f"{owner}: cannot read {str(file)!r} under `data.path`: {error}") from error


#: Encodings in which the bytes 0x0A and 0x0D are only ever the line breaks "\n" and "\r" (and
#: 0x00 only NUL): their files are cut into lines and their line ends translated as bytes, then
#: decoded, several times faster than a text-mode file (codecs' names, as `codecs.lookup` gives).
LINE_BYTE_ENCODINGS = frozenset({"utf-8", "utf-8-sig", "ascii", "latin-1", "iso8859-15", "cp1252"})


def _byte_line_pieces(file: Path, encoding: str, piece_bytes: int, binary: str) -> Iterator[str]:
    """`file_pieces` of a file in one of LINE_BYTE_ENCODINGS: read as bytes up to a line break,
    "\r\n" and "\r" made "\n" (universal newlines, as text mode reads), decoded incrementally
    (a character cut by a piece's end is completed by the next)."""
    decoder = codecs.getincrementaldecoder(encoding)()
    with open(file, "rb") as handle:
        while True:
            data = handle.read(piece_bytes)
            if not data:
                tail = decoder.decode(b"", final=True)
                if tail:
                    yield tail
                return
            data += handle.readline()  # to the line's end: a word never straddles two pieces
            while data.endswith(b"\r"):  # a "\r\n" is never cut in two
                following = handle.read(1)
                if not following:
                    break
                data += following
            if b"\0" in data:
                raise ValueError(binary)
            if b"\r" in data:
                data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
            piece = decoder.decode(data)
            if piece:
                yield piece


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
        return "".join(self.source_pieces())

    def source_pieces(self) -> Iterator[str]:
        """The corpus in pieces, one source file each (joined by newlines), up to `max_chars`: the
        text is never held whole by a reader that streams it (`prepare`)."""
        root = Path(sysconfig.get_paths()["stdlib"])
        emitted = 0
        for file in sorted(root.rglob("*.py")):
            relative = file.relative_to(root)
            if "site-packages" in relative.parts or "dist-packages" in relative.parts:
                continue
            try:
                source = file.read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            piece = (("\n" if emitted else "") + source)[: self.max_chars - emitted]
            emitted += len(piece)
            yield piece
            if emitted >= self.max_chars:
                break
        if emitted < 10_000:
            raise ValueError(f"StdlibDataModule: found only {emitted} characters of sources under {root}")


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
