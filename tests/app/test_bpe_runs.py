"""`fit data.tokenizer=bpe data.vocab_size=N`: a run with a byte-level BPE vocabulary learned from
its training split trains, resumes and evaluates with the checkpoint's vocabulary, generates
text and exports a folder whose vocabulary.json carries the tokenizer."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from helpers.tiny_run import TINY_RUN

from sru_lightning.app import cli

PROMPT = "Grüße, the "


def run_command(capsys, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    status = cli.main(list(args))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def _corpus(tmp_path: Path) -> Path:
    from pydoc_data.topics import topics

    text = "\n".join(topics[key] for key in sorted(topics))[:40_000]
    path = tmp_path / "prose.txt"
    path.write_text(text.replace(" the ", " thé ", 50) + "\n中文 🙂 naïve\n" * 20, encoding="utf-8")
    return path


@pytest.mark.slow
def test_a_bpe_run_trains_resumes_evaluates_generates_and_exports(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "bpe"
    data = ("data=text", f"data.path={_corpus(tmp_path)}", "data.tokenizer=bpe", "data.vocab_size=320")
    status, out, err = run_command(capsys, "fit", *TINY_RUN, *data, f"hydra.run.dir={run_dir}")
    assert status == 0, err[-2000:]
    assert re.search(r"final val_bpt=[0-9.]+, val_bpb=[0-9.]+ \(unigram baseline bpt=", out), out[-500:]

    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    codec_state = checkpoint["TextDataModule"]["token_codec"]
    assert codec_state["level"] == "bpe" and isinstance(codec_state["tokenizer"], str)
    vocabulary = json.loads(codec_state["tokenizer"])["model"]["vocab"]
    embedding = next(value for key, value in checkpoint["state_dict"].items() if key.endswith("embedding.weight"))
    assert len(vocabulary) == embedding.shape[0] == 320

    # resume and evaluate: token ids keep the checkpoint's meaning; neither learns a vocabulary again
    import sru_lightning.data.base as base

    def no_training(*args, **kwargs):
        raise AssertionError("a vocabulary was learned again")

    monkeypatch.setattr(base, "train_bpe", no_training)
    status, _, err = run_command(
        capsys, "fit", *TINY_RUN, *data, "trainer.max_epochs=2", f"hydra.run.dir={run_dir}", f"ckpt_path={run_dir}"
    )
    assert status == 0, err[-2000:]
    resumed = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert resumed["global_step"] == 6 and resumed["TextDataModule"]["token_codec"] == codec_state
    status, out, err = run_command(capsys, "validate", f"ckpt_path={run_dir}")
    assert status == 0, err[-2000:]
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)

    # generate: the prompt (non-ASCII) is echoed and the text decodes; greedy text is repeatable
    settings = (f"prompt={PROMPT}", "length=30", "temperature=0")
    status, from_checkpoint, err = run_command(capsys, "generate", f"ckpt_path={run_dir}", *settings)
    assert status == 0 and "bpe level" in err, err[-2000:]
    assert from_checkpoint.startswith(PROMPT) and "30 tokens in" in err

    # export: vocabulary.json carries the tokenizer; the export generates the checkpoint's text
    out_dir = tmp_path / "export"
    status, _, err = run_command(capsys, "export", f"ckpt_path={run_dir}", "format=onnx", f"out={out_dir}")
    assert status == 0, err[-2000:]
    exported = json.loads((out_dir / "vocabulary.json").read_text(encoding="utf-8"))
    assert exported == codec_state
    status, from_export, err = run_command(capsys, "generate", f"model={out_dir}", *settings)
    assert status == 0, err[-2000:]
    assert from_export == from_checkpoint
