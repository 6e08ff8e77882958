"""`python -m sru_lightning export` and `generate model=<export dir>`: the export folder of each
model kind and format generates the checkpoint's greedy text; bad input gets one line, exit 2,
and nothing that looks like a complete export."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("onnxruntime", reason="needs the `export` extra: pip install 'sru_lightning[export]'")

from helpers import preloaded
from helpers.language_models import language_model

from sru_lightning.app import cli, generate  # noqa: E402
from sru_lightning.app import export_command as command  # noqa: E402
from sru_lightning.data import TokenCodec  # noqa: E402
from sru_lightning.models.checkpoint_format import FORMAT_KEY, FORMAT_VERSION  # noqa: E402

ALPHABET = list("abcdefghij .,\nT")
SIZES = {
    "sru": dict(sru_options={"highway_bias": -2.0, "rescale": True}),
    "srupp": dict(sru_options={"proj_size": 8, "attention_last_n_layers": 1}, memory_length=6),
    "lstm": {},
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    """A checkpoint file per model kind, as `fit` writes them (weights, hyperparameters, vocabulary)."""
    folder = tmp_path_factory.mktemp("checkpoints")
    codec = TokenCodec("char", ALPHABET)
    paths = {}
    for kind, options in SIZES.items():
        torch.manual_seed(0)
        model = language_model(
            vocab_size=len(ALPHABET), rnn=kind, embedding_dim=8, hidden_size=16, num_layers=2, **options
        )
        path = folder / f"{kind}.ckpt"
        torch.save(
            {
                "state_dict": model.state_dict(),
                "hyper_parameters": dict(model.hparams),
                "global_step": 7,
                "PydocDataModule": {"token_codec": codec.state_dict()},
                FORMAT_KEY: FORMAT_VERSION,
            },
            path,
        )
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
@pytest.mark.parametrize(
    "kind,fmt",
    [
        ("sru", "onnx"),
        *(
            pytest.param(kind, fmt, marks=pytest.mark.slow)
            for kind, fmt in [("srupp", "onnx"), ("lstm", "onnx"), ("lstm", "pt2"), ("srupp", "pt2")]
        ),
    ],
)
def test_export_folder_generates_the_checkpoints_greedy_text(kind, fmt, checkpoints, tmp_path, capsys):
    out = tmp_path / "export"
    status, stdout, stderr = run_main(
        command.main, [f"ckpt_path={checkpoints[kind]}", f"format={fmt}", f"out={out}"], capsys
    )
    assert status == 0, stderr
    assert stdout.strip() == str(out) and f"{kind} model of {checkpoints[kind]} (step 7)" in stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert (
        manifest["model_kind"] == kind and manifest["format"] == fmt and manifest["torch_version"] == torch.__version__
    )
    assert [spec["name"] for spec in manifest["inputs"]][0] == "tokens" and manifest["outputs"][0]["shape"] == [
        "batch",
        "length",
        len(ALPHABET),
    ]
    assert sorted(path.name for path in out.iterdir()) == sorted(
        ["manifest.json", "vocabulary.json", manifest["files"]["model"]]
    )
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "staging folders left behind"

    status, expected, _ = run_main(generate.main, [f"ckpt_path={checkpoints[kind]}", *GREEDY], capsys)
    assert status == 0
    backend = "onnxruntime" if fmt == "onnx" else "pt2"
    status, text, stderr = run_main(generate.main, [f"model={out}", f"backend={backend}", *GREEDY], capsys)
    assert status == 0, stderr
    assert text == expected and len(text) == len("The ") + 200 + 1
    assert f"backend={backend}" in stderr and re.search(r"200 tokens in [0-9.]+ s \([0-9]+ tokens/s", stderr)


@pytest.mark.slow  # three exports through the command, over 3 s
def test_existing_export_is_kept_unless_overwrite_and_a_failed_export_leaves_nothing(
    checkpoints, tmp_path, capsys, monkeypatch
):
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
        (["format=tflite", "out=x"], "`format` must be one of onnx, pt2, aoti, hf, got 'tflite'"),
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


@pytest.fixture(scope="module")
def exports(checkpoints, tmp_path_factory) -> dict[str, Path]:
    """A finished export per format the tests below copy and damage: the sru model as ONNX, the
    lstm model as pt2 (loading it needs no compiled kernels)."""
    folder = tmp_path_factory.mktemp("exports")
    made = {}
    for kind, fmt in (("sru", "onnx"), ("lstm", "pt2")):
        made[fmt] = folder / fmt
        assert command.main([f"ckpt_path={checkpoints[kind]}", f"format={fmt}", f"out={made[fmt]}"]) == 0
    return made


def tree(folder: Path) -> dict[str, bytes | None]:
    """Every file (its bytes) and sub-folder (None) under `folder`, by relative path."""
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None) for p in folder.rglob("*")}


def write_foreign_manifest(folder: Path, exports) -> str:
    """The issue's reproduction: a web app whose own manifest.json made it look like an export."""
    (folder / "src").mkdir(parents=True)
    (folder / "manifest.json").write_text('{"name": "app"}\n')
    (folder / "src" / "app.js").write_text("code\n")
    return "its manifest.json is not an export manifest (`format_name` is missing, expected 'sru_lightning-export')"


