"""Prepared shards read by memory map give the batches the in-memory data modules give for the
same text and settings: every data option, token level and layout, on one and two ranks, across
shard boundaries, with the text read in small pieces and encoded by worker processes."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from sru_lightning.data import (
    DocumentsDataModule,
    Enwik8DataModule,
    PydocDataModule,
    StdlibDataModule,
    TextDataModule,
    corpora,
    sources,
    subwords,
)
from sru_lightning.data.prepare import PrepareOptions, prepare_corpus
from sru_lightning.data.sampling import ResumableDataLoader
from sru_lightning.data.shard_module import ShardDataModule
from sru_lightning.data.sources import reading_of

LINES = [
    "The quick brown fox jumps over the lazy dog.",
    "Grüße aus Köln: naïve café, 中文 text and 🙂 emoji.",
    "  indented line\twith a tab",
    "",
    "def f(x):\r\n    return x * 2  # a comment",
    "Numbers 0123456789 and symbols !@#$%^&*()",
]


def prose(lines: int, seed: int = 0) -> str:
    rng = np.random.default_rng(seed)
    return "\n".join(LINES[i] + f" {i * 7 % 13}" for i in rng.integers(0, len(LINES), lines)) + "\n"


@pytest.fixture(autouse=True)
def small_pieces(monkeypatch):
    """Pieces far smaller than the corpus, so every cut between pieces is exercised."""
    monkeypatch.setattr(corpora, "PIECE_CHARS", 97)
    monkeypatch.setattr(subwords, "_PIECE_CHARS", 300)
    monkeypatch.setattr(sources, "PIECE_BYTES", 101)


def prepare(module, folder, workers=1, shard_mb=0.001):
    options = PrepareOptions(workers=workers, shard_mb=shard_mb, progress=False)
    return prepare_corpus(
        reading_of(module),
        module.token_level,
        folder,
        bpe_vocab_size=getattr(module, "bpe_vocab_size", None),
        options=options,
    )


def batches(module, split, rank=0, world_size=1):
    module.trainer = SimpleNamespace(global_rank=rank, world_size=world_size)
    module.setup()
    return list(getattr(module, f"{split}_dataloader")())


def assert_same_batches(expected, got):
    assert len(expected) == len(got) > 0
    for number, (one, two) in enumerate(zip(expected, got)):
        assert len(one) == len(two)
        for a, b in zip(one, two):
            assert a.dtype == b.dtype and torch.equal(a, b), f"batch {number}"


def text_file(tmp_path, lines=400):
    path = tmp_path / "corpus.txt"
    path.write_bytes(prose(lines).encode("utf-8"))  # keeps the \r\n pair: read_text translates it
    return path


def named_folder(tmp_path):
    folder = tmp_path / "wiki"
    folder.mkdir()
    for name, lines, seed in (("wiki.train.tokens", 300, 1), ("wiki.valid.tokens", 60, 2), ("wiki.test.tokens", 60, 3)):
        (folder / name).write_text(prose(lines, seed) + "unseenword here\n", encoding="utf-8")
    return folder


def documents_folder(tmp_path):
    folder = tmp_path / "docs"
    folder.mkdir()
    rng = np.random.default_rng(5)
    for number in range(40):
        text = "" if number == 7 else prose(int(rng.integers(1, 12)), seed=number)
        (folder / f"doc{number:03d}.txt").write_text(text, encoding="utf-8")
    return folder


def json_lines(tmp_path):
    path = tmp_path / "docs.jsonl"
    rows = [json.dumps({"text": prose(1 + number % 9, seed=number)}) for number in range(30)]
    rows.insert(4, json.dumps({"text": ""}))
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


def enwik8_file(tmp_path):
    path = tmp_path / "enwik8"
    path.write_bytes(prose(500).encode("utf-8"))
    return path


BATCHING = {"batch_size": 3, "seq_len": 8, "eval_batch_size": 2}
CASES = {
    "text-char": lambda tmp: TextDataModule(path=str(text_file(tmp)), **BATCHING),
    "text-word": lambda tmp: TextDataModule(path=str(text_file(tmp)), level="word", **BATCHING),
    "named-word": lambda tmp: TextDataModule(path=str(named_folder(tmp)), level="word", **BATCHING),
    "named-char": lambda tmp: TextDataModule(path=str(named_folder(tmp)), **BATCHING),
    "text-bpe": lambda tmp: TextDataModule(path=str(text_file(tmp)), tokenizer="bpe", vocab_size=300, **BATCHING),
    "pydoc": lambda tmp: PydocDataModule(batch_size=4, seq_len=32),
    "enwik8-byte": lambda tmp: Enwik8DataModule(
        path=str(enwik8_file(tmp)), train_bytes=12000, val_bytes=1500, test_bytes=1500, **BATCHING
    ),
    "enwik8-bpe": lambda tmp: Enwik8DataModule(
        path=str(enwik8_file(tmp)),
        train_bytes=12000,
        val_bytes=1500,
        test_bytes=1500,
        tokenizer="bpe",
        vocab_size=290,
        **BATCHING,
    ),
    "stdlib": lambda tmp: StdlibDataModule(max_chars=30000, batch_size=4, seq_len=16),
    "documents-char": lambda tmp: DocumentsDataModule(path=str(documents_folder(tmp)), **BATCHING),
    "documents-jsonl-bpe": lambda tmp: DocumentsDataModule(
        path=str(json_lines(tmp)), tokenizer="bpe", vocab_size=280, **BATCHING
    ),
}


#: cases prepared by two worker processes (the others by one)
PARALLEL_CASES = ("text-char", "text-word", "text-bpe", "documents-jsonl-bpe")


@pytest.mark.parametrize("case", list(CASES))
def test_shards_give_the_in_memory_batches(tmp_path, case):
    module = CASES[case](tmp_path)
    prepared = prepare(module, tmp_path / "shards", workers=2 if case in PARALLEL_CASES else 1)
    shards = ShardDataModule(path=str(prepared.folder), **{k: getattr(module, k) for k in BATCHING})
    assert shards.vocab_size == module.vocab_size
    assert shards.codec.state_dict() == module.codec.state_dict()
    assert shards.packs_documents == getattr(module, "packs_documents", False)
    for split in ("train", "val", "test"):
        assert shards.unigram_bpc(split) == pytest.approx(module.unigram_bpc(split), rel=1e-12)
        world_sizes = [1, 2] if split == "train" or not shards.packs_documents else [1, 3]
        for world_size in world_sizes:
            for rank in range(world_size):
                expected = batches(module, split, rank, world_size)
                assert_same_batches(expected, batches(shards, split, rank, world_size))
    # more than one shard per split was written, so windows were read across shard files
    assert len(prepared.index["splits"]["train"]["shards"]) > 1


def test_the_narrowest_dtype_holds_the_vocabulary(tmp_path):
    word = prepare(TextDataModule(path=str(text_file(tmp_path)), level="word", **BATCHING), tmp_path / "w")
    assert word.index["dtype"] == "uint8" and word.index["vocab_size"] <= 256
    bpe = TextDataModule(path=str(text_file(tmp_path)), tokenizer="bpe", vocab_size=300, **BATCHING)
    assert prepare(bpe, tmp_path / "b").index["dtype"] == "uint16"


def test_loader_workers_read_their_own_windows_in_order(tmp_path):
    module = TextDataModule(path=str(text_file(tmp_path, 800)), **BATCHING)
    folder = prepare(module, tmp_path / "shards").folder
    one = ShardDataModule(path=str(folder), **BATCHING)
    two = ShardDataModule(path=str(folder), num_workers=2, **BATCHING)
    assert_same_batches(batches(one, "train"), batches(two, "train"))


def test_a_resumed_epoch_starts_at_its_window_without_reading_those_before(tmp_path, monkeypatch):
    module = TextDataModule(path=str(text_file(tmp_path)), **BATCHING)
    shards = ShardDataModule(path=str(prepare(module, tmp_path / "shards").folder), **BATCHING)
    every = batches(shards, "train")
    loader = shards.train_dataloader()
    assert isinstance(loader, ResumableDataLoader)
    loader.load_state_dict({"batches_yielded": 5, "num_batches": len(every)})
    dataset = loader.dataset
    read = []
    original = type(dataset).window
    monkeypatch.setattr(type(dataset), "window", lambda self, k: read.append(k) or original(self, k))
    resumed = list(loader)
    assert read[0] == 5 and len(read) == len(every) - 5
    assert_same_batches(every[5:], resumed)
    assert loader.state_dict()["batches_yielded"] == len(every)
