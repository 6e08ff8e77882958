"""A build cache keyed by what is built, with locks that a killed build cannot leave behind.

Each library lives in ``<root>/<name>/`` where ``name`` carries a hash of everything that
decides the binary (sources, flags, torch version, Python ABI, variant), so any number of
checkouts and virtualenvs share one cache without rebuilding each other. ``root`` is
``$TORCH_EXTENSIONS_DIR`` or torch's default extensions folder.

A build runs in a private ``<name>.partial-<pid>`` folder and is renamed into place when it is
complete, together with a ``build.json`` manifest: a finished build is loaded without any
lock, and a half-written one is never seen. Builders of one name serialise on an ``flock`` of
``<name>.lock``, which the kernel releases when the holder dies however it dies (Ctrl+C,
SIGKILL, the OOM killer), so a later build never waits on a dead one. A process that has to
wait says so at once on stderr, naming the folder.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: no cross-process lock; builds stay private until renamed.
    fcntl = None

MANIFEST = "build.json"
# A reminder while waiting on another process's build, so a long wait is never silent.
WAIT_REMINDER_S = 60.0
_POLL_S = 0.2
# A build that runs longer than this shows how far it is: the files compiled so far, rewritten
# in place on a terminal, else a new line every PROGRESS_EVERY_S.
PROGRESS_AFTER_S = 5.0
PROGRESS_EVERY_S = 15.0
# How often the progress line looks at the files (twice as often on a terminal).
PROGRESS_LOOK_S = 1.0


def cache_root() -> Path:
    """``$TORCH_EXTENSIONS_DIR``, else torch's default extensions folder."""
    configured = os.environ.get("TORCH_EXTENSIONS_DIR")
    if configured:
        return Path(configured)
    from torch.utils.cpp_extension import get_default_build_root

    return Path(get_default_build_root())