def write_no_manifest(folder: Path, exports) -> str:
    folder.mkdir()
    (folder / "notes.txt").write_text("mine\n")
    return "it has no manifest.json, so it is not an export"


def write_text_manifest(folder: Path, exports) -> str:
    folder.mkdir()
    (folder / "manifest.json").write_text("name: app\n")
    return "manifest.json' is not JSON"


def write_export_without_owned_files(folder: Path, exports) -> str:
    """An export as written before manifests listed their files: which files are its own is unknown."""
    shutil.copytree(exports["onnx"], folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    del manifest["owned_files"]
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return "its manifest.json does not list the files the export owns (`owned_files` must name manifest.json"


def write_export_from_before_format_name(folder: Path, exports) -> str:
    shutil.copytree(exports["onnx"], folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    del manifest["owned_files"], manifest["format_name"]
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return "it is an export made before manifests named their format and listed their files"


@pytest.mark.parametrize(
    "make",
    [
        write_foreign_manifest,
        write_no_manifest,
        write_text_manifest,
        write_export_without_owned_files,
        write_export_from_before_format_name,
    ],
)
def test_overwrite_refuses_a_folder_that_is_not_our_export_and_deletes_nothing(
    make, checkpoints, exports, tmp_path, capsys
):
    out = tmp_path / "webapp"
    reason = make(out, exports)
    before = tree(out)
    status, stdout, stderr = run_main(
        command.main, [f"ckpt_path={checkpoints['sru']}", f"out={out}", "overwrite=true"], capsys
    )
    assert status == 2 and stdout == "" and stderr.count("\n") == 1, stderr
    assert stderr.startswith(f"{command.PROG}: error: `out` {str(out)!r} cannot be replaced: ") and reason in stderr
    assert tree(out) == before
    assert [p.name for p in tmp_path.iterdir()] == ["webapp"]  # no staging folder left either


@pytest.mark.parametrize("foreign", ["NOTES.txt", ".env", "data/"])
def test_overwrite_refuses_an_export_holding_a_file_it_does_not_own(foreign, checkpoints, exports, tmp_path, capsys):
    out = Path(shutil.copytree(exports["onnx"], tmp_path / "export"))
    if foreign.endswith("/"):
        (out / foreign).mkdir()
        (out / foreign / "table.csv").write_text("1,2\n")
        named = f"it holds the folder {foreign!r}, which is not part of the export"
    else:
        (out / foreign).write_text("mine\n")
        named = f"it holds {foreign!r}, which its manifest.json does not list as part of the export"
    before = tree(out)
    status, stdout, stderr = run_main(
        command.main, [f"ckpt_path={checkpoints['sru']}", f"out={out}", "overwrite=true"], capsys
    )
    assert status == 2 and stdout == "" and stderr.count("\n") == 1, stderr
    assert f"`out` {str(out)!r} cannot be replaced: {named}" in stderr
    assert tree(out) == before


def test_overwrite_replaces_an_export_that_holds_only_its_own_files(checkpoints, exports, tmp_path, capsys):
    out = Path(shutil.copytree(exports["pt2"], tmp_path / "export"))  # pt2 -> onnx: the old model file goes
    status, stdout, stderr = run_main(
        command.main, [f"ckpt_path={checkpoints['sru']}", "format=onnx", f"out={out}", "overwrite=true"], capsys
    )
    assert status == 0, stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["format_name"] == "sru_lightning-export" and manifest["export_format_version"] == 1
    assert (
        manifest["owned_files"]
        == sorted(p.name for p in out.iterdir())
        == ["manifest.json", "model.onnx", "vocabulary.json"]
    )
    assert [p.name for p in tmp_path.iterdir()] == ["export"]  # the replaced folder is gone, nothing hidden left


def test_a_file_put_into_the_export_while_it_is_replaced_stops_the_swap(
    checkpoints, exports, tmp_path, capsys, monkeypatch
):
    from sru_lightning.export import exporter

    out = Path(shutil.copytree(exports["onnx"], tmp_path / "export"))
    before = tree(out)
    save = exporter._SAVERS["onnx"]

    def save_while_the_user_writes(wrapped, path):
        save(wrapped, path)
        (out / "notes.txt").write_text("written during the export\n")

    monkeypatch.setitem(exporter._SAVERS, "onnx", save_while_the_user_writes)
    status, _, stderr = run_main(
        command.main, [f"ckpt_path={checkpoints['sru']}", f"out={out}", "overwrite=true"], capsys
    )
    assert status == 2 and "it holds 'notes.txt', which its manifest.json does not list" in stderr
    assert tree(out) == {**before, "notes.txt": b"written during the export\n"}
    assert [p.name for p in tmp_path.iterdir()] == ["export"]


def test_of_a_replaced_export_only_the_files_its_manifest_owns_are_deleted(tmp_path):
    """The last guard, for a file that appears after the check just before the swap."""
    from sru_lightning.export import ExportError
    from sru_lightning.export.package import _remove_owned

    replaced = tmp_path / "replaced"
    replaced.mkdir()
    for name in ("manifest.json", "model.onnx", "late.txt"):
        (replaced / name).write_text(name)
    with pytest.raises(ExportError, match=r"files appeared in the folder it replaced during the export; they were"):
        _remove_owned(replaced, ["manifest.json", "model.onnx", "vocabulary.json"], tmp_path / "export")
    assert tree(replaced) == {"late.txt": b"late.txt"}
    (replaced / "late.txt").unlink()
    _remove_owned(replaced, [], tmp_path / "export")  # emptied: the folder goes too
    assert not replaced.exists()


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def write_other_onnx(path: Path) -> None:
    """A valid ONNX model that is not the export's: y = x."""
    import onnx
    from onnx import TensorProto, helper

    x, y = (helper.make_tensor_value_info(name, TensorProto.FLOAT, [1]) for name in ("x", "y"))
    onnx.save(
        helper.make_model(helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "other", [x], [y])), str(path)
    )


@pytest.mark.parametrize(
    "fmt,damage,message",
    [
        ("onnx", lambda out: truncate(out / "model.onnx"), "model.onnx': it is not an ONNX model that this runtime"),
        ("pt2", lambda out: truncate(out / "model.pt2"), "model.pt2': it is not a torch.export program that this"),
        (
            "onnx",
            lambda out: (out / "vocabulary.json").write_text("[]"),
            "vocabulary.json' is damaged: expected a JSON object with `level` and `itos`, got a list",
        ),
        ("onnx", lambda out: (out / "vocabulary.json").write_bytes(b"\x00\xffgarbage"), "vocabulary.json' is not JSON"),
        (
            "onnx",
            lambda out: (out / "vocabulary.json").write_text('{"level": "char", "itos": [1, 2]}'),
            "`itos` must be a non-empty list of strings",
        ),
        ("onnx", lambda out: (out / "manifest.json").write_text("{format: onnx"), "manifest.json' is not JSON"),
        (
            "onnx",
            lambda out: (out / "manifest.json").write_text('{"name": "app"}'),
            "is not an export folder: its manifest.json was not written by `python -m sru_lightning export`",
        ),
        (
            "onnx",
            lambda out: write_other_onnx(out / "model.onnx"),
            "model.onnx' is not the model of this export: its inputs are ['x']",
        ),
    ],
    ids=[
        "truncated-onnx",
        "truncated-pt2",
        "vocabulary-list",
        "vocabulary-garbage",
        "vocabulary-int-tokens",
        "manifest-not-json",
        "foreign-manifest",
        "foreign-onnx",
    ],
)
def test_a_damaged_or_foreign_file_in_an_export_gets_one_line_naming_it(
    fmt, damage, message, exports, tmp_path, capfd, caplog
):
    out = Path(shutil.copytree(exports[fmt], tmp_path / "export"))
    damage(out)
    # capfd: what onnxruntime's C++ prints counts too; caplog: what torch logs (the traceback of
    # a .pt2 it cannot read), which the command line would print and pytest keeps apart
    status, stdout, stderr = run_main(generate.main, [f"model={out}", *GREEDY], capfd)
    assert status == 2 and stdout == "", stderr
    assert stderr.count("\n") == 1 and "Traceback" not in stderr, stderr
    assert [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING] == []
    assert stderr.startswith(f"{generate.PROG}: error: ") and str(out) in stderr and message in stderr


@pytest.mark.parametrize("ckpt_path", ["last", "outputs/2024-01-01/12-00-00"])
def test_generate_refuses_model_and_ckpt_path_together(ckpt_path, exports, capsys):
    status, stdout, stderr = run_main(generate.main, [f"model={exports['onnx']}", f"ckpt_path={ckpt_path}"], capsys)
    assert status == 2 and stdout == "" and stderr.count("\n") == 1
    assert (
        f"`model` ({str(exports['onnx'])!r}, an export folder) and `ckpt_path` ({ckpt_path!r}) both name the "
        "model to generate with; give only one of them"
    ) in stderr


def test_an_export_folder_given_as_ckpt_path_is_named_with_the_setting_that_reads_it(exports, tmp_path, capsys):
    status, stdout, stderr = run_main(generate.main, [f"ckpt_path={exports['onnx']}"], capsys)
    assert status == 2 and stdout == "" and stderr.count("\n") == 1
    assert (
        "an export folder (manifest.json), not a run: it holds no checkpoint; generate with it through "
        f"model={exports['onnx']}"
    ) in stderr
    status, _, stderr = run_main(generate.main, [f"model={exports['onnx']}", "length=3"], capsys)
    assert status == 0, stderr
    # a folder whose manifest.json is another program's is not taken for an export
    write_foreign_manifest(tmp_path / "app", exports)
    status, _, stderr = run_main(generate.main, [f"ckpt_path={tmp_path / 'app'}"], capsys)
    assert status == 2 and "holds no readable checkpoint" in stderr and "export folder" not in stderr


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
def test_a_pt2_export_loads_in_a_fresh_process_with_one_line_or_names_the_missing_kernels(
    checkpoints, tmp_path, capsys
):
    out = tmp_path / "export"
    assert run_main(command.main, [f"ckpt_path={checkpoints['sru']}", "format=pt2", f"out={out}"], capsys)[0] == 0
    root = str(Path(cli.__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": root}

    def load(**extra):
        return preloaded.run(
            [sys.executable, "-c", LOAD_PT2, str(out / "model.pt2")],
            env={**env, **extra},
            capture_output=True,
            text=True,
            timeout=300,
        )

    loaded = load()
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    assert loaded.stdout.strip() == f"(2, 3, {len(ALPHABET)})"
    missing = load(SRU_LIGHTNING_EXTENSION="0")
    assert missing.returncode == 3
    assert "needs sru_lightning's compiled recurrence kernels" in missing.stdout
    assert "install a C++ compiler (set CXX) and run `python -m sru_lightning build`" in missing.stdout
    generated = preloaded.run(
        [sys.executable, "-m", "sru_lightning", "generate", f"model={out}"],
        env={**env, "SRU_LIGHTNING_EXTENSION": "0"},
        capture_output=True,
        text=True,
        timeout=300,
    )
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
