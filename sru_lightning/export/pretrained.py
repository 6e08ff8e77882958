"""A trained network as a folder of weights in the Hugging Face layout (``format=hf``):
``config.json`` says what to build, ``model.safetensors`` holds the weights, ``tokenizer.json``
reads prompts and writes text. :func:`from_pretrained` reads it back with PyTorch and this
package alone (no Lightning, no Hydra); loading never runs code from the folder: JSON and
safetensors only, and the network is one of :data:`sru_lightning.nn.language_net.NETWORKS`.

The folder is the layers' own format (:mod:`sru_lightning.nn.pretrained`: one writer, one
reader) with the tokenizer and the export's manifest added. Layout of ``<out>/``::

    config.json        `format_name`, `format_version`, `architecture` ("LanguageNet"),
                       `config` (:class:`~sru_lightning.nn.configs.LanguageNetConfig`),
                       `torch_dtype`, `package_version`, and here `tokenizer` (level, unknown,
                       end_of_line, vocab_size, file) and `source` (checkpoint and step)
    model.safetensors  the network's state dict (a tied output layer is stored once)
    tokenizer.json     the token codec's state; at bpe level the tokenizer's own JSON (the
                       `tokenizers` package reads it with ``Tokenizer.from_file``)
    manifest.json      the export folder's manifest (:mod:`sru_lightning.export.package`): the
                       files the folder owns, so overwrite=true replaces only its own files

Share it with ``huggingface_hub.upload_folder(folder_path=<out>, repo_id=<user>/<name>)``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

import sru_lightning
from sru_lightning.nn import pretrained as pretrained_folder
from sru_lightning.nn.configs import LanguageNetConfig
from sru_lightning.nn.pretrained import (
    PretrainedFolder,
    PretrainedFolderError,
    load_pretrained,
    read_pretrained_config,
    write_pretrained,
)

from .graph_module import ExportError
from .package import (
    EXPORT_FORMAT_VERSION,
    FORMAT_NAME,
    MANIFEST_NAME,
    MODEL_FILES,
    PRETRAINED_FILES,
    codec_from_state,
    owned_files,
    write_atomically,
    write_json,
)

__all__ = ["CONFIG_NAME", "PRETRAINED_FORMAT_NAME", "TOKENIZER_NAME", "from_pretrained", "save_pretrained"]

CONFIG_NAME = pretrained_folder.CONFIG_FILE
WEIGHTS_NAME = MODEL_FILES["hf"]
TOKENIZER_NAME = PRETRAINED_FILES["tokenizer"]
#: config.json's `format_name`: what tells our config.json from any other model's.
PRETRAINED_FORMAT_NAME = pretrained_folder.FORMAT_NAME


def _networks() -> dict[str, type[torch.nn.Module]]:
    """The classes a folder's `architecture` may name -> the class built for it."""
    from sru_lightning.nn.language_net import NETWORKS

    return {cls.config_class.architecture: cls for cls in NETWORKS.values()}


# --------------------------------------------------------------------------------------------
# writing
def save_pretrained(
    net: torch.nn.Module,
    out: str | os.PathLike,
    codec=None,
    *,
    overwrite: bool = False,
    source: Mapping[str, Any] | None = None,
) -> Path:
    """Write `net` (a :class:`~sru_lightning.nn.LanguageNet`) and its `codec` (a TokenCodec, or
    None) to the folder `out`; returns it. The folder appears only when complete, an existing one
    is replaced only with `overwrite` and only when it holds nothing but an export's own files."""
    if not isinstance(getattr(net, "pretrained_config", None), LanguageNetConfig):
        raise ExportError(f"format=hf saves a network of {sorted(_networks())}, got {type(net).__qualname__}")
    extra: dict[str, Any] = {"tokenizer": None, "source": dict(source or {})}
    tokenizer_file = None
    if codec is not None:
        state = codec.state_dict()
        extra["tokenizer"] = {
            "level": state["level"],
            "unknown": state.get("unknown"),
            "end_of_line": state.get("end_of_line"),
            "vocab_size": codec.vocab_size,
            "file": TOKENIZER_NAME,
        }
        # At bpe level the file is the tokenizer's own JSON; otherwise the codec's state.
        tokenizer_file = state["tokenizer"] if state["level"] == "bpe" else json.dumps(state, indent=2) + "\n"
    files = {"model": WEIGHTS_NAME, "config": CONFIG_NAME, **({"tokenizer": TOKENIZER_NAME} if codec else {})}

    def fill(folder: Path) -> None:
        started = time.perf_counter()
        write_pretrained(net, folder, extra=extra)
        if tokenizer_file is not None:
            (folder / TOKENIZER_NAME).write_text(tokenizer_file, encoding="utf-8")
        manifest = {
            "format_name": FORMAT_NAME,
            "export_format_version": EXPORT_FORMAT_VERSION,
            "format": "hf",
            "model_kind": getattr(net, "rnn_type", type(net).__name__),
            "sizes": {"vocab_size": net.pretrained_config.vocab_size},
            "needs_sru_lightning_kernels": False,
            "files": files,
            "owned_files": owned_files(files),
            "torch_version": torch.__version__,
            "package_version": sru_lightning.__version__,
            "producer": "sru_lightning export",
            "source": extra["source"],
            "export_seconds": round(time.perf_counter() - started, 1),
        }
        write_json(folder / MANIFEST_NAME, manifest)  # last: its presence marks a complete folder

    return write_atomically(Path(out), fill, overwrite=overwrite)


