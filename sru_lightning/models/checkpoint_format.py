"""The format of the checkpoints sru_lightning writes: one version number, and one refusal.

Every checkpoint of the language model (and of a command-line run) carries
:data:`FORMAT_KEY` = :data:`FORMAT_VERSION`. Version 2 keeps the network's weights under
``net.`` and its constructor arguments under the hyperparameters' ``net``;
version 1 had both at the top level. A checkpoint with another version, or none, is refused in
one line when it is read: it was written by an earlier sru_lightning or by another program, and
nothing here reads those formats.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["FORMAT_KEY", "FORMAT_VERSION", "CheckpointFormatError", "check_format", "stamp_format"]

#: The key of a checkpoint that holds its format version.
FORMAT_KEY = "sru_lightning_format"
#: The version this sru_lightning writes and reads.
FORMAT_VERSION = 2


class CheckpointFormatError(ValueError):
    """A checkpoint of a format this sru_lightning does not read."""


def stamp_format(checkpoint: dict[str, Any]) -> None:
    """Mark `checkpoint` (about to be written) with this format's version."""
    checkpoint[FORMAT_KEY] = FORMAT_VERSION


def check_format(checkpoint: Any, where: str) -> None:
    """Raise CheckpointFormatError, naming `where` (the file), unless `checkpoint` is of this format."""
    found = checkpoint.get(FORMAT_KEY) if isinstance(checkpoint, Mapping) else None
    if found != FORMAT_VERSION or isinstance(found, bool):
        raise CheckpointFormatError(
            f"cannot read the checkpoint {where!r}: its format version is {found if found is not None else 'none'}, "
            f"expected {FORMAT_VERSION} (it was written by an earlier sru_lightning or by another program)"
        )
