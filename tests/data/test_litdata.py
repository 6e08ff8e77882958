"""A corpus written in LitData's format (`prepare ... format=litdata`) and streamed by LitData
(`data=litdata`): the carried-state streams continue each other across LitData's chunks, every
window is the prepared ids at its place, a loader restored from LitData's state reads on where
the saved one stopped, and what the format cannot hold is refused in one line."""

from __future__ import annotations

import multiprocessing

import numpy as np
import pytest
import torch

from sru_lightning.data import DocumentsDataModule, TextDataModule
from sru_lightning.data.litdata_streams import blocks_per_row
from sru_lightning.data.mapped_streams import MappedTokens
from sru_lightning.data.prepare import PrepareOptions, prepare_corpus
from sru_lightning.data.shards import PreparedCorpus
from sru_lightning.data.sources import reading_of

pytest.importorskip("litdata", reason="the `data` extra (litdata) is not installed")

from sru_lightning.data.litdata_format import write_litdata  # noqa: E402
from sru_lightning.data.litdata_module import LitDataModule  # noqa: E402

CHUNK_TOKENS = 64  # several LitData chunks per split, so streams cross chunk boundaries
SEQ_LEN = 16


def prose(lines: int) -> str:
    rng = np.random.default_rng(0)
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]
    return "\n".join(" ".join(rng.choice(words, 6)) for _ in range(lines)) + "\n"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """(the prepared shards, the same corpus in LitData's format)."""
    folder = tmp_path_factory.mktemp("litdata")
    text = folder / "prose.txt"
    text.write_text(prose(120), encoding="utf-8")
    module = TextDataModule(path=str(text))
    options = PrepareOptions(workers=1, progress=False)
    shards = PreparedCorpus(
        prepare_corpus(reading_of(module), module.token_level, folder / "shards", options=options).folder
    )
    before = multiprocessing.get_start_method(allow_none=True)
    write_litdata(shards, folder / "lit", chunk_tokens=CHUNK_TOKENS)
    # LitData's optimize sets the process-wide start method; the writer puts the process's own back
    assert multiprocessing.get_start_method(allow_none=True) == before
    return shards, folder / "lit"


def windows(path, batch_size=3, **settings):
    module = LitDataModule(path=str(path), batch_size=batch_size, seq_len=SEQ_LEN, **settings)
    module.setup()
    return module, list(module.train_dataloader())


def test_each_window_is_the_prepared_ids_at_its_place_and_the_next_continues_it(corpus):
    shards, lit = corpus
    module, batches = windows(lit)
    ids = MappedTokens(shards.splits["train"].shards).read(0, shards.splits["train"].tokens).astype(np.int64)
    per_row = blocks_per_row(len(ids), SEQ_LEN, 3)
    assert len(batches) == per_row > CHUNK_TOKENS // SEQ_LEN  # the streams run over several chunks
    for k, (inputs, targets) in enumerate(batches):
        assert inputs.shape == targets.shape == (3, SEQ_LEN) and inputs.dtype == torch.long
        for row in range(3):
            start = (row * per_row + k) * SEQ_LEN
            assert torch.equal(inputs[row], torch.from_numpy(ids[start : start + SEQ_LEN])), (k, row)
            assert torch.equal(targets[row], torch.from_numpy(ids[start + 1 : start + SEQ_LEN + 1])), (k, row)
    assert module.vocab_size == shards.vocab_size and module.codec.state_dict() == shards.codec_state


def test_a_loader_restored_from_litdata_state_reads_on_where_the_saved_one_stopped(corpus):
    _, lit = corpus
    _, whole = windows(lit)
    module = LitDataModule(path=str(lit), batch_size=3, seq_len=SEQ_LEN)
    module.setup()
    loader = module.train_dataloader()
    batches = iter(loader)
    for _ in range(5):
        next(batches)
    state = loader.state_dict()
    resumed = module.train_dataloader()
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert len(rest) == len(whole) - 5
    for got, expected in zip(rest, whole[5:]):
        assert all(torch.equal(a, b) for a, b in zip(got, expected))


def test_a_worker_reading_ahead_gives_the_same_windows(corpus):
    _, lit = corpus
    _, in_process = windows(lit)
    _, one_worker = windows(lit, num_workers=1)
    assert len(in_process) == len(one_worker)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(in_process, one_worker))


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"seq_len": 24}, r"`data.seq_len`=24 does not divide the 64 tokens of each chunk"),
        ({"num_workers": 2}, r"`data.num_workers` must be 0 or 1, got 2"),
        ({"vocab_size": 5}, r"`data.vocab_size`=5 conflicts with the LitData corpus"),
    ],
)
def test_settings_the_streams_cannot_keep_are_refused(corpus, settings, message):
    _, lit = corpus
    with pytest.raises(ValueError, match=message):
        LitDataModule(path=str(lit), **{"seq_len": SEQ_LEN, **settings})


def test_a_split_too_short_for_its_streams_is_refused_before_training(corpus):
    _, lit = corpus
    module = LitDataModule(path=str(lit), batch_size=200, seq_len=SEQ_LEN)
    with pytest.raises(ValueError, match=r"the train split of the LitData corpus .* too few for 200 streams x 2"):
        module.check_sizes(world_size=2)


def test_a_folder_of_another_format_is_refused(corpus):
    shards, _ = corpus
    with pytest.raises(
        ValueError, match=r"is not a folder written by `python -m sru_lightning prepare .*format=litdata`"
    ):
        LitDataModule(path=str(shards.folder), seq_len=SEQ_LEN)


def test_documents_are_refused_by_the_format(tmp_path):
    folder = tmp_path / "docs"
    folder.mkdir()
    for number in range(30):
        (folder / f"doc{number:03d}.txt").write_text(prose(3 + number % 4), encoding="utf-8")
    module = DocumentsDataModule(path=str(folder))
    options = PrepareOptions(workers=1, progress=False)
    shards = PreparedCorpus(
        prepare_corpus(reading_of(module), module.token_level, tmp_path / "shards", options=options).folder
    )
    with pytest.raises(ValueError, match=r"`format=litdata` writes contiguous token streams; .* format=shards"):
        write_litdata(shards, tmp_path / "lit", chunk_tokens=CHUNK_TOKENS)
    assert not (tmp_path / "lit").exists()
