"""Files and folders that are whole under their name or absent: written beside, then renamed.

Every file the package writes for a later reader (checkpoints, their index, run records,
exports, pretrained folders, a lost sweep job's result) goes through here, so the rule is
written once: the content goes to a path beside the target (same folder, so same file
system), and only when it is complete is it renamed over the target, which the operating
system does in one step. A failure on the way removes what was written and leaves the target
as it was. Imports nothing of the package (it sits below every layer).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["PARTIAL_SUFFIX", "discard", "put_in_place", "write_bytes", "write_text", "written_beside"]

#: What a path being written is called until it is complete: ``<name>.partial``.
PARTIAL_SUFFIX = ".partial"


def discard(path: str | os.PathLike[str]) -> None:
    """Remove a partly written file or folder, if there is one."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def put_in_place(
    written: str | os.PathLike[str],
    target: str | os.PathLike[str],
    *,
    dispose: Callable[[Path], None] | None = None,
) -> None:
    """Rename `written` (a complete file or folder) to `target`, so that a reader of `target`
    finds the old one or the new one, never part of either.

    A file in the way is replaced by the rename itself. A folder cannot be renamed over, so a
    folder in the way is first moved aside into a hidden folder beside it
    (``.<name>.replaced-<random>/<name>``) and deleted once the new one is in place: by
    ``dispose(moved)`` when given (a caller that deletes only what it owns there), else whole.
    A crash between the renames leaves the old one aside, never neither; a failed second rename
    moves it back."""
    written, target = Path(written), Path(target)
    if not (target.is_dir() and not target.is_symlink()):
        if written.is_dir() and target.exists():
            target.unlink()  # a file where a folder goes: the rename cannot put a folder over it
        os.replace(written, target)
        return
    aside_folder = Path(tempfile.mkdtemp(prefix=f".{target.name}.replaced-", dir=target.parent))
    aside = aside_folder / target.name
    os.replace(target, aside)
    try:
        os.replace(written, target)
    except BaseException:
        os.replace(aside, target)
        aside_folder.rmdir()
        raise
    if dispose is None:
        shutil.rmtree(aside_folder, ignore_errors=True)
        return
    dispose(aside)
    aside_folder.rmdir()


@contextmanager
def written_beside(target: str | os.PathLike[str], *, suffix: str = PARTIAL_SUFFIX) -> Iterator[Path]:
    """The path ``<target><suffix>`` for the block to write (a file or a folder); when the block
    ends it is put in place (:func:`put_in_place`), and when the block raises it is removed and
    `target` is left as it was."""
    target = Path(target)
    partial = target.with_name(target.name + suffix)
    try:
        yield partial
        put_in_place(partial, target)
    except BaseException:
        discard(partial)
        raise


def write_bytes(target: str | os.PathLike[str], data: bytes | memoryview, *, durable: bool = False) -> Path:
    """Write `data` as the file `target`, whole or not at all. `durable` syncs it to the disk
    before the rename, so that a power cut after it cannot leave an empty file under the name
    (checkpoints ask for it; files that are cheap to write again do not)."""
    target = Path(target)
    with written_beside(target) as partial:
        with open(partial, "wb") as handle:
            handle.write(data)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
    return target


def write_text(target: str | os.PathLike[str], text: str, *, durable: bool = False) -> Path:
    """Write `text` (UTF-8) as the file `target`, whole or not at all (see :func:`write_bytes`)."""
    return write_bytes(target, text.encode("utf-8"), durable=durable)
