"""Which run a checkpoint belongs to: one run per run directory.

A run is born with an identity, a random id that every checkpoint it writes carries (under
:data:`~.checkpoints.RUN_ID_KEY`, written by :class:`~.save_run_config.SaveRunConfig`) and that a resume
takes over from the checkpoint it starts from. A moved or copied run directory, and a
checkpoint copied out of one, keep it; two runs never share it.

A fit writes only into a directory that holds no checkpoint yet or holds checkpoints of the
run it continues (:func:`why_another_run`): a resume of another run's checkpoint into a
directory that holds a run would mix two runs' checkpoints, records and configs, and overwrite
the other run's `last.ckpt`.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from .checkpoints import LoadedCheckpoint
from .folder import RunFolder, checkpoint_candidates


def new_run_id() -> str:
    """The identity of a run that starts now."""
    return uuid.uuid4().hex


def run_id_to_continue(checkpoint: LoadedCheckpoint | None) -> str:
    """The identity of the run an attempt writes: the one of the checkpoint it resumes, else a new one."""
    return (checkpoint.run_id if checkpoint is not None else None) or new_run_id()


def why_another_run(checkpoint: LoadedCheckpoint, directory: str | Path) -> str | None:
    """None when a fit resuming `checkpoint` may write into the run directory `directory` (it holds
    no checkpoint, or those of the checkpoint's own run, moved or copied); else what it holds."""
    checkpoints = Path(directory).absolute() / RunFolder.CHECKPOINTS_DIR
    held = list(checkpoint_candidates(checkpoints))
    if not held:
        return None
    if Path(checkpoint.path).resolve().parent == checkpoints.resolve():
        return None  # the run's own checkpoint
    own = checkpoint.run_id
    if own is not None and own in {saved.run_id for saved in RunFolder(directory).checkpoints}:
        return None
    return ", ".join(path.name for path in held[:3])
