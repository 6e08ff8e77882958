"""Where the kernel sources and the Hydra configs are, installed or in a source checkout."""

from __future__ import annotations

from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent


def _locate(name: str) -> Path:
    # An installed wheel ships them inside the package; a source checkout (or an editable
    # install) keeps them at the repository top level, next to the package folder.
    for candidate in (_PACKAGE_DIR / name, _PACKAGE_DIR.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(
        f"sru_lightning: cannot find its '{name}' folder next to {_PACKAGE_DIR}; "
        "reinstall the package (pip install sru_lightning) or run from a full source checkout"
    )


def csrc_dir() -> Path:
    """Folder holding the C++/CUDA recurrence sources."""
    return _locate("csrc")


def conf_dir() -> Path:
    """Folder holding the Hydra configuration tree."""
    return _locate("conf")
