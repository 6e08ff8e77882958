"""Export folders: write one (model file, vocabulary, manifest) so that a failure never leaves a
folder that looks complete, and read one back after checking that it is one this package can run.

Layout of ``<out>/``::

    manifest.json     what the folder holds (see :func:`manifest`)
    model.onnx        format=onnx: standard ONNX, runs with onnxruntime alone
    model.pt2         format=pt2: a torch.export program; format=aoti: an AOTInductor package
    vocabulary.json   the token codec (level and token list) that reads prompts and writes text
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .graph_module import ExportError

#: Bumped when the folder layout, the manifest or the graph's signature changes incompatibly.
EXPORT_FORMAT_VERSION = 1
FORMATS = ("onnx", "pt2", "aoti")
MANIFEST_NAME = "manifest.json"
VOCABULARY_NAME = "vocabulary.json"
MODEL_FILES = {"onnx": "model.onnx", "pt2": "model.pt2", "aoti": "model.pt2"}


def check_format(fmt: str) -> str:
    if fmt not in FORMATS:
        raise ExportError(f"`format` must be one of {', '.join(FORMATS)}, got {fmt!r}")
    return fmt


def write_atomically(out: Path, fill: Callable[[Path], None], overwrite: bool = False) -> Path:
    """Create the folder `out` by calling ``fill(folder)`` on a hidden temporary folder next to
    it and renaming that into place once complete.

    An existing `out` is refused unless `overwrite`; then it is replaced only after the new
    folder is complete, so a failed export leaves the old one untouched.
    """
    out = Path(out).expanduser().absolute()
    if out.exists() and not overwrite:
        raise ExportError(f"`out` {str(out)!r} already exists; choose another folder or pass overwrite=true to replace it")
    if out.exists() and not (out / MANIFEST_NAME).is_file():
        raise ExportError(
            f"`out` {str(out)!r} exists and is not an export folder (no {MANIFEST_NAME}); "
            "overwrite=true replaces only earlier exports"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.incomplete-", dir=out.parent))
    try:
        fill(staging)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(staging, 0o777 & ~umask)  # mkdtemp's private mode is for the staging phase only
        if out.exists():
            retired = Path(tempfile.mkdtemp(prefix=f".{out.name}.replaced-", dir=out.parent))
            os.rename(out, retired / out.name)
            os.rename(staging, out)
            shutil.rmtree(retired, ignore_errors=True)
        else:
            os.rename(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out


def write_json(path: Path, content: Mapping[str, Any]) -> None:
    path.write_text(json.dumps(content, indent=2) + "\n", encoding="utf-8")


def read_manifest(folder: str | os.PathLike) -> dict[str, Any]:
    """The manifest of an export folder, checked to be one this version of the package reads."""
    import torch

    folder = Path(folder).expanduser()
    path = folder / MANIFEST_NAME
    if not folder.is_dir():
        raise ExportError(f"the export folder {str(folder)!r} does not exist (make one with `python -m sru_lightning export`)")
    if not path.is_file():
        raise ExportError(f"{str(folder)!r} is not an export folder: it has no {MANIFEST_NAME} "
                          "(make one with `python -m sru_lightning export`)")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ExportError(f"cannot read {str(path)!r}: {error}") from None
    version = manifest.get("export_format_version") if isinstance(manifest, dict) else None
    if version != EXPORT_FORMAT_VERSION:
        raise ExportError(
            f"{str(folder)!r} is an export of format version {version!r} (package "
            f"{manifest.get('package_version', '?') if isinstance(manifest, dict) else '?'}); this sru_lightning "
            f"reads version {EXPORT_FORMAT_VERSION}: export the checkpoint again"
        )
    fmt = manifest.get("format")
    check_format(fmt)
    if fmt in ("pt2", "aoti") and manifest.get("torch_version") != torch.__version__:
        raise ExportError(
            f"{str(folder)!r} was exported with torch {manifest.get('torch_version')!r} and a {fmt} program "
            f"runs only on that version; this is torch {torch.__version__}: export it again here, or use format=onnx"
        )
    model_file = folder / manifest["files"]["model"]
    if not model_file.is_file():
        raise ExportError(f"{str(folder)!r} lacks its model file {manifest['files']['model']!r}")
    return manifest


def read_vocabulary(folder: str | os.PathLike):
    from sru_lightning.data import TokenCodec

    path = Path(folder).expanduser() / VOCABULARY_NAME
    try:
        return TokenCodec.from_state_dict(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError) as error:
        raise ExportError(f"cannot read the vocabulary {str(path)!r}: {error}") from None
