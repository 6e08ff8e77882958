"""A trained network as a folder of weights in the Hugging Face layout (``format=hf``):
``config.json`` says what to build, ``model.safetensors`` holds the weights, ``tokenizer.json``
reads prompts and writes text. :func:`from_pretrained` reads it back with PyTorch and this
package alone (no Lightning, no Hydra); loading never runs code from the folder: JSON and
safetensors only, and the network is one of :data:`sru_lightning.nn.language_net.NETWORKS`.

Layout of ``<out>/``::

    config.json        `format_name`, `format_version`, `architecture` (the network's class name),
                       `network` (its constructor arguments), `tokenizer` (level, unknown,
                       end_of_line, file), `source` (checkpoint and step)
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

from .graph_module import ExportError
from .package import (
    EXPORT_FORMAT_VERSION,
    FORMAT_NAME,
    MANIFEST_NAME,
    MODEL_FILES,
    codec_from_state,
    owned_files,
    write_atomically,
    write_json,
)

__all__ = ["CONFIG_NAME", "PRETRAINED_FORMAT_NAME", "TOKENIZER_NAME", "from_pretrained", "save_pretrained"]

CONFIG_NAME = "config.json"
WEIGHTS_NAME = MODEL_FILES["hf"]
TOKENIZER_NAME = "tokenizer.json"
#: config.json's `format_name`: what tells our config.json from any other model's.
PRETRAINED_FORMAT_NAME = "sru_lightning-pretrained"
#: Bumped when config.json, the weights' names or tokenizer.json change incompatibly.
PRETRAINED_FORMAT_VERSION = 1


def _networks_by_class_name() -> dict[str, str]:
    """The class names config.json's `architecture` may hold -> the `_target_` build_network takes."""
    from sru_lightning.nn.language_net import NETWORKS

    return {cls.__name__: target for target, cls in sorted(NETWORKS.items(), key=lambda item: len(item[0]))}


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
    from safetensors.torch import save_model

    architecture = type(net).__name__
    if architecture not in _networks_by_class_name() or not hasattr(net, "config"):
        raise ExportError(
            f"format=hf saves a network of {sorted(_networks_by_class_name())}, got {type(net).__qualname__}"
        )
    config = {
        "format_name": PRETRAINED_FORMAT_NAME,
        "format_version": PRETRAINED_FORMAT_VERSION,
        "architecture": architecture,
        "network": net.config,
        "torch_dtype": str(next(net.parameters()).dtype).removeprefix("torch."),
        "tokenizer": None,
        "package_version": sru_lightning.__version__,
        "source": dict(source or {}),
    }
    tokenizer_file = None
    if codec is not None:
        state = codec.state_dict()
        config["tokenizer"] = {
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
        save_model(net, str(folder / WEIGHTS_NAME), metadata={"format": "pt"})
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(folder / WEIGHTS_NAME, 0o666 & ~umask)  # readable like the JSON files beside it
        write_json(folder / CONFIG_NAME, config)
        if tokenizer_file is not None:
            (folder / TOKENIZER_NAME).write_text(tokenizer_file, encoding="utf-8")
        manifest = {
            "format_name": FORMAT_NAME,
            "export_format_version": EXPORT_FORMAT_VERSION,
            "format": "hf",
            "model_kind": getattr(net, "rnn_type", architecture),
            "sizes": {"vocab_size": config["network"]["vocab_size"]},
            "needs_sru_lightning_kernels": False,
            "files": files,
            "owned_files": owned_files(files),
            "torch_version": torch.__version__,
            "package_version": sru_lightning.__version__,
            "producer": "sru_lightning export",
            "source": config["source"],
            "export_seconds": round(time.perf_counter() - started, 1),
        }
        write_json(folder / MANIFEST_NAME, manifest)  # last: its presence marks a complete folder

    return write_atomically(Path(out), fill, overwrite=overwrite)


# --------------------------------------------------------------------------------------------
# reading
def _refuse(path: Path, problem: str) -> ExportError:
    return ExportError(f"cannot load {str(path)!r}: {problem}")


def read_config(folder: str | os.PathLike) -> dict[str, Any]:
    """config.json of a pretrained folder, checked to be this format's."""
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise ExportError(f"the pretrained folder {str(folder)!r} does not exist (make one with format=hf)")
    path = folder / CONFIG_NAME
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise _refuse(path, "the file is missing (the folder was not written by `export format=hf`)") from None
    except OSError as error:
        raise _refuse(path, error.strerror or str(error)) from None
    except ValueError as error:
        raise _refuse(path, f"it is not JSON ({error})") from None
    name = config.get("format_name") if isinstance(config, dict) else None
    if name != PRETRAINED_FORMAT_NAME:
        raise _refuse(
            path,
            f"`format_name` must be {PRETRAINED_FORMAT_NAME!r}, got {name!r} (the config of another format or "
            "program; make the folder with `python -m sru_lightning export format=hf`)",
        )
    version = config.get("format_version")
    if version != PRETRAINED_FORMAT_VERSION or isinstance(version, bool):
        raise _refuse(
            path, f"`format_version` is {version!r}, and this sru_lightning reads {PRETRAINED_FORMAT_VERSION} only"
        )
    architectures = _networks_by_class_name()
    if config.get("architecture") not in architectures:
        found = config.get("architecture")
        raise _refuse(path, f"`architecture` must be one of {sorted(architectures)}, got {found!r}")
    if not isinstance(config.get("network"), dict):
        raise _refuse(path, f"`network` must be the network's arguments (an object), got {config.get('network')!r}")
    tokenizer = config.get("tokenizer")
    if tokenizer is not None and not (isinstance(tokenizer, dict) and tokenizer.get("file") == TOKENIZER_NAME):
        raise _refuse(path, f"`tokenizer` must be null or an object with file {TOKENIZER_NAME!r}, got {tokenizer!r}")
    return config


def load_network(folder: str | os.PathLike, config: Mapping[str, Any] | None = None) -> torch.nn.Module:
    """The network of a pretrained folder with its weights, in eval mode."""
    from safetensors import SafetensorError, safe_open

    from sru_lightning.nn.language_net import build_network

    folder = Path(folder).expanduser()
    config = read_config(folder) if config is None else config
    try:
        net = build_network({"_target_": _networks_by_class_name()[config["architecture"]], **config["network"]})
    except (TypeError, ValueError) as error:
        raise _refuse(folder / CONFIG_NAME, f"`network` does not build: {str(error).splitlines()[0]}") from None
    path = folder / WEIGHTS_NAME
    if not path.is_file():
        raise _refuse(path, "the weights file is missing")
    try:
        with safe_open(str(path), framework="pt") as weights:
            tensors = {name: weights.get_tensor(name) for name in weights.keys()}
    except (SafetensorError, OSError, RuntimeError) as error:
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
        problem = f"it is not a safetensors file that can be read (truncated or another file): {reason}"
        raise _refuse(path, problem) from None
    expected = net.state_dict()
    # Names that share one tensor (a tied output layer): the file holds one of each group.
    groups: dict[tuple, list[str]] = {}
    for name, tensor in expected.items():
        groups.setdefault((tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tensor.shape), []).append(name)
    missing = [names[0] for names in groups.values() if not any(name in tensors for name in names)]
    unexpected = sorted(set(tensors) - set(expected))
    wrong = [
        f"{name} {tuple(tensor.shape)} (expected {tuple(expected[name].shape)})"
        for name, tensor in tensors.items()
        if name in expected and tensor.shape != expected[name].shape
    ]
    if missing or unexpected or wrong:
        problems = [
            f"{label}: {', '.join(names[:4])}{' ...' if len(names) > 4 else ''}"
            for label, names in (("missing tensors", missing), ("unexpected tensors", unexpected), ("shapes", wrong))
            if names
        ]
        raise _refuse(path, f"the weights do not fit the network of {CONFIG_NAME} ({'; '.join(problems)})")
    full = {}
    for names in groups.values():
        stored = next(tensors[name] for name in names if name in tensors)
        full.update(dict.fromkeys(names, stored))
    dtype = getattr(torch, str(config.get("torch_dtype", "float32")), None)
    if isinstance(dtype, torch.dtype) and dtype.is_floating_point:
        net = net.to(dtype)
    net.load_state_dict(full, strict=True)
    return net.eval()


def load_codec(folder: str | os.PathLike, config: Mapping[str, Any] | None = None):
    """The token codec of a pretrained folder (None when it was saved without one)."""
    folder = Path(folder).expanduser()
    config = read_config(folder) if config is None else config
    tokenizer = config.get("tokenizer")
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
    config = read_config(folder)
    net = load_network(folder, config)
    codec = load_codec(folder, config)
    if codec is not None and codec.vocab_size != net.vocab_size:
        raise _refuse(folder / TOKENIZER_NAME, f"it has {codec.vocab_size} tokens but the network {net.vocab_size}")
    return net, codec
