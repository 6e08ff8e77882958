"""A prepared folder that cannot be read as it is is refused in one sentence naming the file and
what to do; `prepare` never leaves a folder that looks complete, and replaces only its own."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from sru_lightning.data import TextDataModule
from sru_lightning.data.prepare import PrepareOptions, prepare_corpus
from sru_lightning.data.shard_module import ShardDataModule
from sru_lightning.data.shards import INDEX_NAME, ShardError, index_checksum
from sru_lightning.data.sources import reading_of
from sru_lightning.data.tokens import TokenCodec

TEXT = "".join(f"line {number}: the quick brown fox jumps over the lazy dog\n" for number in range(300))


def prepare(tmp_path, name="shards", text=TEXT, **kwargs):
    source = tmp_path / f"{name}.txt"
    source.write_text(text, encoding="utf-8")
    module = TextDataModule(path=str(source), batch_size=2, seq_len=8)
    options = PrepareOptions(workers=1, shard_mb=0.002, progress=False)
    return prepare_corpus(reading_of(module), module.token_level, tmp_path / name, options=options, **kwargs).folder


def refused(folder, match, error=ShardError, **kwargs):
    with pytest.raises(error, match=match) as caught:
        ShardDataModule(path=str(folder), **kwargs)
    assert "\n" not in str(caught.value)
    return str(caught.value)


def writable(path):
    path.chmod(0o644)
    return path


def rewrite_index(folder, change, keep_checksum=False):
    path = writable(folder / INDEX_NAME)
    index = json.loads(path.read_text())
    change(index)
    if keep_checksum:
        index["checksum"] = index_checksum(index)
    path.write_text(json.dumps(index))


def test_a_missing_folder_or_index_says_to_prepare(tmp_path):
    message = refused(tmp_path / "nowhere", "does not exist; prepare it with")
    assert "python -m sru_lightning prepare" in message
    (tmp_path / "empty").mkdir()
    refused(tmp_path / "empty", r"index.json' does not exist: .* its prepare did not finish; run .*prepare")


def test_a_truncated_or_missing_shard_is_named(tmp_path):
    folder = prepare(tmp_path)
    shard = folder / "train-00001.bin"
    size = shard.stat().st_size
    os.truncate(writable(shard), size - 3)
    refused(folder, rf"train-00001.bin' is truncated \({size - 3} bytes, index.json says {size}\)")
    shard.unlink()
    refused(folder, r"train-00001.bin', listed in index.json, is missing: the folder is incomplete")


def test_a_changed_index_is_refused(tmp_path):
    folder = prepare(tmp_path)
    rewrite_index(folder, lambda index: index.update(vocab_size=index["vocab_size"] + 1))
    refused(folder, "was changed after prepare wrote it")


def test_a_foreign_index_is_refused(tmp_path):
    folder = prepare(tmp_path)
    writable(folder / INDEX_NAME).write_text(json.dumps({"format": "something else", "files": []}))
    refused(folder, "is not an index written by `python -m sru_lightning prepare` .*'something else'")
    (folder / INDEX_NAME).write_text("{not json")
    refused(folder, "cannot be read as an index")


def test_a_shard_of_another_prepared_folder_is_told_apart_even_of_the_same_size(tmp_path):
    one, two = prepare(tmp_path, "one"), prepare(tmp_path, "two", text=TEXT.replace("fox", "cat"))
    shard = writable(one / "val-00000.bin")
    shutil.copyfile(two / "val-00000.bin", shard)
    refused(one, "val-00000.bin' does not belong to the corpus index.json describes")


def test_verify_reads_every_checksum(tmp_path):
    folder = prepare(tmp_path)
    shard = writable(folder / "train-00000.bin")
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1
    shard.write_bytes(bytes(data))
    ShardDataModule(path=str(folder))  # sizes and headers agree: the default start reads no data
    refused(folder, "train-00000.bin' has changed since prepare wrote it", verify=True)


def test_an_index_of_a_newer_format_says_so(tmp_path):
    folder = prepare(tmp_path)
    rewrite_index(folder, lambda index: index.update(version=99), keep_checksum=True)
    refused(folder, "version 99 of the format; this sru_lightning reads version 1")


@pytest.mark.parametrize(
    "override, match",
    [({"tokenizer": "bpe"}, "`data.tokenizer`='bpe' conflicts with"), ({"vocab_size": 500}, "`data.vocab_size`=500")],
)
def test_a_conflicting_vocabulary_setting_is_refused(tmp_path, override, match):
    message = refused(prepare(tmp_path), match, ValueError, **override)
    assert "prepared at char level" in message and "leave data.tokenizer and data.vocab_size unset" in message


def test_the_index_settings_themselves_are_accepted(tmp_path):
    folder = prepare(tmp_path)
    size = ShardDataModule(path=str(folder)).vocab_size
    assert ShardDataModule(path=str(folder), vocab_size=size).vocab_size == size


def test_a_checkpoint_of_another_vocabulary_is_refused(tmp_path):
    shards = ShardDataModule(path=str(prepare(tmp_path)))
    assert shards.adopt_vocabulary(TokenCodec.from_state_dict(shards.codec.state_dict())) == 0
    other = TokenCodec("char", sorted(set(TEXT + "é")))
    with pytest.raises(ValueError, match="the checkpoint's vocabulary .* is not the one of the shards in"):
        shards.adopt_vocabulary(other)
    with pytest.raises(ValueError, match="ids mean other tokens"):
        shards.load_state_dict({"token_codec": other.state_dict()})


def test_prepare_refuses_a_folder_that_is_not_empty(tmp_path):
    out = tmp_path / "shards"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="already exists and is not empty; .* overwrite=true"):
        prepare(tmp_path)
    with pytest.raises(ValueError, match=r"cannot be replaced: it has no readable index.json of a prepared corpus"):
        prepare(tmp_path, overwrite=True)
    assert [path.name for path in out.iterdir()] == ["notes.txt"]


def test_overwrite_replaces_only_a_prepared_folder_holding_nothing_else(tmp_path):
    folder = prepare(tmp_path)
    old_id = json.loads((folder / INDEX_NAME).read_text())["corpus_id"]
    assert prepare(tmp_path, overwrite=True) == folder
    assert json.loads((folder / INDEX_NAME).read_text())["corpus_id"] != old_id
    (folder / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match=r"holds \['notes.txt'\] besides the files its index lists"):
        prepare(tmp_path, overwrite=True)
    assert (folder / "notes.txt").read_text() == "mine"
    ShardDataModule(path=str(folder))  # the old corpus is untouched
    (folder / "notes.txt").unlink()
    os.truncate(writable(folder / "train-00000.bin"), 10)  # a damaged corpus of ours is replaced
    prepare(tmp_path, overwrite=True)
    ShardDataModule(path=str(folder))


def test_an_interrupted_prepare_leaves_nothing_that_looks_complete(tmp_path, monkeypatch):
    from sru_lightning.data import shards

    def full_disk(self, ids):
        raise OSError(28, "No space left on device", str(self.folder / "train-00000.bin"))

    monkeypatch.setattr(shards.SplitWriter, "append", full_disk)
    with pytest.raises(OSError, match="No space left"):
        prepare(tmp_path)
    monkeypatch.setattr(shards.SplitWriter, "append", lambda self, ids: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        prepare(tmp_path)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["shards.txt"]  # no folder, no hidden staging
