"""`python -m sru_lightning export` and `generate model=<export dir>`: the export folder of each
model kind and format generates the checkpoint's greedy text; bad input gets one line, exit 2,
and nothing that looks like a complete export."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("onnxruntime", reason="needs the `export` extra: pip install 'sru_lightning[export]'")

from sru_lightning.app import cli, generate  # noqa: E402
from sru_lightning.data import TokenCodec  # noqa: E402
from sru_lightning.app import export_command as command  # noqa: E402
from sru_lightning.models import SRULanguageModel  # noqa: E402
from helpers import preloaded

ALPHABET = list("abcdefghij .,\nT")
SIZES = {"sru": dict(sru_options={"highway_bias": -2.0, "rescale": True}),
         "srupp": dict(sru_options={"proj_size": 8, "attention_last_n_layers": 1}, memory_length=6),
         "lstm": {}}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    """A checkpoint file per model kind, as `fit` writes them (weights, hyperparameters, vocabulary)."""
    folder = tmp_path_factory.mktemp("checkpoints")
    codec = TokenCodec("char", ALPHABET)
    paths = {}
    for kind, options in SIZES.items():
        torch.manual_seed(0)
        model = SRULanguageModel(vocab_size=len(ALPHABET), rnn=kind, embedding_dim=8, hidden_size=16, num_layers=2,
                                 **options)
        path = folder / f"{kind}.ckpt"
        torch.save({"state_dict": model.state_dict(), "hyper_parameters": dict(model.hparams), "global_step": 7,
                    "PydocDataModule": {"token_codec": codec.state_dict()}}, path)
        paths[kind] = path
    return paths


def run_main(main, argv, capsys) -> tuple[int, str, str]:
    status = main(argv)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


GREEDY = ["prompt=The ", "length=200", "temperature=0"]


# lstm-pt2 after lstm-onnx in one process: the ONNX export leaves nn.LSTM's kernel cached, which the
# torch.export of the PyTorch formats must not reuse (it would fix the length).
# sru-onnx is the quick check (`make test-fast`); the other kinds and formats are `slow` exports.
@pytest.mark.parametrize("kind,fmt", [("sru", "onnx"), *(pytest.param(kind, fmt, marks=pytest.mark.slow) for kind, fmt in
                                                       [("srupp", "onnx"), ("lstm", "onnx"), ("lstm", "pt2"),
                                                        ("srupp", "pt2")])])
def test_export_folder_generates_the_checkpoints_greedy_text(kind, fmt, checkpoints, tmp_path, capsys):
    out = tmp_path / "export"
    status, stdout, stderr = run_main(command.main, [f"ckpt_path={checkpoints[kind]}", f"format={fmt}", f"out={out}"],
                                      capsys)
    assert status == 0, stderr
    assert stdout.strip() == str(out) and f"{kind} model of {checkpoints[kind]} (step 7)" in stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["model_kind"] == kind and manifest["format"] == fmt and manifest["torch_version"] == torch.__version__
    assert [spec["name"] for spec in manifest["inputs"]][0] == "tokens" and manifest["outputs"][0]["shape"] == [
        "batch", "length", len(ALPHABET)]
    assert sorted(path.name for path in out.iterdir()) == sorted(["manifest.json", "vocabulary.json",
                                                                  manifest["files"]["model"]])
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "staging folders left behind"

    status, expected, _ = run_main(generate.main, [f"ckpt_path={checkpoints[kind]}", *GREEDY], capsys)
    assert status == 0
    backend = "onnxruntime" if fmt == "onnx" else "pt2"
    status, text, stderr = run_main(generate.main, [f"model={out}", f"backend={backend}", *GREEDY], capsys)
    assert status == 0, stderr
    assert text == expected and len(text) == len("The ") + 200 + 1
    assert f"backend={backend}" in stderr and re.search(r"200 tokens in [0-9.]+ s \([0-9]+ tokens/s", stderr)


def test_existing_export_is_kept_unless_overwrite_and_a_failed_export_leaves_nothing(checkpoints, tmp_path, capsys,
                                                                                     monkeypatch):
    out = tmp_path / "export"
    argv = [f"ckpt_path={checkpoints['sru']}", "format=onnx", f"out={out}"]
    assert run_main(command.main, argv, capsys)[0] == 0
    before = (out / "model.onnx").stat().st_mtime_ns
    status, _, stderr = run_main(command.main, argv, capsys)
    assert status == 2 and stderr.count("\n") == 1
    assert f"`out` {str(out)!r} already exists; choose another folder or pass overwrite=true" in stderr
    assert (out / "model.onnx").stat().st_mtime_ns == before

    from sru_lightning.export import exporter

    def broken(wrapped, path):
        path.write_bytes(b"half a model")
        raise OSError("disk full")

    monkeypatch.setitem(exporter._SAVERS, "onnx", broken)
    with pytest.raises(OSError, match="disk full"):
        command.main([*argv, "overwrite=true"])
    assert (out / "model.onnx").stat().st_mtime_ns == before  # the earlier export is intact
    with pytest.raises(OSError, match="disk full"):
        command.main([f"ckpt_path={checkpoints['sru']}", f"out={tmp_path / 'new'}"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]  # no folder, no staging leftovers
    monkeypatch.undo()
    assert run_main(command.main, [*argv, "overwrite=true"], capsys)[0] == 0
    assert (out / "model.onnx").stat().st_mtime_ns != before


@pytest.mark.parametrize(
    "argv,message",
    [
        (["format=tflite", "out=x"], "`format` must be one of onnx, pt2, aoti, got 'tflite'"),
        (["format=onnx"], "`out` is required: the folder to create"),
        (["fromat=onnx"], "unknown setting 'fromat' (did you mean 'format'?)"),
        (["overwrite=maybe", "out=x"], "`overwrite` must be true or false, got 'maybe'"),
        (["ckpt_path=/no/such.ckpt", "out=x"], "`ckpt_path` must be a checkpoint file, a run directory or 'last'"),
    ],
)
def test_bad_export_settings_get_one_line_and_exit_2(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    status, _, stderr = run_main(command.main, argv, capsys)
    assert status == 2 and message in stderr and stderr.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


def test_generate_refuses_an_export_of_another_version_or_the_wrong_backend(checkpoints, tmp_path, capsys):
    out = tmp_path / "export"
    assert run_main(command.main, [f"ckpt_path={checkpoints['lstm']}", f"out={out}"], capsys)[0] == 0
    status, _, stderr = run_main(generate.main, [f"model={out}", "backend=pt2"], capsys)
    assert status == 2 and "backend=pt2 runs exports of format=pt2 or format=aoti, but" in stderr
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["export_format_version"] = 99
    (out / "manifest.json").write_text(json.dumps(manifest))
    status, stdout, stderr = run_main(generate.main, [f"model={out}"], capsys)
    assert status == 2 and stdout == "" and stderr.count("\n") == 1
    assert "is an export of format version 99" in stderr and "export the checkpoint again" in stderr
    status, _, stderr = run_main(generate.main, [f"model={tmp_path}"], capsys)
    assert status == 2 and "is not an export folder: it has no manifest.json" in stderr


LOAD_PT2 = """
import sys, torch
from sru_lightning.export import ExportError, load_pt2
try:
    program = load_pt2(sys.argv[1])
