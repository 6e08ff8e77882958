"""Data modules: contiguous streams, deterministic splits, local corpora and their errors."""

from __future__ import annotations

import math
import zipfile

import pytest
import torch

from sru_lightning.data import (
    ContiguousStreams,
    Enwik8DataModule,
    PydocDataModule,
    StdlibDataModule,
    TextDataModule,
    Vocabulary,
    unigram_bits_per_token,
)


def test_streams_are_contiguous_across_batches_and_targets_are_shifted():
    ids = torch.arange(101)
    windows = list(ContiguousStreams(ids, batch_size=4, seq_len=5))
    assert len(windows) == len(ContiguousStreams(ids, 4, 5)) == 5  # 100 // 4 = 25 per stream
    first_x, first_y = windows[0]
    second_x, _ = windows[1]
    assert first_x.shape == (4, 5) and first_x.dtype == torch.long
    assert torch.equal(first_y[:, :-1], first_x[:, 1:])
    # row b of window k+1 starts where row b of window k stopped
    assert torch.equal(second_x[:, 0], first_x[:, -1] + 1)
    assert torch.equal(first_x[:, 0], torch.tensor([0, 25, 50, 75]))


def test_streams_give_each_rank_its_own_equal_share():
    ids = torch.arange(1001)
    shares = [list(ContiguousStreams(ids, 2, 10, rank=r, world_size=2)) for r in range(2)]
    assert len(shares[0]) == len(shares[1])
    rows0 = set(shares[0][0][0][:, 0].tolist())
    rows1 = set(shares[1][0][0][:, 0].tolist())
    assert rows0.isdisjoint(rows1) and len(rows0 | rows1) == 4


def test_streams_reject_too_little_data():
    with pytest.raises(ValueError, match="too few"):
        ContiguousStreams(torch.arange(10), batch_size=4, seq_len=8)
    with pytest.raises(ValueError, match="batch_size"):
        ContiguousStreams(torch.arange(100), batch_size=0, seq_len=8)


def test_unigram_bits_match_the_entropy_of_a_known_distribution():
    # train counts 3:1 (+1 smoothing -> 4:2), eval has the same letters -> cross-entropy by hand
    train = torch.tensor([0, 0, 0, 1])
    evaluation = torch.tensor([0, 1])
    expected = -(math.log2(4 / 6) + math.log2(2 / 6)) / 2
    assert unigram_bits_per_token(train, evaluation, vocab_size=2) == pytest.approx(expected)
    # a token unseen in training costs finite bits thanks to smoothing
    assert math.isfinite(unigram_bits_per_token(train, torch.tensor([2]), vocab_size=3))


def test_pydoc_split_is_deterministic_and_disjoint():
    first, second = PydocDataModule(batch_size=4, seq_len=16), PydocDataModule(batch_size=4, seq_len=16)
    assert first.vocab_size == second.vocab_size > 50
    for split in ("train", "val", "test"):
        assert torch.equal(getattr(first.corpus, split), getattr(second.corpus, split))
    total = sum(getattr(first.corpus, s).numel() for s in ("train", "val", "test"))
    assert first.corpus.val.numel() == pytest.approx(0.05 * total, abs=2)
    assert "the" in first.decode(first.corpus.val[:2000])
    # English prose: a unigram model needs more than 4 bits per character
    assert 4.0 < first.unigram_bpc("val") < 5.5


def test_datamodule_yields_contiguous_windows_from_its_loaders():
    data = PydocDataModule(batch_size=4, seq_len=16)
    data.setup("fit")
    batches = list(data.val_dataloader())
    (x0, y0), (x1, _) = batches[0], batches[1]
    assert x0.shape == (4, 16)
    assert torch.equal(x1[:, 0], y0[:, -1])


def test_stdlib_reads_python_sources():
    data = StdlibDataModule(max_chars=50_000, batch_size=4, seq_len=16)
    text = data.decode(data.corpus.train[:20_000])
    assert "def " in text or "import " in text


def test_text_char_and_word_levels(tmp_path):
    corpus = tmp_path / "story.txt"
    corpus.write_text("the cat sat on the mat\n" * 400)
    chars = TextDataModule(path=str(corpus), level="char", batch_size=2, seq_len=8)
    assert chars.vocab_size == len(set("the cat sat on the mat\n"))
    words = TextDataModule(path=str(corpus), level="word", batch_size=2, seq_len=8)
    assert words.corpus.itos[0] == "<unk>"
    assert words.vocab_size == len({"the", "cat", "sat", "on", "mat", "<eos>"}) + 1


def test_text_folder_with_named_splits_uses_them_and_maps_unseen_words_to_unk(tmp_path):
    (tmp_path / "wiki.train.tokens").write_text("a b c a b c\n" * 50)
    (tmp_path / "wiki.valid.tokens").write_text("a b zebra\n" * 20)
    (tmp_path / "wiki.test.tokens").write_text("c b a\n" * 20)
    data = TextDataModule(path=str(tmp_path), level="word", batch_size=2, seq_len=4)
    unk = data.corpus.itos.index("<unk>")
    assert (data.corpus.val == unk).sum() == 20
    assert (data.corpus.train == unk).sum() == 0


