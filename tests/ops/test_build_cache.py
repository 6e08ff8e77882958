"""The build cache's contract on a tiny library: compile once per key, never trust or block on
what a dead build left, say at once when waiting on another process's build."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sru_lightning.ops import build_cache
from sru_lightning.ops.build_cache import BuildSpec


def spec(source_text: str = "int answer(void) { return 42; }") -> BuildSpec:
    return BuildSpec("cpu", "test library", {"source": source_text}, "a moment")


class Compiler:
    """Writes the library file the way a real build does, and counts the builds."""

    def __init__(self, fail: bool = False):
        self.calls: list[Path] = []
        self.fail = fail

    def __call__(self, folder: Path, name: str) -> None:
        self.calls.append(folder)
        (folder / "lock").write_text("")  # torch's own baton, private to this folder
        if self.fail:
            raise RuntimeError("compiler exploded")
        build_cache.library_file(folder, name).write_bytes(b"\x7fELF fake")


def test_compiles_once_then_reads_the_cache(tmp_path):
    messages, compiler = [], Compiler()
    library, compiled = build_cache.ensure_built(spec(), compiler, tmp_path, messages.append)
    assert compiled and library.is_file() and len(compiler.calls) == 1
    assert library.parent == spec().directory(tmp_path)
    announcement, finished = messages
    assert f"compiling the test library into {library.parent}" in announcement and "a moment" in announcement
    assert finished.startswith("sru_lightning: compiled the test library in ") and finished.endswith(" s")
    manifest = json.loads((library.parent / build_cache.MANIFEST).read_text())
    assert manifest["name"] == spec().name and manifest["source"] == spec().key["source"]

    messages.clear()
    again, compiled = build_cache.ensure_built(spec(), compiler, tmp_path, messages.append)
    assert again == library and not compiled and len(compiler.calls) == 1 and messages == []


def test_a_long_build_says_how_far_it_is(tmp_path, monkeypatch):
    monkeypatch.setattr(build_cache, "PROGRESS_AFTER_S", 0.0)
    monkeypatch.setattr(build_cache, "PROGRESS_EVERY_S", 0.0)
    monkeypatch.setattr(build_cache, "PROGRESS_LOOK_S", 0.05)

    def compile_two_files(folder: Path, name: str) -> None:
        (folder / "first.o").write_bytes(b"")
        time.sleep(0.3)  # the progress line looks every 0.05 s here
        build_cache.library_file(folder, name).write_bytes(b"\x7fELF fake")

    messages = []
    build_spec = BuildSpec("cpu", "test library", {"source": "two files"}, "a moment", units=2)
    build_cache.ensure_built(build_spec, compile_two_files, tmp_path, messages.append)
    progress = [message for message in messages if "files," in message]
    assert progress and all(line.startswith("sru_lightning: compiled 1 of 2 files, ") for line in progress)


def test_a_different_key_gets_its_own_folder_and_module_name(tmp_path):
    first, second = spec(), spec("int answer(void) { return 43; }")
    assert first.name != second.name and first.name.startswith("sru_lightning_cpu_")
    compiler = Compiler()
    build_cache.ensure_built(first, compiler, tmp_path, lambda _: None)
    build_cache.ensure_built(second, compiler, tmp_path, lambda _: None)
    assert len(compiler.calls) == 2
    assert {p.name for p in tmp_path.iterdir() if p.is_dir()} == {first.name, second.name}


def test_leftovers_of_a_killed_build_are_cleared_not_trusted(tmp_path):
    # What a build killed mid-compile leaves: its private folder (with torch's baton lock) and
    # a final folder without a manifest (e.g. from an older layout).
    name = spec().name
    dead = tmp_path / f"{name}.partial-999999"
    dead.mkdir()
    (dead / "lock").write_text("")
    (tmp_path / name).mkdir()
    (tmp_path / name / "half-written.o").write_bytes(b"")
    compiler = Compiler()
    library, compiled = build_cache.ensure_built(spec(), compiler, tmp_path, lambda _: None)
    assert compiled and library.is_file() and not dead.exists()
    assert not (library.parent / "half-written.o").exists()


def test_a_failed_build_leaves_nothing_and_the_next_call_builds_again(tmp_path):
    with pytest.raises(RuntimeError, match="compiler exploded"):
        build_cache.ensure_built(spec(), Compiler(fail=True), tmp_path, lambda _: None)
    assert [p.name for p in tmp_path.iterdir() if p.is_dir()] == []
    _, compiled = build_cache.ensure_built(spec(), Compiler(), tmp_path, lambda _: None)
    assert compiled


_HOLD_LOCK = """
import fcntl, sys, time
handle = open(sys.argv[1], "a+b")
fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(float(sys.argv[2]))
"""


@pytest.mark.skipif(build_cache.fcntl is None, reason="flock needs a POSIX system")
@pytest.mark.slow  # a process holds the build lock for 3 s
def test_waiting_on_another_build_says_so_at_once_naming_the_folder(tmp_path):
    lock = tmp_path / f"{spec().name}.lock"
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_LOCK, str(lock), "3"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        messages: list[tuple[float, str]] = []
        started = time.monotonic()
        _, compiled = build_cache.ensure_built(
            spec(), Compiler(), tmp_path, lambda text: messages.append((time.monotonic() - started, text))
        )
    finally:
        holder.kill()
        holder.wait()
    assert compiled
    waited_at, waiting = messages[0]
    assert waited_at < 2.0
    assert f"waiting for another process building the recurrence kernels in {spec().directory(tmp_path)}" in waiting
    assert "compiling" in messages[-2][1] and "compiled the test library in" in messages[-1][1]


@pytest.mark.skipif(build_cache.fcntl is None, reason="flock needs a POSIX system")
def test_a_lock_holder_killed_with_sigkill_frees_the_lock(tmp_path):
    lock = tmp_path / f"{spec().name}.lock"
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_LOCK, str(lock), "600"], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    holder.kill()  # SIGKILL: no cleanup code runs, the lock file stays
    holder.wait()
    assert lock.exists()
    started = time.monotonic()
    _, compiled = build_cache.ensure_built(spec(), Compiler(), tmp_path, lambda _: None)
    assert compiled and time.monotonic() - started < 5.0


def test_cache_root_follows_torch_extensions_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    assert build_cache.cache_root() == tmp_path
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR")
    from torch.utils.cpp_extension import get_default_build_root

    assert build_cache.cache_root() == Path(get_default_build_root())
    assert os.fspath(spec().directory()).startswith(get_default_build_root())


def test_without_a_lock_a_build_finished_first_elsewhere_wins(tmp_path, monkeypatch):
    # Windows has no flock: two processes may compile at once; the second rename finds the
    # first one's finished folder and uses it.
    monkeypatch.setattr(build_cache, "fcntl", None)

    def compile_while_another_process_finishes(folder: Path, name: str) -> None:
        Compiler()(folder, name)
        other = spec().directory(tmp_path)
        other.mkdir()
        build_cache.library_file(other, name).write_bytes(b"\x7fELF other")
        (other / build_cache.MANIFEST).write_text(json.dumps({"name": name}))

    library, _ = build_cache.ensure_built(spec(), compile_while_another_process_finishes, tmp_path, lambda _: None)
    assert library.read_bytes() == b"\x7fELF other"
    assert not list(tmp_path.glob("*.partial-*"))