except ExportError as error:
    print(error); sys.exit(3)
logits, c = program(torch.zeros(2, 3, dtype=torch.int64), torch.zeros(2, 2, 16))
print(tuple(logits.shape))
"""


@pytest.mark.slow
def test_a_pt2_export_loads_in_a_fresh_process_with_one_line_or_names_the_missing_kernels(checkpoints, tmp_path,
                                                                                        capsys):
    out = tmp_path / "export"
    assert run_main(command.main, [f"ckpt_path={checkpoints['sru']}", "format=pt2", f"out={out}"], capsys)[0] == 0
    root = str(Path(cli.__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": root}

    def load(**extra):
        return preloaded.run([sys.executable, "-c", LOAD_PT2, str(out / "model.pt2")], env={**env, **extra},
                              capture_output=True, text=True, timeout=300)

    loaded = load()
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    assert loaded.stdout.strip() == f"(2, 3, {len(ALPHABET)})"
    missing = load(SRU_LIGHTNING_EXTENSION="0")
    assert missing.returncode == 3
    assert "needs sru_lightning's compiled recurrence kernels" in missing.stdout
    assert "install a C++ compiler (set CXX) and run `python -m sru_lightning build`" in missing.stdout
    generated = preloaded.run([sys.executable, "-m", "sru_lightning", "generate", f"model={out}"],
                               env={**env, "SRU_LIGHTNING_EXTENSION": "0"}, capture_output=True, text=True, timeout=300)
    assert generated.returncode == 2 and "Traceback" not in generated.stderr
    assert "needs sru_lightning's compiled recurrence kernels" in generated.stderr


@pytest.mark.slow
def test_aoti_export_generates_the_checkpoints_greedy_text(checkpoints, tmp_path, capsys):
    out = tmp_path / "export"
    status, _, stderr = run_main(command.main, [f"ckpt_path={checkpoints['sru']}", "format=aoti", f"out={out}"], capsys)
    assert status == 0, stderr
    _, expected, _ = run_main(generate.main, [f"ckpt_path={checkpoints['sru']}", *GREEDY], capsys)
    status, text, stderr = run_main(generate.main, [f"model={out}", *GREEDY], capsys)
    assert status == 0 and text == expected and "format=aoti, backend=pt2" in stderr
