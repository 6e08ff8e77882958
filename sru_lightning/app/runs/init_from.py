"""`fit model.init_from=<folder | run | .ckpt>`: a new run whose network starts from trained weights.

Only the network's weights are taken (not the optimizer, the step or the data position: the
run is a new one), with the vocabulary they were trained with: the data is encoded with it
(a character or word it lacks is refused in one line naming it, as when a checkpoint is
evaluated on other text). The network `model.net` describes must have the weights' shapes;
a difference is refused in one line, before training, naming the settings to change.

A resumed run starts from its own checkpoint and takes nothing from `init_from`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sru_lightning.app.usage import UsageError

__all__ = ["INIT_FROM_KEY", "InitialWeights", "load_initial_weights", "put_initial_weights", "without_init_from"]

#: The key of the model config that names the weights.
INIT_FROM_KEY = "init_from"
#: The network arguments that decide the weights' shapes (`sru_options` are compared by tensor).
_SHAPE_FIELDS = ("vocab_size", "rnn", "embedding_dim", "hidden_size", "num_layers", "tie_weights")


@dataclass
class InitialWeights:
    source: str  # what `init_from` named, for messages
    network: Any  # the network holding the weights
    codec: Any  # its vocabulary (TokenCodec)


def init_from_setting(model_config) -> str | None:
    value = model_config.get(INIT_FROM_KEY) if model_config is not None else None
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise UsageError(
            f"`model.{INIT_FROM_KEY}` must be a pretrained folder, a run directory or a .ckpt file, got {value!r}"
        )
    return value


def without_init_from(model_config):
    """`model_config` less `init_from` (the LightningModule takes no such argument)."""
    from omegaconf import OmegaConf, open_dict

    if model_config is None or INIT_FROM_KEY not in model_config:
        return model_config
    copy = OmegaConf.create(OmegaConf.to_container(model_config, resolve=False))
    with open_dict(copy):
        copy.pop(INIT_FROM_KEY)
    return copy


def load_initial_weights(setting: str, resume_dir: str) -> InitialWeights:
    """The network and vocabulary `setting` names: a pretrained folder (config.json, as `export
    format=hf` writes), a run directory or a checkpoint file; any problem raises UsageError."""
    path = Path(setting).expanduser()
    owner = f"`model.{INIT_FROM_KEY}`"
    if path.is_dir() and (path / "config.json").is_file():
        from sru_lightning.export import ExportError
        from sru_lightning.export.pretrained import from_pretrained

        try:
            network, codec = from_pretrained(path)
        except ExportError as error:
            raise UsageError(f"{owner}: {error}") from None
        if codec is None:
            raise UsageError(
                f"{owner}: {str(path)!r} holds no tokenizer.json, so its token ids cannot be matched to the data's; "
                "export it again with its vocabulary"
            )
        return InitialWeights(setting, network, codec)
    if not path.exists():
        raise UsageError(
            f"{owner} must be a pretrained folder (config.json), a run directory or a .ckpt file, got {setting!r} "
            "(no such file or folder)"
        )
    from .trained_model import load_trained

    try:
        _, _, model, codec = load_trained(setting, resume_dir, command="fit")
    except UsageError as error:
        raise UsageError(f"{owner}: {error}") from None
    return InitialWeights(setting, model.net, codec)


def put_initial_weights(net, initial: InitialWeights) -> None:
    """Copy the weights into `net` (the run's network, built from `model.net`); a network of
    other shapes is refused in one line naming the settings that differ."""
    source, target = initial.network.state_dict(), net.state_dict()
    wrong = sorted(
        name
        for name in set(source) | set(target)
        if name not in source or name not in target or source[name].shape != target[name].shape
    )
    if wrong:
        theirs = getattr(initial.network, "config", {}) or {}
        ours = getattr(net, "config", {}) or {}
        fields = [
            f"model.net.{name}={theirs[name]!r} (got {ours.get(name)!r})"
            for name in _SHAPE_FIELDS
            if name in theirs and theirs[name] != ours.get(name)
        ]
        if not fields and theirs.get("sru_options") != ours.get("sru_options"):
            fields = [f"model.net.sru_options={theirs.get('sru_options')!r} (got {ours.get('sru_options')!r})"]
        needed = "; set " + ", ".join(fields) if fields else ""
        shown = ", ".join(wrong[:4]) + (" ..." if len(wrong) > 4 else "")
        raise UsageError(
            f"`model.{INIT_FROM_KEY}`: the weights of {initial.source!r} do not fit the network model.net describes "
            f"(tensors {shown}){needed}"
        )
    net.load_state_dict({name: tensor.to(target[name].dtype) for name, tensor in source.items()})


def initial_weights(cfg, command: str, start) -> InitialWeights | None:
    """The trained weights a new fit starts its network from (`model.init_from`), else None: a
    resumed fit, validate and test take their weights from their checkpoint."""
    setting = init_from_setting(cfg.model)
    if command != "fit" or start.checkpoint is not None or setting is None:
        return None
    return load_initial_weights(setting, str(cfg.get("resume_dir", "outputs")))
