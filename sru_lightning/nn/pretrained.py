"""The one folder format of weights, in the Hugging Face layout: a layer's ``save_pretrained`` /
``from_pretrained`` and a language network's ``export format=hf`` folder
(:mod:`sru_lightning.export.pretrained`, which adds the tokenizer and the export's manifest).

A folder holds ``config.json`` (what to build) and ``model.safetensors`` (the weights, with a
tied matrix stored once), the two files ``huggingface_hub.PyTorchModelHubMixin`` writes, so a
folder can be shared with ``huggingface_hub.upload_folder(folder_path=..., repo_id=...)`` and
read back after ``huggingface_hub.snapshot_download``. ``config.json``::

    format_name      "sru_lightning-pretrained" (what tells ours from another program's)
    format_version   2
    architecture     the class name: SRUCell, SRU, SRUpp or LanguageNet
    config           its config object's fields (:mod:`sru_lightning.nn.configs`)
    torch_dtype      the weights' dtype ("float32", ...)
    package_version  the sru_lightning that wrote it
    ...              what the writer adds (an export: `tokenizer`, `source`)

Reading runs no code from the folder: JSON and safetensors only, and the classes built are the
ones the caller names. The two formats before this one (a layer's ``sru_lightning-layer`` 1 and
an export's ``sru_lightning-pretrained`` 1) are read too. `safetensors` is imported when a folder
is written or read, never by ``import sru_lightning.nn``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

import sru_lightning
from sru_lightning._atomic import write_text, written_beside

from .configs import CONFIGS, ArchitectureConfig

__all__ = [
    "CONFIG_FILE",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "WEIGHTS_FILE",
    "PretrainedFolder",
    "PretrainedFolderError",
    "PretrainedLayer",
    "load_pretrained",
    "read_pretrained_config",
    "write_pretrained",
]

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
#: config.json's `format_name`.
FORMAT_NAME = "sru_lightning-pretrained"
#: Bumped when config.json or the weights' names change incompatibly.
FORMAT_VERSION = 2
#: The formats read besides this one -> the key that held the architecture's arguments: a
#: layer's folder (`save_pretrained` before version 2) and an export's (`format=hf` before it).
EARLIER_FORMATS = {("sru_lightning-layer", 1): "config", ("sru_lightning-pretrained", 1): "network"}


#: The keys of config.json the reader itself reads (with the key of the arguments, `config`);
#: the others are what a writer added (`extra`).
_HEADER_KEYS = {"format_name", "format_version", "architecture", "torch_dtype"}


class PretrainedFolderError(ValueError):
    """A folder that cannot be read as the module asked for; the one-line message names the file."""


def _plain(value: Any) -> bool:
    """True for what JSON writes and reads back unchanged: None, bool, int, str, finite float,
    and lists / string-keyed dicts of those."""
    if value is None or isinstance(value, (bool, int, str)):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, (list, tuple)):
        return all(_plain(item) for item in value)
    if isinstance(value, dict):
        return all(isinstance(key, str) and _plain(item) for key, item in value.items())
    return False


# --------------------------------------------------------------------------------------------
# writing
def write_pretrained(module: nn.Module, folder: str | os.PathLike, *, extra: Mapping[str, Any] | None = None) -> Path:
    """Write ``config.json`` (from ``module.pretrained_config``, with the `extra` keys) and
    ``model.safetensors`` into `folder` (created if missing; the two files replaced, each whole
    or not at all). Returns the folder. Raises ValueError naming a config field that JSON cannot
    hold."""
    from safetensors.torch import save_model

    config: ArchitectureConfig = module.pretrained_config
    fields = config.to_dict()
    unplain = sorted(name for name, value in fields.items() if not _plain(value))
    if unplain:
        raise ValueError(
            f"{type(module).__name__}: the argument(s) {', '.join(unplain)} are not plain values (numbers, "
            "strings, lists), so config.json cannot describe them; save the weights with "
            "torch.save(module.state_dict(), ...) instead"
        )
    taken = sorted(set(extra or {}) & {*_HEADER_KEYS, "config", "package_version"})
    if taken:
        raise ValueError(f"write_pretrained: `extra` must not set the format's own keys, got {taken}")
    header = {
        "format_name": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "architecture": config.architecture,
        "config": fields,
        "torch_dtype": str(next(module.parameters()).dtype).removeprefix("torch."),
        "package_version": sru_lightning.__version__,
        **(extra or {}),
    }
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with written_beside(folder / WEIGHTS_FILE) as weights:
        save_model(module, str(weights), metadata={"format": "pt"})
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(weights, 0o666 & ~umask)  # readable like the JSON beside it (safetensors writes 0600)
    write_text(folder / CONFIG_FILE, json.dumps(header, indent=2) + "\n")
    return folder


# --------------------------------------------------------------------------------------------
# reading
@dataclasses.dataclass(frozen=True)
class PretrainedFolder:
    """What a folder's config.json says: the config to build, the weights' dtype, and the keys
    its writer added (`extra`: an export's `tokenizer` and `source`)."""

    path: Path
    config: ArchitectureConfig
    torch_dtype: str
    extra: dict[str, Any]


def _refusal(owner: str, path: Path, problem: str) -> PretrainedFolderError:
    return PretrainedFolderError(f"{owner + ': ' if owner else ''}cannot load {str(path)!r}: {problem}")


def _reader_of(architecture: str) -> str:
    return "sru_lightning.from_pretrained" if architecture == "LanguageNet" else f"{architecture}.from_pretrained"


def read_pretrained_config(
    folder: str | os.PathLike, architectures: Mapping[str, type] | tuple[str, ...], *, owner: str = ""
) -> PretrainedFolder:
    """config.json of `folder`, checked to be one of ours and to hold one of `architectures`
    (class names). Raises PretrainedFolderError in one line naming the file."""
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        prefix = f"{owner}: " if owner else ""
        raise PretrainedFolderError(f"{prefix}the pretrained folder {str(folder)!r} does not exist")
    path = folder / CONFIG_FILE
    try:
        header = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise _refusal(owner, path, "the file is missing (the folder was not written by this package)") from None
    except OSError as error:
        raise _refusal(owner, path, error.strerror or str(error)) from None
    except ValueError as error:  # includes bytes that are not UTF-8
        raise _refusal(owner, path, f"it is not JSON ({error})") from None
    name = header.get("format_name") if isinstance(header, dict) else None
    version = header.get("format_version") if isinstance(header, dict) else None
    if not isinstance(name, str) or name not in {FORMAT_NAME, *(earlier for earlier, _ in EARLIER_FORMATS)}:
        raise _refusal(
            owner,
            path,
            f"`format_name` must be {FORMAT_NAME!r}, got {name!r} (the config of another format or program; make the "
            "folder with save_pretrained or `python -m sru_lightning export format=hf`)",
        )
    known = isinstance(version, int) and not isinstance(version, bool)
    if known and (name, version) in EARLIER_FORMATS:
        arguments_key = EARLIER_FORMATS[(name, version)]
    elif known and (name, version) == (FORMAT_NAME, FORMAT_VERSION):
        arguments_key = "config"
    else:
        readable = sorted({v for n, v in [*EARLIER_FORMATS, (FORMAT_NAME, FORMAT_VERSION)] if n == name})
        raise _refusal(
            owner, path, f"`format_version` is {version!r}, and this sru_lightning reads {readable} of {name!r} only"
        )
    architecture = header.get("architecture")
    if not isinstance(architecture, str) or architecture not in architectures:
        if isinstance(architecture, str) and architecture in CONFIGS:
            raise _refusal(owner, path, f"it holds a {architecture!r}; read it with {_reader_of(architecture)}")
        raise _refusal(owner, path, f"`architecture` must be one of {sorted(architectures)}, got {architecture!r}")
    arguments = header.get(arguments_key)
    if not isinstance(arguments, dict):
        problem = f"`{arguments_key}` must be the {architecture}'s arguments (an object), got {arguments!r}"
        raise _refusal(owner, path, problem)
    if name == "sru_lightning-layer" and arguments.get("custom_m", "absent") is None:
        # The first layer format recorded every constructor argument, the module one too (null:
        # a layer with a module was never saved).
        arguments = {key: value for key, value in arguments.items() if key != "custom_m"}
    try:
        config = CONFIGS[architecture].from_dict(arguments)
    except ValueError as error:
        raise _refusal(owner, path, f"`{arguments_key}`: {error}") from None
    extra = {key: value for key, value in header.items() if key not in _HEADER_KEYS | {arguments_key}}
    return PretrainedFolder(folder, config, str(header.get("torch_dtype", "float32")), extra)


def load_pretrained(
    folder: str | os.PathLike,
    builds: Mapping[str, type[nn.Module]],
    *,
    owner: str = "",
    map_location: str | torch.device = "cpu",
    read: PretrainedFolder | None = None,
) -> tuple[nn.Module, PretrainedFolder]:
    """The module a folder holds, with its weights, and what its config.json says.

    `builds` maps each architecture the caller reads to the class built for it (a folder never
    names what is built). `read` is the folder's config when the caller has read it already.
    Raises PretrainedFolderError in one line naming the file for a missing, foreign or damaged
    file, a folder of another class, and weights that do not fit the configured module."""
    from safetensors import SafetensorError, safe_open

    read = read_pretrained_config(folder, builds, owner=owner) if read is None else read
    config_path, path = read.path / CONFIG_FILE, read.path / WEIGHTS_FILE
    try:
        module = builds[read.config.architecture](**read.config.to_dict())
    except (TypeError, ValueError) as error:
        problem = f"it describes no {read.config.architecture} that can be built: {str(error).splitlines()[0]}"
        raise _refusal(owner, config_path, problem) from None
    if not path.is_file():
        raise _refusal(owner, path, "the weights file is missing")
    try:
        with safe_open(str(path), framework="pt", device=str(map_location)) as weights:
            tensors = {name: weights.get_tensor(name) for name in weights.keys()}
    except (SafetensorError, OSError, RuntimeError) as error:
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
        raise _refusal(
            owner, path, f"it is not a safetensors file that can be read (truncated or another file): {reason}"
        ) from None
    dtype = getattr(torch, read.torch_dtype, None)
    if isinstance(dtype, torch.dtype) and dtype.is_floating_point:
        module = module.to(dtype)
    module.load_state_dict(_full_state(module, tensors, path, owner), strict=True)
    return module, read


def _full_state(module: nn.Module, tensors: dict[str, torch.Tensor], path: Path, owner: str) -> dict[str, Any]:
    """The module's state dict from a file's tensors, checked to fit it: names that share one
    tensor (a tied output layer) are stored once, under any of their names."""
    expected = module.state_dict()
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
        problem = f"the weights do not fit the {type(module).__name__} of {CONFIG_FILE} ({'; '.join(problems)})"
        raise _refusal(owner, path, problem)
    full = {}
    for names in groups.values():
        stored = next(tensors[name] for name in names if name in tensors)
        full.update(dict.fromkeys(names, stored))
    return full


# --------------------------------------------------------------------------------------------
# the layers' methods
class PretrainedLayer:
    """Mixin of the layers: the config object a layer was built from (:attr:`pretrained_config`)
    and its folder (:meth:`save_pretrained` / :meth:`from_pretrained`)."""

    #: The config class of the layer (:mod:`sru_lightning.nn.configs`).
    config_class: ClassVar[type[ArchitectureConfig]]

    def _keep_config(self, arguments: Mapping[str, Any]) -> None:
        """Keep the config of the constructor call whose arguments are given (its ``locals()``
        first thing after ``super().__init__()``), and the names of the arguments given that no
        config describes (a ``custom_m`` module)."""
        config = self.config_class.from_arguments(arguments)
        described = {*config.field_names(), "self", "__class__"}
        self._pretrained_config = config
        self._undescribed_arguments = tuple(
            sorted(name for name, value in arguments.items() if name not in described and value is not None)
        )

    @property
    def pretrained_config(self) -> ArchitectureConfig:
        """The config this layer was built from: ``type(layer)(**layer.pretrained_config.to_dict())``
        builds one of the same shape."""
        return self._pretrained_config

    def save_pretrained(self, folder: str | os.PathLike) -> Path:
        """Write ``config.json`` and ``model.safetensors`` into `folder` (created if missing; the
        two files replaced if present). Returns the folder."""
        if self._undescribed_arguments:
            raise ValueError(
                f"{type(self).__name__}.save_pretrained: the constructor argument(s) "
                f"{', '.join(self._undescribed_arguments)} are not plain values (numbers, strings, lists), so "
                "config.json cannot describe them; save the weights with torch.save(layer.state_dict(), ...) instead"
            )
        return write_pretrained(self, folder)

    @classmethod
    def from_pretrained(cls, folder: str | os.PathLike, *, map_location: str = "cpu"):
        """The layer a folder written by :meth:`save_pretrained` holds, with its weights.

        Raises ValueError in one line naming the file for a missing, foreign or damaged file, a
        folder of another class, and weights that do not fit the configured layer."""
        builds = {cls.config_class.architecture: cls}
        layer, _ = load_pretrained(folder, builds, owner=f"{cls.__name__}.from_pretrained", map_location=map_location)
        return layer
