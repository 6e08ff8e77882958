"""An export's vocabulary.json at bpe level: it carries the tokenizer's JSON, reads back to the
same codec, and a damaged one is refused in one line naming the file and the field."""

from __future__ import annotations

import json
import sys

import pytest

from sru_lightning.data import TokenCodec
from sru_lightning.data.subwords import train_bpe
from sru_lightning.export import ExportError
from sru_lightning.export.package import VOCABULARY_NAME, read_vocabulary

TEXT = "the cat sat on the mat; naïve café 中文\n" * 30


@pytest.fixture(scope="module")
def state() -> dict:
    return TokenCodec("bpe", tokenizer=train_bpe([TEXT], 290)).state_dict()


def _write(tmp_path, state) -> None:
    (tmp_path / VOCABULARY_NAME).write_text(json.dumps(state), encoding="utf-8")


def test_a_bpe_vocabulary_reads_back_to_the_same_codec(state, tmp_path):
    _write(tmp_path, state)
    codec = read_vocabulary(tmp_path)
    assert codec.state_dict() == state and codec.level == "bpe"
    assert codec.decode(codec.encode(TEXT)) == TEXT


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda s: s.pop("tokenizer"), "`tokenizer` must be the tokenizer's JSON text at bpe level, got missing"),
        (lambda s: s.update(tokenizer=""), "`tokenizer` must be the tokenizer's JSON text at bpe level, got ''"),
        (lambda s: s.update(itos=["a"]), "`itos` must be null at bpe level"),
        (lambda s: s.update(tokenizer="{}"), "is not a tokenizer's JSON"),
        (lambda s: s.update(level="char", itos=["a"]), "`tokenizer` belongs to bpe level only"),
    ],
    ids=["missing", "empty", "itos", "not-a-tokenizer", "tokenizer-at-char-level"],
)
def test_a_damaged_bpe_vocabulary_is_refused_in_one_line(change, message, state, tmp_path):
    damaged = dict(state)
    change(damaged)
    _write(tmp_path, damaged)
    with pytest.raises(ExportError, match=f"vocabulary.json' is damaged: .*{message}") as error:
        read_vocabulary(tmp_path)
    assert "\n" not in str(error.value)


def test_a_bpe_vocabulary_without_the_tokenizers_package_names_the_extra(state, tmp_path, monkeypatch):
    _write(tmp_path, state)
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    with pytest.raises(ExportError, match=r"pip install sru_lightning\[tokenizers\]"):
        read_vocabulary(tmp_path)
