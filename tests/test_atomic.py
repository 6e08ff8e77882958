"""The package's one way of writing a file or folder for a later reader: beside its name, then
renamed, so a reader finds the old one or the new one whole, and a failure leaves no part."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from sru_lightning import _atomic
from sru_lightning._atomic import discard, put_in_place, write_bytes, write_text, written_beside

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "sru_lightning"


def tree(folder: Path) -> dict[str, bytes]:
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


def test_a_file_is_written_and_replaced_whole_and_nothing_is_left_beside_it(tmp_path):
    target = tmp_path / "record.json"
    write_text(target, "first")
    write_text(target, "second, longer")
    assert tree(tmp_path) == {"record.json": b"second, longer"}


def test_a_failure_while_writing_leaves_the_old_file_and_no_part(tmp_path):
    target = tmp_path / "index.json"
    target.write_text("old")
    with pytest.raises(RuntimeError, match="disk gone"), written_beside(target) as partial:
        partial.write_text("half")
        raise RuntimeError("disk gone")
    assert tree(tmp_path) == {"index.json": b"old"}


def test_a_durable_write_is_synced_before_the_rename(tmp_path, monkeypatch):
    events = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda a, b: (events.append("replace"), real_replace(a, b))[1])
    write_bytes(tmp_path / "a.ckpt", b"weights", durable=True)
    write_bytes(tmp_path / "b.json", b"{}")
    assert events == ["fsync", "replace", "replace"]


def test_a_folder_replaces_a_folder_and_the_old_one_goes(tmp_path):
    target, written = tmp_path / "last.ckpt", tmp_path / "last.ckpt.partial"
    (target / "old").mkdir(parents=True)
    (target / "old" / "shard").write_text("old")
    written.mkdir()
    (written / "shard").write_text("new")
    put_in_place(written, target)
    assert tree(tmp_path) == {"last.ckpt/shard": b"new"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]  # nothing hidden left


def test_a_folder_takes_the_place_of_a_file_and_a_file_of_a_file(tmp_path):
    (tmp_path / "a.ckpt").write_text("a file")
    (tmp_path / "a.ckpt.partial").mkdir()
    (tmp_path / "a.ckpt.partial" / "shard").write_text("new")
    put_in_place(tmp_path / "a.ckpt.partial", tmp_path / "a.ckpt")
    (tmp_path / "b.partial").write_text("b")
    put_in_place(tmp_path / "b.partial", tmp_path / "b")
    assert tree(tmp_path) == {"a.ckpt/shard": b"new", "b": b"b"}


def test_the_replaced_folder_is_handed_to_dispose_and_what_it_keeps_stays_aside(tmp_path):
    target, written = tmp_path / "export", tmp_path / "staging"
    target.mkdir()
    (target / "model.onnx").write_text("old")
    (target / "late.txt").write_text("a user's")
    written.mkdir()
    (written / "model.onnx").write_text("new")
    handed = []

    def dispose(old: Path) -> None:
        handed.append(tree(old))
        (old / "model.onnx").unlink()
        raise ValueError(f"kept {old}")

    with pytest.raises(ValueError, match=r"kept .*\.export\.replaced-.*/export$"):
        put_in_place(written, target, dispose=dispose)
    assert handed == [{"late.txt": b"a user's", "model.onnx": b"old"}]
    assert tree(target) == {"model.onnx": b"new"}
    aside = [path for path in tmp_path.iterdir() if path.name.startswith(".export.replaced-")]
    assert len(aside) == 1 and tree(aside[0]) == {"export/late.txt": b"a user's"}


def test_when_the_new_folder_cannot_be_renamed_the_old_one_is_put_back(tmp_path, monkeypatch):
    target, written = tmp_path / "ckpt", tmp_path / "ckpt.partial"
    target.mkdir()
    (target / "shard").write_text("old")
    written.mkdir()
    real_replace = os.replace

    def failing_replace(source, destination):
        if Path(source) == written:
            raise OSError(5, "Input/output error")
        real_replace(source, destination)

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="Input/output error"):
        put_in_place(written, target)
    assert tree(target) == {"shard": b"old"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "ckpt.partial"]


def test_discard_removes_a_file_a_folder_or_nothing(tmp_path):
    (tmp_path / "f.partial").write_text("x")
    (tmp_path / "d.partial").mkdir()
    (tmp_path / "d.partial" / "shard").write_text("x")
    for name in ("f.partial", "d.partial", "absent.partial"):
        discard(tmp_path / name)
    assert list(tmp_path.iterdir()) == []


def _renames(path: Path) -> list[str]:
    """The calls in `path` that rename onto a name: ``os.replace`` / ``os.rename``, and
    ``Path.replace`` / ``Path.rename`` (one argument; ``str.replace`` takes two)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr not in ("replace", "rename"):
            continue
        on_os = isinstance(node.func.value, ast.Name) and node.func.value.id == "os"
        if on_os or (len(node.args) == 1 and not node.keywords):
            found.append(f"{path.relative_to(PACKAGE_DIR)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_package_renames_onto_a_name_only_here():
    """One definition of the rule: every other module writes through this one. The kernel build
    cache renames a finished build only onto a free name (a rename that must fail when another
    process got there first), which is not a replacement."""
    found = [
        call
        for path in sorted(PACKAGE_DIR.rglob("*.py"))
        if path.name != Path(_atomic.__file__).name
        for call in _renames(path)
        if not call.startswith("ops/build_cache.py:")
    ]
    assert found == []
    assert any(call.startswith("ops/build_cache.py:") for call in _renames(PACKAGE_DIR / "ops" / "build_cache.py"))
