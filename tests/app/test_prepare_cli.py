"""`prepare` then `fit data=shards` through the command line: the same run as the in-memory data,
an exact mid-epoch resume, shards that no run changes, and one-line refusals (exit 2) for a
damaged folder, a conflicting setting and a checkpoint of another vocabulary."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest
import torch
from helpers.tiny_run import TINY_RUN

from sru_lightning.app import cli

# Constant learning rate and every batch of the epoch, so two parts and one part take the same steps.
EXACT = [*TINY_RUN, "+trainer.enable_progress_bar=false", "model.lr_scheduler=null", "logger=none"]
EXACT += ["trainer.limit_train_batches=null"]


def run(capsys, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    status = cli.main(list(args))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def one_line_refusal(status: int, err: str) -> str:
    assert status == 2, err[-2000:]
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1 and "Traceback" not in err, err[-2000:]
    return lines[0]


@pytest.fixture
def corpus(tmp_path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    from pydoc_data.topics import topics

    path = tmp_path / "prose.txt"
    path.write_text("\n".join(topics[key] for key in sorted(topics))[:60_000], encoding="utf-8")
    return path


def prepare(capsys, corpus: Path, out: str, *extra: str) -> Path:
    status, stdout, err = run(capsys, "prepare", "data=text", f"data.path={corpus}", f"out={out}", *extra)
    assert status == 0, err[-2000:]
    assert re.search(r"prepare: 0\.1 M chars -> .* \(char level, \d+ tokens as uint8; tokens train", err), err
    return Path(stdout.strip())


def checkpoint(run_dir: Path) -> dict:
    return torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)


@pytest.mark.slow
def test_a_fit_from_shards_is_the_in_memory_fit_and_resumes_exactly(tmp_path, corpus, capsys):
    folder = prepare(capsys, corpus, "shards")
    shards = ("data=shards", f"data.path={folder}")
    before = {path.name: (path.stat().st_mtime_ns, path.read_bytes()) for path in folder.iterdir()}

    status, memory_out, err = run(
        capsys, "fit", *EXACT, "data=text", f"data.path={corpus}", "trainer.max_steps=6", "hydra.run.dir=memory"
    )
    assert status == 0, err[-2000:]
    status, whole_out, err = run(capsys, "fit", *EXACT, *shards, "trainer.max_steps=6", "hydra.run.dir=whole")
    assert status == 0, err[-2000:]
    final = re.compile(r"final val_bpc=[0-9.]+ \(unigram baseline bpc=[0-9.]+")
    assert final.search(whole_out).group() == final.search(memory_out).group()

    assert run(capsys, "fit", *EXACT, *shards, "trainer.max_steps=3", "hydra.run.dir=parts")[0] == 0
    status, _, err = run(
        capsys, "fit", *EXACT, *shards, "trainer.max_steps=6", "ckpt_path=parts", "hydra.run.dir=parts"
    )
    assert status == 0, err[-2000:]

    memory, whole, parts = (
        checkpoint(tmp_path / "memory"),
        checkpoint(tmp_path / "whole"),
        checkpoint(tmp_path / "parts"),
    )
    assert whole["global_step"] == parts["global_step"] == 6
    assert whole["ShardDataModule"]["token_codec"] == memory["TextDataModule"]["token_codec"]
    for name, tensor in whole["state_dict"].items():
        torch.testing.assert_close(parts["state_dict"][name], tensor, rtol=0, atol=0, msg=name)
        torch.testing.assert_close(memory["state_dict"][name], tensor, rtol=0, atol=0, msg=name)
    # the epoch was not over at step 3: the resume started in the middle of it
    assert whole["loops"]["fit_loop"]["epoch_progress"]["current"]["completed"] == 0

    status, text, err = run(capsys, "generate", "ckpt_path=parts", "prompt=The ", "length=20", "temperature=0")
    assert status == 0 and text.startswith("The "), err[-2000:]
    status, _, err = run(capsys, "validate", "ckpt_path=parts", *shards, "data.batch_size=4", "data.seq_len=16")
    assert status == 0, err[-2000:]
    after = {path.name: (path.stat().st_mtime_ns, path.read_bytes()) for path in folder.iterdir()}
    assert after == before, "a run changed the prepared folder"


@pytest.mark.slow
def test_a_checkpoint_meets_shards_of_another_vocabulary_in_one_line(tmp_path, corpus, capsys):
    folder = prepare(capsys, corpus, "shards")
    other_text = tmp_path / "other.txt"
    other_text.write_text(corpus.read_text(encoding="utf-8").upper(), encoding="utf-8")
    other = prepare(capsys, other_text, "other")
    assert run(capsys, "fit", *TINY_RUN, "data=shards", f"data.path={folder}", "hydra.run.dir=run")[0] == 0
    status, _, err = run(capsys, "validate", *TINY_RUN, "ckpt_path=run", "data=shards", f"data.path={other}")
    line = one_line_refusal(status, err)
    assert "the checkpoint's vocabulary (char level" in line and f"shards in {str(other)!r}" in line, line
    # the run's own folder prepared again from other text: a resumed fit refuses it too
    prepare(capsys, other_text, "shards", "overwrite=true")
    status, _, err = run(
        capsys,
        "fit",
        *TINY_RUN,
        "ckpt_path=run",
        "data=shards",
        f"data.path={folder}",
        "trainer.max_epochs=2",
        "hydra.run.dir=run",
    )
    line = one_line_refusal(status, err)
    assert "the checkpoint's vocabulary (char level" in line and f"shards in {str(folder)!r}" in line, line


def test_prepare_refusals_are_one_line(tmp_path, corpus, capsys):
    line = one_line_refusal(*run(capsys, "prepare", "data=text", f"data.path={corpus}")[::2])
    assert "`out` is required" in line
    line = one_line_refusal(*run(capsys, "prepare", "data=shards", "data.path=x", "out=y")[::2])
    assert "got data=shards, which is prepared already" in line
    line = one_line_refusal(*run(capsys, "prepare", "data=txt", "out=y")[::2])
    assert "data" in line and "txt" in line
    line = one_line_refusal(*run(capsys, "prepare", "data=text", f"data.path={corpus}", "out=y", "shards=2")[::2])
    assert "unknown setting 'shards'" in line
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "mine.txt").write_text("mine")
    line = one_line_refusal(*run(capsys, "prepare", "data=text", f"data.path={corpus}", "out=taken")[::2])
    assert "already exists and is not empty" in line
    line = one_line_refusal(
        *run(capsys, "prepare", "data=text", f"data.path={corpus}", "out=taken", "overwrite=true")[::2]
    )
    assert "cannot be replaced" in line and (tmp_path / "taken" / "mine.txt").read_text() == "mine"


def test_prepare_overwrite_and_the_help(tmp_path, corpus, capsys):
    folder = prepare(capsys, corpus, "shards")
    first = json.loads((folder / "index.json").read_text())
    assert first["source"]["data"]["_target_"] == "sru_lightning.data.TextDataModule"
    prepare(capsys, corpus, "shards", "overwrite=true", "shard_mb=0.01")
    second = json.loads((folder / "index.json").read_text())
    assert second["corpus_id"] != first["corpus_id"] and len(second["splits"]["train"]["shards"]) > 1
    assert sorted(path.name for path in tmp_path.iterdir()) == ["prose.txt", "shards"]  # no staging left
    status, out, _ = run(capsys, "prepare", "--help")
    assert status == 0 and "out=''" in out and "data=shards data.path=corpus-shards" in out


@pytest.mark.slow
def test_fit_refuses_a_damaged_folder_and_a_conflicting_setting_in_one_line(tmp_path, corpus, capsys):
    folder = prepare(capsys, corpus, "shards")
    line = one_line_refusal(
        *run(capsys, "fit", *TINY_RUN, "data=shards", f"data.path={folder}", "data.tokenizer=bpe")[::2]
    )
    assert "`data.tokenizer`='bpe' conflicts with the shards in" in line
    shard = folder / "val-00000.bin"
    shard.chmod(0o644)
    os.truncate(shard, 100)
    line = one_line_refusal(*run(capsys, "fit", *TINY_RUN, "data=shards", f"data.path={folder}")[::2])
    assert f"{str(shard)!r} is truncated" in line and "prepare" in line


def test_experiment_enwik8_is_prepared_at_byte_level(tmp_path, corpus, capsys):
    enwik8 = tmp_path / "enwik8"
    enwik8.write_bytes(corpus.read_bytes()[:30_000])
    sizes = ("data.train_bytes=20000", "data.val_bytes=5000", "data.test_bytes=5000")
    status, out, err = run(capsys, "prepare", "experiment=enwik8", f"data.path={enwik8}", *sizes, "out=enwik8-shards")
    assert status == 0, err[-2000:]
    index = json.loads((Path(out.strip()) / "index.json").read_text())
    assert index["token_level"] == "byte" and index["dtype"] == "uint8" and index["vocab_size"] == 256
    assert [index["splits"][split]["tokens"] for split in ("train", "val", "test")] == [20000, 5000, 5000]
    assert index["source"]["data"]["batch_size"] == 128  # the experiment's data settings


def test_a_full_disk_or_ctrl_c_during_prepare_is_one_line_and_leaves_nothing(tmp_path, corpus, capsys, monkeypatch):
    from sru_lightning.data import shards

    def full_disk(self, ids):
        raise OSError(28, "No space left on device", str(self.folder / "train-00000.bin"))

    monkeypatch.setattr(shards.SplitWriter, "append", full_disk)
    line = one_line_refusal(*run(capsys, "prepare", "data=text", f"data.path={corpus}", "out=shards")[::2])
    assert "cannot write" in line and "train-00000.bin: No space left on device" in line, line
    assert "run the same command again" in line

    def interrupted(self, ids):
        raise KeyboardInterrupt

    monkeypatch.setattr(shards.SplitWriter, "append", interrupted)
    status, _, err = run(capsys, "prepare", "data=text", f"data.path={corpus}", "out=shards")
    assert status == 130 and "interrupted (Ctrl+C): nothing was written to 'shards'" in err
    assert sorted(path.name for path in tmp_path.iterdir()) == ["prose.txt"]  # no folder, no hidden staging


# --------------------------------------------------------------------------------------------
# format=litdata and data=litdata
def prepare_litdata(capsys, corpus: Path, out: str) -> Path:
    pytest.importorskip("litdata", reason="the `data` extra (litdata) is not installed")
    status, stdout, err = run(
        capsys, "prepare", "data=text", f"data.path={corpus}", f"out={out}", "format=litdata", "chunk_tokens=4096"
    )
    assert status == 0, err[-2000:]
    assert re.search(r"-> .* \(char level, .*; LitData format, chunks of 4,096 tokens\)", err), err
    return Path(stdout.strip())


@pytest.mark.slow
def test_a_fit_from_litdata_resumes_exactly_from_its_loader_state(tmp_path, corpus, capsys):
    folder = prepare_litdata(capsys, corpus, "lit")
    lit = ("data=litdata", f"data.path={folder}")
    status, _, err = run(capsys, "fit", *EXACT, *lit, "trainer.max_steps=6", "hydra.run.dir=whole")
    assert status == 0, err[-2000:]
    assert run(capsys, "fit", *EXACT, *lit, "trainer.max_steps=3", "hydra.run.dir=parts")[0] == 0
    status, _, err = run(capsys, "fit", *EXACT, *lit, "trainer.max_steps=6", "ckpt_path=parts", "hydra.run.dir=parts")
    assert status == 0, err[-2000:]
    whole, parts = checkpoint(tmp_path / "whole"), checkpoint(tmp_path / "parts")
    assert whole["global_step"] == parts["global_step"] == 6
    for key, value in whole["state_dict"].items():
        assert torch.equal(value, parts["state_dict"][key]), key
    (saved,) = parts["loops"]["fit_loop"]["state_dict"]["combined_loader"]
    assert saved["num_samples_yielded"] == {0: [6] * 8}  # LitData's own count: 4 rows and their next blocks
    assert "max_cache_size" not in err  # LitData's notice of its default cache budget, once per reader


@pytest.mark.slow
def test_two_ddp_ranks_from_litdata_match_one_process(tmp_path, corpus, capsys):
    from helpers import preloaded

    folder = prepare_litdata(capsys, corpus, "lit")
    settings = [*EXACT, "data=litdata", f"data.path={folder}", "trainer.max_steps=4", "model.net.dropout=0"]
    status, _, err = run(capsys, "fit", *settings, "data.batch_size=4", "hydra.run.dir=single")
    assert status == 0, err[-2000:]
    env = dict(os.environ)
    root = Path(__file__).resolve().parents[2]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    command = ["-m", "sru_lightning", "fit", *settings, "trainer=ddp_cpu", "data.batch_size=2", "hydra.run.dir=ddp"]
    completed = preloaded.run(
        [sys.executable, *command],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
        preload_children=True,
    )
    assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-3000:]
    single, ddp = checkpoint(tmp_path / "single"), checkpoint(tmp_path / "ddp")
    largest = max((single["state_dict"][k] - ddp["state_dict"][k]).abs().max().item() for k in single["state_dict"])
    assert largest < 1e-5, f"weights differ by up to {largest:.2e}"
    assert (tmp_path / "ddp" / "train_ddp_process_1.log").exists()  # the second rank really ran


@pytest.mark.slow
@pytest.mark.parametrize("command", ["prepare", "fit"])
def test_without_litdata_both_commands_name_the_extra_in_one_line(tmp_path, corpus, command):
    from helpers import preloaded

    arguments = {
        "prepare": ["prepare", "data=text", f"data.path={corpus}", "out=lit", "format=litdata"],
        "fit": ["fit", *TINY_RUN, "data=litdata", f"data.path={tmp_path}"],
    }[command]
    # an entry of None in sys.modules makes `import litdata` raise ImportError, as when it is not installed
    script = "import sys, runpy; sys.modules['litdata'] = None; sys.argv = ['sru_lightning', *sys.argv[1:]]; "
    script += "runpy.run_module('sru_lightning', run_name='__main__')"
    env = dict(os.environ)
    root = Path(__file__).resolve().parents[2]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    completed = preloaded.run(
        [sys.executable, "-c", script, *arguments], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    line = one_line_refusal(completed.returncode, completed.stderr)
    assert "needs LitData, which is not installed: install the `data` extra (pip install 'sru_lightning[data]')" in line
    assert not (tmp_path / "lit").exists()