def digest_files(paths) -> str:
    """sha256 over the names and contents of `paths`, in the given order."""
    digest = hashlib.sha256()
    for path in paths:
        path = Path(path)
        digest.update(path.name.encode() + b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()


@dataclass(frozen=True)
class BuildSpec:
    """One library to build: its variant ("cpu", "cuda"), a human description, and the key
    material (every input that changes the binary)."""

    variant: str
    description: str
    key: dict = field(hash=False, compare=False)
    expected_duration: str = "about a minute"
    # How many files the build compiles (0: unknown), for its progress line.
    units: int = field(default=0, hash=False, compare=False)
    # Written to the manifest but not hashed (e.g. which nvcc compiled it).
    notes: dict = field(default_factory=dict, hash=False, compare=False)

    @property
    def digest(self) -> str:
        encoded = json.dumps({"variant": self.variant, **self.key}, sort_keys=True).encode()
        return hashlib.sha256(encoded).hexdigest()

    @property
    def name(self) -> str:
        # Also the extension's module name: unique per key, so a process never mixes two.
        return f"sru_lightning_{self.variant}_{self.digest[:16]}"

    def directory(self, root: Path | None = None) -> Path:
        return (cache_root() if root is None else root) / self.name


def library_file(directory: Path, name: str) -> Path:
    suffix = ".pyd" if sys.platform == "win32" else ".so"
    return directory / f"{name}{suffix}"


def read_manifest(directory: Path) -> dict | None:
    """The manifest of a finished build in `directory`, or None."""
    try:
        return json.loads((directory / MANIFEST).read_text())
    except (OSError, ValueError):
        return None


def finished_builds(root: Path, prefix: str) -> Iterator[tuple[Path, dict]]:
    """(directory, manifest) of every finished build under `root` whose name starts with `prefix`."""
    if not root.is_dir():
        return
    for directory in sorted(root.glob(f"{prefix}*")):
        if directory.is_dir() and not directory.name.split(".")[-1].startswith("partial"):
            manifest = read_manifest(directory)
            if manifest is not None:
                yield directory, manifest


@contextlib.contextmanager
def exclusive_lock(lock_path: Path, waiting_for: Path, say: Callable[[str], None]) -> Iterator[None]:
    """Hold an ``flock`` on `lock_path`; if another process holds it, say so at once (naming
    `waiting_for`) and again every minute until it is free."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    if fcntl is None:
        yield
        return
    # Opened close-on-exec (Python's default): compiler subprocesses never inherit the lock,
    # so it ends with this process.
    with open(lock_path, "a+b") as handle:
        started = time.monotonic()
        next_reminder = 0.0
        while True:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                waited = time.monotonic() - started
                if waited >= next_reminder:
                    more = f" ({waited:.0f} s so far)" if waited else ""
                    say(
                        "sru_lightning: waiting for another process building the recurrence kernels in "
                        f"{waiting_for}{more}"
                    )
                    next_reminder = waited + WAIT_REMINDER_S
                time.sleep(_POLL_S)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@contextlib.contextmanager
def _progress(folder: Path, units: int, say: Callable[[str], None]) -> Iterator[None]:
    """While the body runs and after PROGRESS_AFTER_S, a line with the object files written
    into `folder` (of `units`) and the time so far: rewritten in place when stderr is a
    terminal, else said every PROGRESS_EVERY_S."""
    started = time.monotonic()
    stop = threading.Event()
    terminal = sys.stderr.isatty()
    shown = []

    def watch() -> None:
        next_line = PROGRESS_AFTER_S
        while not stop.wait(PROGRESS_LOOK_S / 2 if terminal else PROGRESS_LOOK_S):
            elapsed = time.monotonic() - started
            if elapsed < next_line:
                continue
            done = len(list(folder.glob("*.o")))
            of = f" of {units}" if units else ""
            line = f"sru_lightning: compiled {done}{of} files, {elapsed:.0f} s"
            if terminal:
                sys.stderr.write(f"\r{line}")
                sys.stderr.flush()
                shown.append(line)
            else:
                say(line)
                next_line = elapsed + PROGRESS_EVERY_S

    watcher = threading.Thread(target=watch, name="sru_lightning build progress", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        stop.set()
        watcher.join()
        if shown:
            sys.stderr.write("\n")
            sys.stderr.flush()


def ensure_built(
    spec: BuildSpec,
    compile_into: Callable[[Path, str], None],
    root: Path | None = None,
    say: Callable[[str], None] = _say,
) -> tuple[Path, bool]:
    """Return (library file, compiled now?) for `spec`, compiling it first when the cache has
    no finished build. `compile_into(folder, name)` must leave ``<folder>/<name>.so``."""
    root = cache_root() if root is None else root
    directory = spec.directory(root)
    library = library_file(directory, spec.name)
    if read_manifest(directory) is not None and library.is_file():
        return library, False
    root.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(root / f"{spec.name}.lock", directory, say):
        if read_manifest(directory) is not None and library.is_file():
            return library, False  # another process finished it while we waited
        # Only the lock holder builds, so anything unfinished is left by a dead process.
        for leftover in [directory, *root.glob(f"{spec.name}.partial-*")]:
            shutil.rmtree(leftover, ignore_errors=True)
        partial = root / f"{spec.name}.partial-{os.getpid()}"
        partial.mkdir()
        say(
            f"sru_lightning: compiling the {spec.description} into {directory} "
            f"(once for these sources, flags, torch and Python; {spec.expected_duration})"
        )
        started = time.monotonic()
        try:
            with _progress(partial, spec.units, say):
                compile_into(partial, spec.name)
            if not library_file(partial, spec.name).is_file():
                raise RuntimeError(f"the build left no {library_file(partial, spec.name).name} in {partial}")
            manifest = {
                "variant": spec.variant,
                "name": spec.name,
                **spec.key,
                **spec.notes,
                "compile_seconds": round(time.monotonic() - started, 1),
            }
            (partial / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
            say(f"sru_lightning: compiled the {spec.description} in {manifest['compile_seconds']:.0f} s")
            try:
                os.rename(partial, directory)
            except OSError:
                # Without flock (Windows) another process may have finished the same build first.
                if read_manifest(directory) is None:
                    raise
                shutil.rmtree(partial, ignore_errors=True)
                return library, True
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
    return library, True
