"""Each data module's corpus read in pieces, in order, as `prepare` reads it: never the whole
text in memory, and the same text (the same splits, the same tokens) the module reads whole.

A reading is a sequence of parts, each a sequence of pieces (``str``, or ``bytes`` for enwik8):
one part per named split (a folder of wikitext's train/valid/test files), one part per document
(documents data), or a single part cut into splits afterwards (by fractions of its characters or
words, or enwik8's fixed byte counts). Pieces of text end at a line break, so that words never
straddle two pieces.
"""

from __future__ import annotations

import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from .corpora import (
    Enwik8DataModule,
    PydocDataModule,
    StdlibDataModule,
    TextDataModule,
    file_pieces,
    text_files,
)
from .documents import DocumentsDataModule

#: Bytes read at a time from enwik8.
PIECE_BYTES = 1 << 22

Part = tuple["str | None", Iterator]


@dataclass
class CorpusReading:
    """How one data module's corpus is read in pieces (see the module)."""

    owner: str  # the data module's class name, for messages
    unit: str  # "byte", "char" or "word": what splits are measured in (a BPE corpus's text: "char")
    layout: str  # "fractions" | "named" | "sizes" | "documents"
    parts: Callable[[], Iterator[Part]]
    val_fraction: float = 0.0
    test_fraction: float = 0.0
    sizes: tuple[int, int, int] = (0, 0, 0)


def _non_empty(pieces: Iterator[str], file: Path, owner: str) -> Iterator[str]:
    """`pieces`, then a ValueError if they held nothing but whitespace (as TextDataModule refuses)."""
    seen_text = False
    for piece in pieces:
        seen_text = seen_text or bool(piece.strip())
        yield piece
    if not seen_text:
        raise ValueError(
            f"{owner}: {str(file)!r} under `data.path` holds no text; a language model needs a file of at "
            "least a few thousand characters"
        )


def _joined(files: list[Path], read: Callable[[Path], Iterator[str]]) -> Iterator[str]:
    """The files' texts joined by newlines, as ``"\\n".join(texts)``."""
    for number, file in enumerate(files):
        if number:
            yield "\n"
        yield from read(file)


# --------------------------------------------------------------------------------------------
def reading_of(datamodule) -> CorpusReading:
    """The reading of `datamodule`'s corpus; a ValueError for a module prepare cannot read."""
    readers = {
        PydocDataModule: _pydoc,
        StdlibDataModule: _stdlib,
        Enwik8DataModule: _enwik8,
        TextDataModule: _text,
        DocumentsDataModule: _documents,
    }
    reader = readers.get(type(datamodule))
    if reader is None:
        raise ValueError(
            f"prepare reads data=pydoc, stdlib, enwik8, text or documents, got {type(datamodule).__name__}; "
            "prepared shards are already prepared"
        )
    return reader(datamodule)


def _fractions(module, unit: str, parts: Callable[[], Iterator[Part]]) -> CorpusReading:
    return CorpusReading(type(module).__name__, unit, "fractions", parts, module.val_fraction, module.test_fraction)


def _pydoc(module: PydocDataModule) -> CorpusReading:
    return _fractions(module, "char", lambda: iter([(None, iter([module._text()]))]))


def _stdlib(module: StdlibDataModule) -> CorpusReading:
    return _fractions(module, "char", lambda: iter([(None, module.source_pieces())]))


def _enwik8(module: Enwik8DataModule) -> CorpusReading:
    def pieces() -> Iterator[bytes]:
        needed, read = sum(module.sizes), 0
        try:
            if zipfile.is_zipfile(module.path):
                archive = zipfile.ZipFile(module.path)
                member = "enwik8" if "enwik8" in archive.namelist() else archive.namelist()[0]
                handle = archive.open(member)
            else:
                archive, handle = None, open(module.path, "rb")
            with handle:
                while read < needed:
                    piece = handle.read(min(PIECE_BYTES, needed - read))
                    if not piece:
                        break
                    read += len(piece)
                    yield piece
            if archive is not None:
                archive.close()
        except (OSError, zipfile.BadZipFile, IndexError) as error:
            raise ValueError(f"Enwik8DataModule: cannot read `data.path`={str(module.path)!r}: {error}") from error
        if read < needed:
            raise ValueError(
                f"Enwik8DataModule: `data.path`={str(module.path)!r} holds {read} bytes, but the split "
                f"train_bytes+val_bytes+test_bytes needs {needed}; point data.path at the full enwik8 "
                "or lower data.train_bytes / data.val_bytes / data.test_bytes"
            )

    reading = CorpusReading("Enwik8DataModule", "byte", "sizes", lambda: iter([(None, pieces())]))
    reading.sizes = tuple(module.sizes)
    return reading


def _text(module: TextDataModule) -> CorpusReading:
    owner = "TextDataModule"

    def read(file: Path) -> Iterator[str]:
        return _non_empty(file_pieces(file, module.encoding, owner), file, owner)

    unit = "word" if module.level == "word" and module.tokenizer is None else "char"
    if module.path.is_file():
        return _fractions(module, unit, lambda: iter([(None, read(module.path))]))
    files = text_files(module.path)
    if not files:
        raise ValueError(f"TextDataModule: `data.path`={str(module.path)!r} is a folder without files")
    named = module._named_splits(files)
    if named is not None:
        parts = lambda: iter([(split, read(named[split])) for split in ("train", "val", "test")])  # noqa: E731
        return CorpusReading(owner, unit, "named", parts)
    return _fractions(module, unit, lambda: iter([(None, _joined(files, read))]))


def _documents(module: DocumentsDataModule) -> CorpusReading:
    """One part per document, in order (empty ones too: prepare leaves them out, as the module does)."""

    def parts() -> Iterator[Part]:
        if module.path.is_dir():
            for file in text_files(module.path):
                yield None, file_pieces(file, module.encoding, "DocumentsDataModule")
        else:
            for text in module.iter_json_lines(module.path):
                yield None, iter([text])

    reading = CorpusReading("DocumentsDataModule", "char", "documents", parts)
    reading.val_fraction, reading.test_fraction = module.val_fraction, module.test_fraction
    return reading
