"""`prepare`'s BPE encoding through a table of distinct words gives `tokenizers`' own ids for any
text: every ASCII character (controls, white space, apostrophes), non-ASCII letters, numbers and
spaces of other scripts, and the cuts between ASCII and other stretches."""

from __future__ import annotations

import random

import pytest

from sru_lightning.data import bpe_words
from sru_lightning.data.bpe_words import WordTable, ascii_stretches
from sru_lightning.data.subwords import train_bpe

tokenizers = pytest.importorskip("tokenizers", reason="needs the extra: pip install sru_lightning[tokenizers]")

TRAIN = (
    "def f(x):\n    return x's + 12  # it'll do\n\tclass A: pass\r\n" * 30
    + "naïve café — Grüße, 中文 ٣ Ⅻ\u00a0x\u3000y\n" * 10
)
#: Every ASCII character, and pieces of other scripts, spaces and numbers.
SYMBOLS = [chr(code) for code in range(128)]
SYMBOLS += ["'s", "'ll", "'re", "  ", " \n", "x\n", "\n    ", "é", "€", "日本", "٣", "Ⅻ", "\u00a0", "\u2028", "\u3000"]


@pytest.fixture(scope="module")
def tokenizer():
    return tokenizers.Tokenizer.from_str(train_bpe([TRAIN], 330))


def ids_of(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False).ids


def test_random_texts_get_the_tokenizers_own_ids(tokenizer):
    table = WordTable(tokenizer)
    rng = random.Random(0)
    for _ in range(1500):
        text = "".join(rng.choice(SYMBOLS) for _ in range(rng.randint(0, 80)))
        assert table.encode(text).tolist() == ids_of(tokenizer, text), repr(text)
    assert len(table.numbers) > 100  # the words were kept and looked up again


def test_long_texts_repeat_words_and_keep_the_ids(tokenizer):
    text = TRAIN * 5 + "".join(random.Random(1).choice(SYMBOLS) for _ in range(5000))
    table = WordTable(tokenizer)
    first = table.encode(text)
    assert first.tolist() == ids_of(tokenizer, text)
    known = len(table.numbers)
    assert table.encode(text).tolist() == first.tolist() and len(table.numbers) == known
    assert table.encode("").size == 0


def test_a_full_table_starts_again_with_the_same_ids(tokenizer, monkeypatch):
    monkeypatch.setattr(bpe_words, "MAX_WORDS", 8)
    table = WordTable(tokenizer)
    for text in ("def f(x):\n", "class A: pass\n", "return x's + 12\n" * 3, "def f(x):\n"):
        assert table.encode(text).tolist() == ids_of(tokenizer, text)
    assert set(table.numbers) == {"def", " f", "(", "x", "):", "\n"}  # only the last text's words


def test_stretches_cover_the_text_and_other_characters_stay_in_short_stretches():
    text = "plain words here\n" * 3 + "a café here and there\n" + "more plain\n"
    stretches = list(ascii_stretches(text))
    assert "".join(stretch for _, stretch in stretches) == text
    others = [stretch for is_ascii, stretch in stretches if not is_ascii]
    assert others == [" café here"]  # from the space after "a" to the space after "here"
    assert all(stretch.isascii() for is_ascii, stretch in stretches if is_ascii)
    assert list(ascii_stretches("")) == [] and list(ascii_stretches("é")) == [(False, "é")]
