"""Large text files read in pieces (`file_pieces`): the text `Path.read_text` gives, cut at line
ends, for every piece size, line-end convention and encoding, read as bytes or as text."""

from __future__ import annotations

import random

import pytest

from sru_lightning.data.corpora import file_pieces

ALPHABET = ["a", "word", " ", "\t", "\n", "\r", "\r\n", "\r\r\n", "é", "€", "中", "🙂"]


@pytest.mark.parametrize("encoding", ["utf-8", "utf-8-sig", "latin-1", "utf-16"])
def test_pieces_join_to_the_text_and_end_at_line_breaks(tmp_path, encoding):
    rng = random.Random(encoding)
    for trial in range(60):
        text = "".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 300)))
        if encoding == "latin-1":
            text = "".join(char for char in text if ord(char) < 256) or "a"
        path = tmp_path / f"{trial}.txt"
        path.write_bytes(text.encode(encoding))
        pieces = list(file_pieces(path, encoding, "TextDataModule", piece_chars=rng.randint(1, 40)))
        assert "".join(pieces) == path.read_text(encoding=encoding), (trial, text)
        assert all(piece.endswith("\n") for piece in pieces[:-1]), pieces


def test_a_nul_byte_is_a_binary_file_and_other_bytes_name_the_encoding(tmp_path):
    path = tmp_path / "big.bin"
    path.write_bytes(b"text line\n" * 20 + b"\x00\x01\x02\n" + b"more\n" * 20)
    with pytest.raises(ValueError, match=r"is a binary file \(it holds NUL bytes\)"):
        list(file_pieces(path, "utf-8", "TextDataModule", piece_chars=16))
    path.write_bytes("café\n".encode("latin-1") * 40)
    with pytest.raises(ValueError, match=r"cannot read .* as utf-8 text .*; set data.encoding"):
        list(file_pieces(path, "utf-8", "TextDataModule", piece_chars=16))