# --------------------------------------------------------------------------------------------
# reading
def _refuse(path: Path, problem: str) -> ExportError:
    return ExportError(f"cannot load {str(path)!r}: {problem}")


def read_config(folder: str | os.PathLike) -> PretrainedFolder:
    """config.json of a pretrained folder of a network, checked to be this format's (or an
    earlier one's) and its tokenizer entry to be one this package wrote."""
    try:
        read = read_pretrained_config(folder, _networks())
    except PretrainedFolderError as error:
        raise ExportError(str(error)) from None
    tokenizer = read.extra.get("tokenizer")
    if tokenizer is not None and not (isinstance(tokenizer, dict) and tokenizer.get("file") == TOKENIZER_NAME):
        raise _refuse(
            read.path / CONFIG_NAME,
            f"`tokenizer` must be null or an object with file {TOKENIZER_NAME!r}, got {tokenizer!r}",
        )
    return read


def load_network(folder: str | os.PathLike, read: PretrainedFolder | None = None) -> torch.nn.Module:
    """The network of a pretrained folder with its weights, in eval mode."""
    try:
        net, _ = load_pretrained(folder, _networks(), read=read)
    except PretrainedFolderError as error:
        raise ExportError(str(error)) from None
    return net.eval()


def load_codec(folder: str | os.PathLike, read: PretrainedFolder | None = None):
    """The token codec of a pretrained folder (None when it was saved without one)."""
    folder = Path(folder).expanduser()
    read = read_config(folder) if read is None else read
    tokenizer = read.extra.get("tokenizer")
    if tokenizer is None:
        return None
    path = folder / TOKENIZER_NAME
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise _refuse(path, f"the tokenizer file is missing ({CONFIG_NAME} names it)") from None
    except (OSError, ValueError) as error:
        raise _refuse(path, str(error).splitlines()[0]) from None
    if tokenizer.get("level") == "bpe":
        state = {
            "level": "bpe",
            "itos": None,
            "unknown": tokenizer.get("unknown"),
            "end_of_line": tokenizer.get("end_of_line"),
            "tokenizer": text,
        }
    else:
        try:
            state = json.loads(text)
        except ValueError as error:
            raise _refuse(path, f"it is not JSON ({error})") from None
    return codec_from_state(state, path)


def from_pretrained(folder: str | os.PathLike):
    """``(network, codec)`` of a folder written by ``python -m sru_lightning export format=hf``:
    the :class:`~sru_lightning.nn.LanguageNet` in eval mode and its TokenCodec (None when saved
    without one). A missing, damaged or foreign file raises ExportError in one line naming it."""
    folder = Path(folder).expanduser()
    read = read_config(folder)
    net = load_network(folder, read)
    codec = load_codec(folder, read)
    if codec is not None and codec.vocab_size != net.vocab_size:
        raise _refuse(folder / TOKENIZER_NAME, f"it has {codec.vocab_size} tokens but the network {net.vocab_size}")
    return net, codec