def test_enwik8_byte_level_split_and_zip(tmp_path):
    raw = bytes(range(256)) * 40  # 10240 bytes
    plain = tmp_path / "enwik8"
    plain.write_bytes(raw)
    archive = tmp_path / "enwik8.zip"
    with zipfile.ZipFile(archive, "w") as handle:
        handle.writestr("enwik8", raw)
    sizes = dict(train_bytes=8000, val_bytes=1000, test_bytes=1000)
    for path in (plain, archive):
        data = Enwik8DataModule(path=str(path), batch_size=2, seq_len=8, **sizes)
        assert data.vocab_size == 256
        assert data.corpus.train.numel() == 8000
        assert data.corpus.val[0].item() == 8000 % 256
    with pytest.raises(ValueError, match="holds 10240 bytes.*data.train_bytes"):
        _ = Enwik8DataModule(path=str(plain), batch_size=2, seq_len=8).corpus


@pytest.mark.parametrize("module", [Enwik8DataModule, TextDataModule])
def test_missing_paths_name_the_config_key(module, tmp_path):
    with pytest.raises(ValueError, match="`data.path` is not set"):
        module(path=None)
    with pytest.raises(ValueError, match=r"`data.path` must point to .*does not exist"):
        module(path=str(tmp_path / "nope"))


def test_unreadable_text_names_the_key(tmp_path):
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("caf\xe9\n".encode("latin-1") * 100)
    with pytest.raises(ValueError, match="data.encoding"):
        _ = TextDataModule(path=str(bad)).corpus
    assert TextDataModule(path=str(bad), encoding="latin-1", batch_size=2, seq_len=4).vocab_size == 5


def test_bad_batching_arguments_are_named():
    with pytest.raises(ValueError, match=r"`data.batch_size` must be a positive integer, got 0"):
        PydocDataModule(batch_size=0)
    with pytest.raises(ValueError, match="data.val_fraction"):
        PydocDataModule(val_fraction=0.9)
    with pytest.raises(ValueError, match="data.level"):
        TextDataModule(path=__file__, level="sentence")


def test_vocabulary_without_unknown_rejects_new_symbols():
    vocab = Vocabulary("abc")
    assert vocab.encode("cab").tolist() == [2, 0, 1]
    with pytest.raises(ValueError, match="not in the vocabulary"):
        vocab.encode("abz")


def test_training_loader_resumes_mid_epoch_from_its_state():
    data = PydocDataModule(batch_size=4, seq_len=16)
    data.setup("fit")
    loader = data.train_dataloader()
    iterator = iter(loader)
    next(iterator), next(iterator)
    state = loader.state_dict()
    expected_x, _ = next(iterator)
    resumed = PydocDataModule(batch_size=4, seq_len=16)
    resumed.setup("fit")
    fresh_loader = resumed.train_dataloader()
    fresh_loader.load_state_dict(state)
    resumed_x, _ = next(iter(fresh_loader))
    assert torch.equal(resumed_x, expected_x)


def test_word_level_decode_joins_words_with_spaces_and_lines_with_newlines(tmp_path):
    corpus = tmp_path / "story.txt"
    corpus.write_text("the cat sat\non the mat\n" * 200)
    words = TextDataModule(path=str(corpus), level="word", batch_size=2, seq_len=8)
    assert words.token_unit == "word"
    assert words.decode(words.corpus.train[:10]) == "the cat sat\non the mat\nthe cat"
    codec = words.codec
    assert codec.decode(codec.encode("the zebra\non")) == "the <unk>\non"
    # streaming: a word after text that ends without a space gets one
    write = codec.decoder(after="the")
    assert [write(i) for i in codec.encode("cat\nmat")] == [" cat", "\n", "mat"]


def test_codecs_are_saved_as_plain_data_and_rebuilt(tmp_path):
    from sru_lightning.data import TokenCodec

    data = PydocDataModule(batch_size=2, seq_len=8)
    state = data.state_dict()["token_codec"]
    assert state["level"] == "char" and all(isinstance(token, str) for token in state["itos"])
    path = tmp_path / "codec.pt"
    torch.save(state, path)
    codec = TokenCodec.from_state_dict(torch.load(path, weights_only=True))
    assert codec.decode(codec.encode("The end.")) == "The end." and codec.vocab_size == data.vocab_size
    with pytest.raises(ValueError, match=r"characters '€' are not in the model's vocabulary"):
        codec.encode("5 €")
    # bytes: a character split across tokens comes out whole
    byte_codec = TokenCodec("byte")
    write = byte_codec.decoder()
    assert "".join(write(i) for i in byte_codec.encode("né")) == "né"
    assert Enwik8DataModule.token_level == "byte"


def test_a_text_folder_skips_hidden_files_and_folders(tmp_path):
    (tmp_path / "story.txt").write_text("the cat sat on the mat\n" * 100)
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "index").write_bytes(b"DIRC\x00\x00\x00\x02\xff\xfe")
    (tmp_path / ".ipynb_checkpoints").mkdir()
    (tmp_path / ".ipynb_checkpoints" / "story-checkpoint.txt").write_text("QZXW" * 100)
    data = TextDataModule(path=str(tmp_path), batch_size=2, seq_len=4)
    assert data.vocab_size == len(set("the cat sat on the mat\n"))
