"""A run's index of its checkpoints, so that finding the one to use reads none of them.

As a fit saves each checkpoint into its run's `checkpoints/`, :class:`IndexedCheckpointIO`
notes it in `checkpoints.json` beside that folder: per file name, the step the file holds,
the identity, owner and configuration of the run saved in it, and the file's size and time
written. :class:`~.folder.RunFolder` orders a run's checkpoints, and `ckpt_path=last` picks a
run, from these entries; only the checkpoint a command then uses is read.

An entry counts only while its file has the size and time recorded, so the index never
outvotes a file: a checkpoint deleted by hand has no entry that counts, one replaced or added
by hand (or copied without its times) is read as before, and a run moved or copied with its
times (`mv`, `cp -a`, `rsync -a`, Python's `shutil.copytree`) keeps its index. DeepSpeed
folders are not indexed (the strategy writes them itself); their state file holds no weights.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from typing_extensions import override

from sru_lightning._atomic import PARTIAL_SUFFIX, write_text
from sru_lightning.strategies import AtomicCheckpointIO

from .checkpoints import RUN_CONFIG_KEY, RUN_ID_KEY, RUN_OWNER_KEY

log = logging.getLogger("sru_lightning")

__all__ = ["IndexedCheckpointIO", "indexed_entry", "read_index"]

INDEX_VERSION = 1


def read_index(index: Path) -> dict[str, dict[str, Any]]:
    """The entries of the index file `index` (:attr:`.folder.RunFolder.index_file`), by file name;
    empty when there is none, or one this sru_lightning cannot read (its checkpoints are then read
    instead)."""
    try:
        index = json.loads(Path(index).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(index, Mapping) or index.get("format_version") != INDEX_VERSION:
        return {}
    entries = index.get("checkpoints")
    if not isinstance(entries, Mapping):
        return {}
    return {str(name): dict(entry) for name, entry in entries.items() if isinstance(entry, Mapping)}


def indexed_entry(path: Path, entries: Mapping[str, Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The entry of the checkpoint file `path`, if it has one that still describes the file."""
    entry = entries.get(path.name)
    if entry is None or not path.is_file():
        return None
    stat = path.stat()
    step = entry.get("step")
    if entry.get("size") != stat.st_size or entry.get("mtime_ns") != stat.st_mtime_ns:
        return None
    if isinstance(step, bool) or not isinstance(step, int):
        return None
    return entry


def _record(index: Path, path: Path, checkpoint: Mapping[str, Any]) -> None:
    checkpoints = path.parent
    # A checkpoint written under `<name>.partial`, then renamed: the time and size stay.
    name = path.name.removesuffix(PARTIAL_SUFFIX)
    stat = path.stat()
    entries = {
        kept: entry for kept, entry in read_index(index).items() if kept != name and (checkpoints / kept).exists()
    }
    owner, config = checkpoint.get(RUN_OWNER_KEY), checkpoint.get(RUN_CONFIG_KEY)
    entries[name] = {
        "step": int(checkpoint.get("global_step", 0) or 0),
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "run_id": checkpoint.get(RUN_ID_KEY),
        "owner": dict(owner) if isinstance(owner, Mapping) else None,
        "config": dict(config) if isinstance(config, Mapping) else None,
    }
    _write(index, entries)


def _forget(index: Path, path: Path) -> None:
    entries = read_index(index)
    if path.name in entries:
        del entries[path.name]
        _write(index, entries)


def _write(target: Path, entries: Mapping[str, Any]) -> None:
    # A reader never sees half an index.
    write_text(target, json.dumps({"format_version": INDEX_VERSION, "checkpoints": entries}, default=str, indent=1))


class IndexedCheckpointIO(AtomicCheckpointIO):
    """:class:`~sru_lightning.strategies.AtomicCheckpointIO` that notes every checkpoint it
    writes into a run's `checkpoints/` folder in the run's index (see the module docstring).
    A failure to write the index costs only time: readers then read the checkpoints.

    `index_of` says which index a checkpoint path is noted in, None for a path outside a run's
    checkpoints folder (:meth:`.folder.RunFolder.index_of`).
    """

    def __init__(self, index_of: Callable[[Path], Path | None]) -> None:
        super().__init__()
        self.index_of = index_of

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        super().save_checkpoint(checkpoint, path, storage_options)
        if storage_options is None and "://" not in str(path):
            index = self.index_of(Path(path))
            try:
                if index is not None:
                    _record(index, Path(path), checkpoint)
            except OSError as error:
                log.warning("could not note %s in the run's checkpoint index: %s", path, error)

    @override
    def remove_checkpoint(self, path: Any) -> None:
        super().remove_checkpoint(path)
        if "://" not in str(path):
            index = self.index_of(Path(path))
            try:
                if index is not None:
                    _forget(index, Path(path))
            except OSError as error:
                log.warning("could not remove %s from the run's checkpoint index: %s", path, error)
