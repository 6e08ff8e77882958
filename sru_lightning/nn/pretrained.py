"""`save_pretrained` / `from_pretrained` for the layers, in the Hugging Face folder convention.

A layer's folder holds ``config.json`` (what to build: the layer's class name and the keyword
arguments it was constructed with) and ``model.safetensors`` (its weights), the two files
``huggingface_hub.PyTorchModelHubMixin`` writes, so a folder can be shared with
``huggingface_hub.upload_folder(folder_path=..., repo_id=...)`` and read back after
``huggingface_hub.snapshot_download``. Reading runs no code from the folder: JSON and safetensors
only, and the class built is the one ``from_pretrained`` is called on. `safetensors` is imported
when a folder is written or read, never by ``import sru_lightning.nn``.

A whole language network with its tokenizer is shared with ``python -m sru_lightning export
format=hf`` (:mod:`sru_lightning.export.pretrained`).
"""

from __future__ import annotations

import functools
import inspect
import json
import math
import os
from pathlib import Path
from typing import Any

__all__ = ["PretrainedLayer", "CONFIG_FILE", "WEIGHTS_FILE", "LAYER_FORMAT_NAME"]

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
#: `format_name` of a layer's config.json: what tells ours from another library's.
LAYER_FORMAT_NAME = "sru_lightning-layer"
LAYER_FORMAT_VERSION = 1


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


class PretrainedLayer:
    """Mixin: the constructor's keyword arguments are recorded (:attr:`init_arguments`), and the
    layer is written to and read from a folder with :meth:`save_pretrained` /
    :meth:`from_pretrained`."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        init = cls.__dict__.get("__init__")
        if init is None:
            return
        signature = inspect.signature(init)

        @functools.wraps(init)
        def recording_init(self, *args: Any, **kwargs: Any) -> None:
            init(self, *args, **kwargs)
            if type(self).__init__ is recording_init:  # the class built, not a base's __init__
                bound = signature.bind(self, *args, **kwargs)
                bound.apply_defaults()
                arguments = dict(bound.arguments)
                arguments.pop(next(iter(signature.parameters)))  # self
                object.__setattr__(self, "_init_arguments", arguments)

        cls.__init__ = recording_init

    @property
    def init_arguments(self) -> dict[str, Any]:
        """The keyword arguments this layer was constructed with (its class's defaults filled in)."""
        return dict(getattr(self, "_init_arguments", {}))

    def save_pretrained(self, folder: str | os.PathLike) -> Path:
        """Write ``config.json`` and ``model.safetensors`` into `folder` (created if missing; the
        two files replaced if present). Returns the folder."""
        from safetensors.torch import save_model

        arguments = self.init_arguments
        unplain = sorted(name for name, value in arguments.items() if not _plain(value))
        if unplain:
            raise ValueError(
                f"{type(self).__name__}.save_pretrained: the constructor argument(s) {', '.join(unplain)} are not "
                "plain values (numbers, strings, lists), so config.json cannot describe them; save the weights "
                "with torch.save(layer.state_dict(), ...) instead"
            )
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        config = {
            "format_name": LAYER_FORMAT_NAME,
            "format_version": LAYER_FORMAT_VERSION,
            "architecture": type(self).__name__,
            "config": arguments,
        }
        # Each file whole or absent: written beside its final name, then renamed over it.
        weights_part = folder / f".{WEIGHTS_FILE}.part"
        save_model(self, str(weights_part))
        os.replace(weights_part, folder / WEIGHTS_FILE)
        config_part = folder / f".{CONFIG_FILE}.part"
        config_part.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        os.replace(config_part, folder / CONFIG_FILE)
        return folder

    @classmethod
    def from_pretrained(cls, folder: str | os.PathLike, *, map_location: str = "cpu"):
        """The layer a folder written by :meth:`save_pretrained` holds, with its weights.

        Raises ValueError in one line naming the file for a missing, foreign or damaged file, a
        folder of another class, and weights that do not fit the configured layer."""
        from safetensors import SafetensorError
        from safetensors.torch import load_model

        folder = Path(folder)
        config_path, weights_path = folder / CONFIG_FILE, folder / WEIGHTS_FILE
        for path in (config_path, weights_path):
            if not path.is_file():
                raise ValueError(f"{cls.__name__}.from_pretrained: {str(path)!r} does not exist")
        try:
            config = json.loads(config_path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            raise ValueError(f"{cls.__name__}.from_pretrained: {str(config_path)!r} is not JSON ({error})") from None
        if not isinstance(config, dict) or config.get("format_name") != LAYER_FORMAT_NAME:
            found = config.get("format_name") if isinstance(config, dict) else type(config).__name__
            raise ValueError(
                f"{cls.__name__}.from_pretrained: {str(config_path)!r} is not a layer folder of this package "
                f"(format_name {found!r}, expected {LAYER_FORMAT_NAME!r})"
            )
        if config.get("format_version") != LAYER_FORMAT_VERSION:
            raise ValueError(
                f"{cls.__name__}.from_pretrained: {str(config_path)!r} has format version "
                f"{config.get('format_version')!r}, expected {LAYER_FORMAT_VERSION}"
            )
        if config.get("architecture") != cls.__name__:
            raise ValueError(
                f"{cls.__name__}.from_pretrained: {str(config_path)!r} holds a {config.get('architecture')!r}; "
                f"read it with that class's from_pretrained"
            )
        arguments = config.get("config")
        if not isinstance(arguments, dict):
            raise ValueError(f"{cls.__name__}.from_pretrained: {str(config_path)!r} has no `config` mapping")
        try:
            layer = cls(**arguments)
        except (TypeError, ValueError) as error:
            raise ValueError(
                f"{cls.__name__}.from_pretrained: {str(config_path)!r} describes no valid layer: "
                f"{str(error).splitlines()[0]}"
            ) from None
        try:
            missing, unexpected = load_model(layer, str(weights_path), strict=False, device=map_location)
        except (SafetensorError, OSError, RuntimeError) as error:
            raise ValueError(
                f"{cls.__name__}.from_pretrained: {str(weights_path)!r} cannot be read as the configured layer's "
                f"weights: {str(error).splitlines()[0]}"
            ) from None
        if missing or unexpected:
            raise ValueError(
                f"{cls.__name__}.from_pretrained: {str(weights_path)!r} does not fit the configured layer "
                f"(missing {sorted(missing)}, unexpected {sorted(unexpected)})"
            )
        return layer
