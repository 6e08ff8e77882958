"""Byte-level BPE vocabularies (`data.tokenizer=bpe`): learned from the training split alone,
deterministic, round-tripping any text, saved as plain strings, and the byte length of every
token id of every level (what bits per byte divide by)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap

import pytest
import torch

from sru_lightning.data import DocumentsDataModule, PydocDataModule, TextDataModule, TokenCodec, subwords
from sru_lightning.data.base import check_tokenizer, encode_ids
from sru_lightning.data.streams import Vocabulary
from sru_lightning.data.subwords import BytePairs, byte_symbols, text_pieces, train_bpe
from sru_lightning.data.tokens import END_OF_LINE, UNKNOWN_WORD, token_unit

tokenizers = pytest.importorskip("tokenizers", reason="needs the extra: pip install sru_lightning[tokenizers]")
Tokenizer = tokenizers.Tokenizer

TRAIN = "the quick brown fox jumps over the lazy dog; the dog sleeps.\n" * 40 + "héllo wörld, naïve café\n" * 20
# Only the validation text holds this word: no merge of it may be learned.
VAL_ONLY = "zyzzyva"
NON_ASCII = "Grüße, 中文 und 🙂 — naïve\n\n  tabs\tand spaces  \n"


@pytest.fixture(scope="module")
def bpe() -> TokenCodec:
    return TokenCodec("bpe", tokenizer=train_bpe([TRAIN], 320))


def test_byte_symbols_are_the_alphabet_of_the_tokenizers_byte_level():
    from tokenizers import pre_tokenizers

    symbols = byte_symbols()
    assert len(set(symbols)) == 256 and set(symbols) == set(pre_tokenizers.ByteLevel.alphabet())
    # the pre-tokenizer writes each byte as its symbol
    text = "a b\nü\x00"
    written = "".join(word for word, _ in pre_tokenizers.ByteLevel(add_prefix_space=False).pre_tokenize_str(text))
    assert written == "".join(symbols[value] for value in text.encode("utf-8"))


def test_bpe_round_trips_any_text_and_decodes_a_stream_only_when_characters_are_complete(bpe):
    for text in (TRAIN[:200], NON_ASCII, VAL_ONLY, "", "\x00\x7f\u2028 x"):
        assert bpe.decode(bpe.encode(text)) == text
    ids = bpe.encode("🙂")  # four bytes, no merge learned: four tokens
    assert len(ids) == 4
    write = bpe.decoder()
    assert [write(index) for index in ids] == ["", "", "", "🙂"]
    cut = bpe.decoder()
    assert cut(ids[0]) == "" and cut.flush() == "\ufffd"  # an unfinished character
    assert bpe.vocab_size > 256 and max(bpe.encode(TRAIN)) < bpe.vocab_size


def test_bpe_learns_merges_so_common_words_are_single_tokens(bpe):
    assert len(bpe.encode(" the")) == 1
    assert len(bpe.encode(TRAIN)) < len(TRAIN.encode("utf-8")) / 2


def test_long_texts_are_encoded_in_pieces_that_give_the_same_ids(bpe, monkeypatch):
    text = (NON_ASCII + "word  \n\nnext line\n x\n") * 50
    whole = Tokenizer.from_str(bpe.tokenizer).encode(text, add_special_tokens=False).ids
    pieces = list(text_pieces(text, piece_chars=37))
    assert "".join(pieces) == text and len(pieces) > 10
    assert [index for piece in pieces for index in bpe.encode(piece)] == whole
    monkeypatch.setattr(subwords, "_PIECE_CHARS", 37)
    monkeypatch.setattr(subwords, "_PIECES_PER_BATCH", 3)
    assert len(list(bpe.encode_in_parts(text))) > 3 and bpe.encode(text) == whole
    assert torch.equal(encode_ids(bpe, text), torch.tensor(whole, dtype=torch.int16))


def test_training_is_deterministic_across_processes():
    script = textwrap.dedent(
        f"""
        from sru_lightning.data.subwords import train_bpe
        print(train_bpe([{TRAIN!r}], 320))
        """
    )
    runs = [
        subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
        for _ in range(2)
    ]
    assert runs[0] == runs[1] == train_bpe([TRAIN], 320) + "\n"


def test_the_state_is_a_plain_string_and_survives_a_weights_only_checkpoint(bpe):
    state = bpe.state_dict()
    assert state["level"] == "bpe" and isinstance(state["tokenizer"], str)
    buffer = io.BytesIO()
    torch.save({"token_codec": state}, buffer)
    buffer.seek(0)
    restored = TokenCodec.from_state_dict(torch.load(buffer, weights_only=True)["token_codec"])
    assert restored.encode(NON_ASCII) == bpe.encode(NON_ASCII) and restored.vocab_size == bpe.vocab_size
    json.dumps(state)  # the export's vocabulary.json holds the same


@pytest.mark.parametrize(
    "state, message",
    [
        ({"level": "bpe"}, "`tokenizer` must be the tokenizer's JSON at bpe level"),
        ({"level": "bpe", "tokenizer": "{not json"}, "is not a tokenizer's JSON"),
        ({"level": "char", "itos": ["a"], "tokenizer": "{}"}, "`tokenizer` must be the tokenizer's JSON"),
    ],
)
def test_a_damaged_bpe_state_is_refused_in_one_line(state, message):
    with pytest.raises(ValueError, match=message):
        TokenCodec.from_state_dict(state)


def test_a_missing_tokenizers_package_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # import tokenizers -> ImportError
    with pytest.raises(ImportError, match=r"pip install sru_lightning\[tokenizers\]"):
        train_bpe(["text"], 300)
    with pytest.raises(ImportError, match=r"pip install sru_lightning\[tokenizers\]"):
        BytePairs("{}")


# -- byte lengths of token ids (the denominators of bits per byte) ----------------------------
@pytest.mark.parametrize("level", ["byte", "char", "bpe"])
def test_the_byte_lengths_of_the_ids_of_a_text_sum_to_its_utf8_length(level, bpe):
    text = NON_ASCII + TRAIN[:300]
    codec = {
        "byte": TokenCodec("byte"),
        "char": TokenCodec("char", Vocabulary(text).itos),
        "bpe": bpe,
    }[level]
    lengths = codec.token_byte_lengths()
    assert len(lengths) == codec.vocab_size
    assert sum(lengths[index] for index in codec.encode(text)) == len(text.encode("utf-8")) == 357


def test_word_tokens_count_their_separator():
    codec = TokenCodec("word", [UNKNOWN_WORD, END_OF_LINE, "naïve", "a"], unknown=UNKNOWN_WORD)
    assert codec.token_byte_lengths() == [len(UNKNOWN_WORD) + 1, 1, 7, 2]
    text = "a naïve\na a\n"
    lengths = codec.token_byte_lengths()
    # every word counts one separator; a line's first word has none in the text: 2 lines, 2 more
    assert sum(lengths[index] for index in codec.encode(text)) == len(text.encode("utf-8")) + 2 == 15


# -- data modules ---------------------------------------------------------------------------
def _named_split_folder(tmp_path, val_text: str):
    (tmp_path / "wiki.train.txt").write_text(TRAIN, encoding="utf-8")
    (tmp_path / "wiki.valid.txt").write_text(val_text, encoding="utf-8")
    (tmp_path / "wiki.test.txt").write_text(TRAIN[:500], encoding="utf-8")
    return tmp_path


def test_the_vocabulary_is_learned_from_the_training_split_only(tmp_path):
    folder = _named_split_folder(tmp_path, f"{VAL_ONLY} " * 300)
    data = TextDataModule(path=str(folder), tokenizer="bpe", vocab_size=600, batch_size=2, seq_len=4)
    tokens = json.loads(data.codec.tokenizer)["model"]["vocab"]
    assert not [token for token in tokens if "zz" in token or "yv" in token]
    assert len(data.corpus.val) == len(f"{VAL_ONLY} " * 300)  # one token per byte: no merge of it
    # the same text in the training split is merged
    with_it = TextDataModule(path=str(folder), tokenizer="bpe", vocab_size=600, batch_size=2, seq_len=4)
    with_it.split_texts = lambda: (TRAIN + f" {VAL_ONLY}" * 50, f"{VAL_ONLY} " * 300, TRAIN[:500])
    assert any("zz" in token for token in json.loads(with_it.codec.tokenizer)["model"]["vocab"])
    # the splits decode to their texts
    assert data.codec.decode(data.corpus.train.tolist()) == TRAIN
    assert data.vocab_size == data.codec.vocab_size <= 600
    assert data.token_byte_lengths().sum() > 256


def test_a_checkpoints_vocabulary_is_used_and_not_learned_again(tmp_path, monkeypatch):
    folder = _named_split_folder(tmp_path, TRAIN[:700])
    trained = TextDataModule(path=str(folder), tokenizer="bpe", vocab_size=300, batch_size=2, seq_len=4)
    saved = trained.state_dict()["token_codec"]
    import sru_lightning.data.base as base

    def no_training(*args, **kwargs):
        raise AssertionError("the vocabulary was learned again")

    monkeypatch.setattr(base, "train_bpe", no_training)
    evaluated = TextDataModule(path=str(folder), tokenizer="bpe", vocab_size=999, batch_size=2, seq_len=4)
    evaluated.adopt_vocabulary(TokenCodec.from_state_dict(saved))
    assert evaluated.codec.state_dict() == saved and torch.equal(evaluated.corpus.val, trained.corpus.val)
    # a resumed fit whose text now learns another vocabulary keeps the checkpoint's
    other = TextDataModule(path=str(folder), tokenizer="bpe", vocab_size=300, batch_size=2, seq_len=4)
    monkeypatch.setattr(base, "train_bpe", lambda texts, size: train_bpe([TRAIN.upper()], size))
    assert other.codec.state_dict() != saved
    other.load_state_dict({"token_codec": saved})
    assert other.codec.state_dict() == saved and torch.equal(other.corpus.train, trained.corpus.train)
    # a checkpoint of another level names the setting
    chars = TextDataModule(path=str(folder), batch_size=2, seq_len=4)
    with pytest.raises(ValueError, match="set data.tokenizer=bpe"):
        chars.adopt_vocabulary(TokenCodec.from_state_dict(saved))
    with pytest.raises(ValueError, match="set data.tokenizer=null"):
        other.adopt_vocabulary(chars.codec)


def test_documents_are_encoded_one_by_one_with_a_vocabulary_of_the_training_documents(tmp_path):
    lines = [json.dumps({"text": text}) for text in [TRAIN[i : i + 200] for i in range(0, 1600, 200)]]
    lines += [json.dumps({"text": f"{VAL_ONLY} {VAL_ONLY}"}), json.dumps({"text": NON_ASCII})]
    path = tmp_path / "docs.jsonl"
    path.write_text("\n".join(lines), encoding="utf-8")
    data = DocumentsDataModule(path=str(path), tokenizer="bpe", vocab_size=400, batch_size=2, seq_len=4)
    codec = data.codec
    assert [codec.decode(ids.tolist()) for ids in data.documents("test")] == [NON_ASCII]
    assert len(data.documents("val")[0]) == len(f"{VAL_ONLY} {VAL_ONLY}")  # nothing of it merged
    assert data.starts("train").sum() == 8


def test_pydoc_reads_bpe_too():
    data = PydocDataModule(tokenizer="bpe", vocab_size=400, batch_size=2, seq_len=4)
    train, val, _ = data.split_texts()
    assert data.codec.decode(data.corpus.val.tolist()) == val
    assert data.token_level == "bpe" and data.vocab_size == 400


def test_bpe_metrics_are_counted_per_token():
    assert token_unit("bpe") == "token" and token_unit("byte") == token_unit("char") == "char"
    assert PydocDataModule(tokenizer="bpe", vocab_size=400).token_unit == "token"
    assert PydocDataModule().token_unit == "char"


@pytest.mark.parametrize(
    "tokenizer, vocab_size, message",
    [
        ("bpe", None, r"`data.vocab_size` must be an integer >= 257 with data.tokenizer=bpe .*got None"),
        ("bpe", 256, r"`data.vocab_size` must be an integer >= 257 .*got 256"),
        ("bpe", 300.0, r"`data.vocab_size` must be an integer >= 257 .*got 300.0"),
        ("bpe", True, r"`data.vocab_size` must be an integer >= 257 .*got True"),
        (None, 300, r"`data.vocab_size` sets the size of a learned vocabulary and needs data.tokenizer=bpe"),
        ("wordpiece", 300, r"`data.tokenizer` must be null \(the corpus's own tokens\) or one of bpe, got 'wordpiece'"),
    ],
)
def test_tokenizer_settings_are_checked_in_one_line(tokenizer, vocab_size, message):
    with pytest.raises(ValueError, match=message):
        check_tokenizer("PydocDataModule", tokenizer, vocab_size)
    with pytest.raises(ValueError, match=message):
        PydocDataModule(tokenizer=tokenizer, vocab_size=vocab_size)


def test_word_level_text_is_refused_with_bpe(tmp_path):
    folder = _named_split_folder(tmp_path, TRAIN)
    with pytest.raises(ValueError, match="`data.level` must stay char .*got 'word'"):
        TextDataModule(path=str(folder), level="word", tokenizer="bpe", vocab_size=300)


def test_enwik8_reads_bpe_from_utf8_splits_and_names_a_cut_character(tmp_path):
    from sru_lightning.data import Enwik8DataModule

    data = (TRAIN * 3).encode("utf-8")
    path = tmp_path / "enwik8"
    path.write_bytes(data)
    sizes = dict(train_bytes=len(data) - 600, val_bytes=300, test_bytes=300)
    module = Enwik8DataModule(path=str(path), tokenizer="bpe", vocab_size=300, **sizes)
    assert module.codec.decode(module.corpus.train.tolist()).encode("utf-8") == data[: sizes["train_bytes"]]
    cut = data.index("é".encode()) + 1  # inside the two bytes of é
    module = Enwik8DataModule(
        path=str(path), tokenizer="bpe", vocab_size=300, train_bytes=cut, val_bytes=300, test_bytes=300
    )
    with pytest.raises(ValueError, match=r"the train split .* is not UTF-8 at its byte \d+ .*data.train_bytes"):
        module.corpus  # noqa: B018
