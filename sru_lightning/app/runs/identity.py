"""Which run a checkpoint belongs to: one run per run directory.

A run is born with an identity, a random id that every checkpoint it writes carries (under
:data:`~.folder.RUN_ID_KEY`, written by :class:`~.folder.SaveRunConfig`) and that a resume
takes over from the checkpoint it starts from. A moved or copied run directory, and a
checkpoint copied out of one, keep it; two runs never share it.

A fit writes only into a directory that holds no checkpoint yet or holds checkpoints of the
run it continues (:func:`why_another_run`): a resume of another run's checkpoint into a
directory that holds a run would mix two runs' checkpoints, records and configs, and overwrite
the other run's `last.ckpt`. Checkpoints written before the id existed are recognised by the
record of Lightning's ``ModelCheckpoint`` inside them, as
:class:`~sru_lightning.callbacks.FolderModelCheckpoint` does for a moved run: every checkpoint
the record names is in the directory under the same name.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .checkpoints import LoadedCheckpoint
from .folder import CHECKPOINTS_DIR, RunFolder, checkpoint_candidates


def new_run_id() -> str:
    """The identity of a run that starts now."""
    return uuid.uuid4().hex


def run_id_to_continue(checkpoint: LoadedCheckpoint | None) -> str:
    """The identity of the run an attempt writes: the one of the checkpoint it resumes, else a new one."""
    return (checkpoint.run_id if checkpoint is not None else None) or new_run_id()


def why_another_run(checkpoint: LoadedCheckpoint, directory: str | Path) -> str | None:
    """None when a fit resuming `checkpoint` may write into the run directory `directory` (it holds
    no checkpoint, or those of the checkpoint's own run, moved or copied); else what it holds."""
    checkpoints = Path(directory).absolute() / CHECKPOINTS_DIR
    held = list(checkpoint_candidates(checkpoints))
    if not held:
        return None
    if Path(checkpoint.path).resolve().parent == checkpoints.resolve():
        return None  # the run's own checkpoint
    own = checkpoint.run_id
    held_ids = {saved.run_id for saved in RunFolder(directory).checkpoints}
    if own is not None and own in held_ids:
        return None
    if own is None or not held_ids - {None}:
        # A run from before identities: the same run when the folder holds every checkpoint its record names.
        if _record_names_files_in(checkpoint, checkpoints):
            return None
    return ", ".join(path.name for path in held[:3])


def _record_names_files_in(checkpoint: LoadedCheckpoint, folder: Path) -> bool:
    """Whether the ``ModelCheckpoint`` records inside `checkpoint` name checkpoints, every one of
    which is in `folder` under the same name."""
    callbacks = checkpoint.contents.get("callbacks")
    records = [
        state
        for key, state in (callbacks.items() if isinstance(callbacks, Mapping) else ())
        if str(key).startswith("ModelCheckpoint") and isinstance(state, Mapping)
    ]
    named = [name for state in records for name in _named_files(state)]
    return bool(named) and all((folder / name).exists() for name in named)


def _named_files(state: Mapping[str, Any]) -> list[str]:
    paths = [*state.get("best_k_models", {}), state.get("best_model_path"), state.get("last_model_path")]
    return [Path(str(path)).name for path in paths if path]
