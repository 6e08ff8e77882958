"""Checkpoint files are complete or absent, and a full disk is one line naming the file."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sru_lightning.strategies import AtomicCheckpointIO, CheckpointWriteError


@contextlib.contextmanager
def small_disk(folder: Path, size: str):
    """A tmpfs of `size` mounted on `folder` (root only): a disk that really fills up."""
    folder.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs to fill a disk needs root")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def test_a_checkpoint_is_written_whole_and_loads(tmp_path):
    AtomicCheckpointIO().save_checkpoint({"global_step": 3, "w": torch.ones(4)}, tmp_path / "c" / "last.ckpt")
    assert sorted(os.listdir(tmp_path / "c")) == ["last.ckpt"]
    assert torch.load(tmp_path / "c" / "last.ckpt", weights_only=True)["global_step"] == 3


def test_a_full_disk_leaves_no_file_and_names_the_one_it_could_not_write(tmp_path):
    with small_disk(tmp_path / "disk", "64k") as disk:
        target = disk / "best.ckpt"
        with pytest.raises(CheckpointWriteError) as raised:
            AtomicCheckpointIO().save_checkpoint({"w": torch.zeros(100_000)}, target)
        assert str(raised.value) == f"cannot write the checkpoint {str(target)!r}: No space left on device"
        assert os.listdir(disk) == [], "no partial file, nothing under the real name"


@pytest.mark.slow
def test_a_fit_on_a_full_disk_fails_in_one_line_and_leaves_only_whole_checkpoints(tmp_path, monkeypatch, capsys):
    from helpers.tiny_run import TINY_RUN

    from sru_lightning.app import cli

    monkeypatch.chdir(tmp_path)
    with small_disk(tmp_path / "disk", "200k") as disk:
        run = disk / "run"
        status = cli.main(
            [
                "fit",
                *TINY_RUN,
                "model.net.hidden_size=64",
                "logger=none",
                "+trainer.enable_progress_bar=false",
                f"hydra.run.dir={run}",
            ]
        )
        err = capsys.readouterr().err
        assert status == 1
        assert "cannot write the checkpoint" in err and "No space left on device" in err and "Traceback" not in err
        names = os.listdir(run / "checkpoints")
        assert not any(name.endswith(".partial") for name in names)
        for name in names:  # whatever was written before the disk filled up is whole
            assert torch.load(run / "checkpoints" / name, weights_only=True)["global_step"] >= 0
        record = json.loads((run / "result.json").read_text())
        assert record["status"] == "failed" and record["error"].startswith("cannot write the checkpoint")


@pytest.mark.slow
@pytest.mark.parametrize("trainer", ["deepspeed_stage_3"])
def test_a_deepspeed_fit_on_a_full_disk_leaves_no_half_written_checkpoint_folder(tmp_path, trainer):
    pytest.importorskip("deepspeed", reason="the DeepSpeed engine is the `deepspeed` extra")
    from helpers import preloaded
    from helpers.tiny_run import TINY_RUN

    with small_disk(tmp_path / "disk", "200k") as disk:
        run = disk / "run"
        completed = preloaded.run(
            [
                sys.executable,
                "-m",
                "sru_lightning",
                "fit",
                *TINY_RUN,
                f"trainer={trainer}",
                "trainer.accelerator=cpu",
                "trainer.devices=1",
                "model.net.hidden_size=64",
                "logger=none",
                "threads=1",
                f"hydra.run.dir={run}",
            ],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert completed.returncode == 1, completed.stderr[-3000:]
        errors = [line for line in completed.stderr.splitlines() if "error" in line]
        assert any("cannot write the checkpoint" in line and "No space left on device" in line for line in errors), (
            completed.stderr[-3000:]
        )
        assert "Traceback" not in completed.stderr
        # Nothing under a checkpoint's name but whole folders: each has its `latest` tag and
        # every rank's files; the half-written one is gone.
        for entry in (run / "checkpoints").iterdir() if (run / "checkpoints").exists() else []:
            assert not entry.name.endswith(".partial"), sorted(os.listdir(entry.parent))
            assert entry.is_dir() and (entry / "latest").read_text() == "checkpoint", entry
        record = json.loads((run / "result.json").read_text())
        assert record["status"] == "failed" and record["error"].startswith("cannot write the checkpoint"), record
