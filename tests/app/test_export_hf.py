"""`python -m sru_lightning export format=hf`: a trained run's network as config.json,
model.safetensors and tokenizer.json, which `sru_lightning.from_pretrained` reads in a fresh
interpreter without Lightning or Hydra to the checkpoint's logits, and `generate` / `serve`
read like the other export folders."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("safetensors", reason="format=hf needs the `hub` extra: pip install 'sru_lightning[hub]'")

from helpers.language_models import language_model  # noqa: E402
from helpers.tiny_run import TINY_RUN  # noqa: E402

from sru_lightning.app import cli, generate, serve  # noqa: E402
from sru_lightning.app import export_command as command  # noqa: E402
from sru_lightning.data import TokenCodec  # noqa: E402
from sru_lightning.models.checkpoint_format import FORMAT_KEY, FORMAT_VERSION  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
ALPHABET = list("abcdefghij .,\nT")
GREEDY = ["prompt=The ", "length=60", "temperature=0"]
HF_FILES = ["config.json", "manifest.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]


def run_main(main, argv, capsys) -> tuple[int, str, str]:
    status = main(argv)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


@pytest.fixture
def checkpoint(tmp_path) -> Path:
    """A checkpoint file as `fit` writes it (weights, hyperparameters, vocabulary), tied weights."""
    torch.manual_seed(0)
    model = language_model(vocab_size=len(ALPHABET), embedding_dim=8, hidden_size=16, num_layers=2, tie_weights=True)
    path = tmp_path / "sru.ckpt"
    torch.save(
        {
            "state_dict": model.state_dict(),
            "hyper_parameters": dict(model.hparams),
            "global_step": 7,
            "PydocDataModule": {"token_codec": TokenCodec("char", ALPHABET).state_dict()},
            FORMAT_KEY: FORMAT_VERSION,
        },
        path,
    )
    return path


def test_format_hf_writes_the_folder_and_generate_and_serve_read_it(checkpoint, tmp_path, capsys):
    out = tmp_path / "hf"
    status, stdout, stderr = run_main(command.main, [f"ckpt_path={checkpoint}", "format=hf", f"out={out}"], capsys)
    assert status == 0, stderr
    assert stdout.strip() == str(out) and f"sru model of {checkpoint} (step 7) -> {out} (format=hf" in stderr
    assert sorted(path.name for path in out.iterdir()) == HF_FILES
    config = json.loads((out / "config.json").read_text())
    assert config["source"] == {"checkpoint": str(checkpoint), "global_step": 7}
    assert config["config"]["tie_weights"] is True

    status, expected, _ = run_main(generate.main, [f"ckpt_path={checkpoint}", *GREEDY], capsys)
    assert status == 0
    status, text, stderr = run_main(generate.main, [f"model={out}", *GREEDY], capsys)
    assert status == 0, stderr
    assert text == expected and f"{out} (sru, format=hf, step 7, char level)" in stderr

    status, _, stderr = run_main(generate.main, [f"model={out}", "backend=onnxruntime"], capsys)
    assert status == 2 and stderr.count("\n") == 1
    assert "holds format=hf, which runs the network in PyTorch: leave `backend` empty" in stderr

    settings = serve.parse_settings([f"model={out}"])
    model, codec, description = serve.load_model(settings)
    assert model.rnn_type == "sru" and codec.itos == ALPHABET and "format=hf" in description


def test_generate_refuses_an_hf_folder_with_a_truncated_weights_file_in_one_line(checkpoint, tmp_path, capsys):
    out = tmp_path / "hf"
    assert command.main([f"ckpt_path={checkpoint}", "format=hf", f"out={out}"]) == 0
    capsys.readouterr()
    weights = out / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    status, stdout, stderr = run_main(generate.main, [f"model={out}", *GREEDY], capsys)
    assert status == 2 and stdout == "" and stderr.count("\n") == 1
    assert f"cannot load {str(weights)!r}: it is not a safetensors file that can be read" in stderr


# The fresh interpreter: from_pretrained alone, the logits of fixed tokens written to a file.
LOAD_SCRIPT = """
import sys, torch, sru_lightning
net, codec = sru_lightning.from_pretrained(sys.argv[1])
heavy = [name for name in ("lightning", "hydra") if name in sys.modules]
assert heavy == [], f"from_pretrained loaded {heavy}"
tokens = torch.tensor([codec.encode("The cat, a hat.")] * 2)
with torch.no_grad():
    logits = net(tokens)[0]
    step = net.step(tokens)[0]
torch.save({"tokens": tokens, "logits": logits, "step": step, "training": net.training}, sys.argv[2])
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    "kind,overrides",
    [("sru", ["model.net.tie_weights=true"]), ("srupp", []), ("lstm", [])],
)
def test_a_trained_run_round_trips_through_format_hf_to_identical_logits(kind, overrides, tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert cli.main(["fit", *TINY_RUN, f"model={kind}", *overrides, f"hydra.run.dir={run_dir}"]) == 0
    out = tmp_path / "hf"
    status, _, stderr = run_main(command.main, [f"ckpt_path={run_dir}", "format=hf", f"out={out}"], capsys)
    assert status == 0, stderr
    assert sorted(path.name for path in out.iterdir()) == HF_FILES

    result_file = tmp_path / "logits.pt"
    loaded = subprocess.run(
        [sys.executable, "-c", LOAD_SCRIPT, str(out), str(result_file)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    result = torch.load(result_file, weights_only=True)
    _, _, model, _ = generate.load_trained(str(run_dir), str(tmp_path))
    assert result["training"] is False and model.net.rnn_type == kind
    with torch.no_grad():
        assert torch.equal(result["logits"], model.net(result["tokens"])[0])
        assert torch.equal(result["step"], model.net.step(result["tokens"])[0])

    status, expected, _ = run_main(generate.main, [f"ckpt_path={run_dir}", *GREEDY], capsys)
    assert status == 0
    status, text, stderr = run_main(generate.main, [f"model={out}", *GREEDY], capsys)
    assert status == 0, stderr
    assert text == expected
