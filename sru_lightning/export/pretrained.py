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
                       end_of_line, vocab_size, file), `source` (checkpoint and step), and
                       transformers' `model_type` and `architectures`
                       (``AutoModelForCausalLM.from_pretrained`` after ``import sru_lightning``)
    model.safetensors  the network's state dict (a tied output layer is stored once)
    tokenizer.json     the token codec as Hugging Face `tokenizers` JSON at every level
                       (:mod:`sru_lightning.export.hf_tokenizer`: the codec's ids); folders of
                       the first format hold the codec's state here, and are read too
    tokenizer_config.json  what ``AutoTokenizer`` / ``PreTrainedTokenizerFast`` need beside it:
                       the padding token (after the vocabulary) and left padding
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
from .hf_tokenizer import codec_state_from_tokenizer_json, tokenizer_config, tokenizer_json
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

__all__ = [
    "CONFIG_NAME",
    "MODEL_TYPE",
    "PRETRAINED_FORMAT_NAME",
    "TOKENIZER_NAME",
    "from_pretrained",
    "save_pretrained",
    "transformers_keys",
]

CONFIG_NAME = pretrained_folder.CONFIG_FILE
WEIGHTS_NAME = MODEL_FILES["hf"]
TOKENIZER_NAME = PRETRAINED_FILES["tokenizer"]
TOKENIZER_CONFIG_NAME = PRETRAINED_FILES["tokenizer_config"]
#: config.json's `model_type`: what transformers' Auto classes find the model class by
#: (:mod:`sru_lightning.hf` registers it).
MODEL_TYPE = "sru_lightning"
#: The transformers class a folder's `architectures` names.
TRANSFORMERS_ARCHITECTURE = "SRULightningForCausalLM"
#: config.json's `format_name`: what tells our config.json from any other model's.
PRETRAINED_FORMAT_NAME = pretrained_folder.FORMAT_NAME


def _networks() -> dict[str, type[torch.nn.Module]]:
    """The classes a folder's `architecture` may name -> the class built for it."""
    from sru_lightning.nn.language_net import NETWORKS

    return {cls.config_class.architecture: cls for cls in NETWORKS.values()}


def transformers_keys() -> dict[str, Any]:
    """The keys of config.json that transformers reads (beside the format's own)."""
    return {"model_type": MODEL_TYPE, "architectures": [TRANSFORMERS_ARCHITECTURE]}


def tokenizer_entry(codec) -> dict[str, Any]:
    """config.json's `tokenizer`: the codec's level and settings, and the file that holds it."""
    state = codec.state_dict()
    return {
        "level": state["level"],
        "unknown": state.get("unknown"),
        "end_of_line": state.get("end_of_line"),
        "vocab_size": codec.vocab_size,
        "file": TOKENIZER_NAME,
    }


def write_tokenizer(codec, folder: Path) -> None:
    """tokenizer.json and tokenizer_config.json of `codec` into `folder`."""
    (folder / TOKENIZER_NAME).write_text(tokenizer_json(codec), encoding="utf-8")
    write_json(folder / TOKENIZER_CONFIG_NAME, tokenizer_config(codec))


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
    extra: dict[str, Any] = {
        "tokenizer": None if codec is None else tokenizer_entry(codec),
        "source": dict(source or {}),
        **transformers_keys(),
    }
    tokenizer_files = {"tokenizer": TOKENIZER_NAME, "tokenizer_config": TOKENIZER_CONFIG_NAME} if codec else {}
    files = {"model": WEIGHTS_NAME, "config": CONFIG_NAME, **tokenizer_files}

    def fill(folder: Path) -> None:
        started = time.perf_counter()
        write_pretrained(net, folder, extra=extra)
        if codec is not None:
            write_tokenizer(codec, folder)
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
    try:
        document = json.loads(text)
    except ValueError as error:
        raise _refuse(path, f"it is not JSON ({error})") from None
    if isinstance(document, dict) and "level" in document and tokenizer.get("level") != "bpe":
        state = document  # the first format: the codec's state
    else:
        try:
            state = codec_state_from_tokenizer_json(text, tokenizer)
        except ValueError as error:
            raise _refuse(path, str(error)) from None
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
