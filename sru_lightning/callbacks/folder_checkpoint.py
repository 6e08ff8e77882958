"""Lightning's ``ModelCheckpoint`` whose record of the best checkpoints follows its folder.

A checkpoint holds ``ModelCheckpoint``'s record: the folder it writes to, the best ``k``
checkpoints with their scores, the last one. Lightning restores that record only when the
folder is unchanged; a run folder moved or copied elsewhere and resumed there starts a new
record, so the best checkpoint saved before the move is no longer compared with (a worse
epoch becomes "best"), is never removed (two "best" files under ``save_top_k=1``), and
``best_model_path`` names a file in the old place (gone after a move; another run's after a
copy). :class:`FolderModelCheckpoint` restores the record into the new folder when every
checkpoint it names is there under the same name: the folder is the same run's, moved or
copied. A checkpoint of another run, resumed into a folder that does not hold its files,
starts a new record, as in Lightning, and nothing in the other folder is touched.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from lightning.pytorch.callbacks import ModelCheckpoint
from typing_extensions import override

log = logging.getLogger(__name__)

__all__ = ["FolderModelCheckpoint"]

_PATH_KEYS = ("best_model_path", "kth_best_model_path", "last_model_path")


class FolderModelCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` (same arguments) that keeps its record of the best checkpoints when
    the run folder was moved or copied since they were saved; see the module docstring. Its
    record is saved under Lightning's ``ModelCheckpoint`` key, so a checkpoint written with
    either class resumes with the other."""

    @property
    @override
    def state_key(self) -> str:
        # Lightning's key is the class name followed by the settings that tell instances apart.
        key = super().state_key
        own = type(self).__qualname__
        return ModelCheckpoint.__qualname__ + key[len(own) :] if key.startswith(own) else key

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        saved_in = state_dict.get("dirpath")
        if self.dirpath is not None and saved_in is not None and not _same_folder(saved_in, self.dirpath):
            moved = _into_folder(state_dict, saved_in, self.dirpath)
            if moved is not None:
                log.info(
                    "The checkpoint record of %s continues in %s (the run folder was moved or copied)",
                    saved_in,
                    self.dirpath,
                )
                state_dict = moved
        super().load_state_dict(state_dict)


def _same_folder(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    return os.path.normpath(os.path.abspath(a)) == os.path.normpath(os.path.abspath(b))


def _into_folder(state: dict[str, Any], old: str, new: str | os.PathLike[str]) -> dict[str, Any] | None:
    """`state` with the paths under `old` moved under `new`, or None when a checkpoint it names
    is not in `new` under the same name (or lies outside `old`): then it is another run's."""

    def moved(path: str) -> str | None:
        if not path:
            return path
        if not _same_folder(os.path.dirname(path), old):
            return None
        target = os.path.join(os.fspath(new), os.path.basename(path))
        return target if os.path.exists(target) else None

    best_k = {}
    for path, score in state.get("best_k_models", {}).items():
        target = moved(path)
        if target is None:
            return None
        best_k[target] = score
    paths = {}
    for key in _PATH_KEYS:
        if key in state:
            target = moved(state[key])
            if target is None:
                if key == "last_model_path":  # a `last` removed by hand is no reason to drop the record
                    paths[key] = ""
                    continue
                return None
            paths[key] = target
    return {**state, **paths, "best_k_models": best_k, "dirpath": os.fspath(new)}
