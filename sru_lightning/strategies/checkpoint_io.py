"""Checkpoint files that are complete or absent, and a write failure that names its file.

Lightning's `TorchCheckpointIO` writes through an fsspec transaction whose temporary file lies
in the system's temporary folder: committing it to a full disk copies it across file systems
and can leave a truncated file under the checkpoint's real name (a best or `last.ckpt` that
looks resumable). :class:`AtomicCheckpointIO` writes beside the target (`<name>.partial`),
syncs it, and renames it into place (:func:`sru_lightning._atomic.write_bytes`); on any failure
the partial file is removed and :class:`CheckpointWriteError` says which file could not be
written and why.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from typing_extensions import override

from sru_lightning._atomic import write_bytes

__all__ = ["AtomicCheckpointIO", "CheckpointWriteError"]


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (a full disk, no permission); its message names the file."""

    def __init__(self, path: str | os.PathLike[str], cause: OSError) -> None:
        reason = cause.strerror or str(cause)
        super().__init__(cause.errno, f"cannot write the checkpoint {str(path)!r}: {reason}")
        self.path = str(path)

    def __str__(self) -> str:
        return self.strerror or super().__str__()


class AtomicCheckpointIO(TorchCheckpointIO):
    """`TorchCheckpointIO` whose local files appear whole or not at all (see the module docstring).
    Remote paths (`s3://`, ...) are left to Lightning's own writer."""

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        if storage_options is not None or "://" in str(path):
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        target = Path(path)
        # Serialised in memory first (as Lightning does): torch's file writer reports a full disk
        # as a RuntimeError about stream positions; a plain write reports the OSError itself.
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            write_bytes(target, buffer.getbuffer(), durable=True)
        except OSError as error:
            raise CheckpointWriteError(target, error) from error
