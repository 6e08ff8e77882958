"""A trained language model and its vocabulary, rebuilt from a run's checkpoint alone (its
hyperparameters and the data module's saved vocabulary), for the commands that use a trained
model without training it: generate, serve, export, and the diagnostics that measure one.

Every problem (no such checkpoint, a checkpoint that does not rebuild, no or a mismatched
vocabulary) is a :class:`~sru_lightning.app.usage.UsageError` in one line.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sru_lightning.app.usage import UsageError

__all__ = ["build_model", "load_codec", "load_trained", "read_checkpoint"]


def load_trained(setting: str, resume_dir: str, command: str = "generate"):
    """(path, checkpoint, model, codec) of the trained run `ckpt_path` names, the model in eval
    mode; a problem, including a vocabulary that does not match the model, raises UsageError."""
    path, checkpoint = read_checkpoint(setting, resume_dir, command)
    model = build_model(checkpoint, path)
    codec = load_codec(checkpoint, path)
    if codec.vocab_size != model.net.vocab_size:
        raise UsageError(
            f"the vocabulary of {str(path)!r} has {codec.vocab_size} tokens but the model "
            f"{model.net.vocab_size}; the checkpoint does not match its run's data config"
        )
    return path, checkpoint, model, codec


def read_checkpoint(setting: str, resume_dir: str, command: str = "generate") -> tuple[Path, dict[str, Any]]:
    """The checkpoint `ckpt_path` names (see `model_checkpoint`) and its contents; a problem
    raises UsageError in one line."""
    from .checkpoints import CheckpointError
    from .ckpt_path import read_trained_checkpoint

    try:
        return read_trained_checkpoint(setting, resume_dir, command)
    except CheckpointError as error:
        raise UsageError(str(error).splitlines()[0]) from None


def build_model(checkpoint: Mapping[str, Any], path: Path):
    """The language model the checkpoint was saved from, with its weights, in eval mode."""
    from sru_lightning.models import SRULanguageModel

    hyper_parameters = dict(checkpoint["hyper_parameters"])
    try:
        with warnings.catch_warnings():
            # The run already warned about its own configuration; using the model changes nothing.
            warnings.simplefilter("ignore", FutureWarning)
            model = SRULanguageModel(**hyper_parameters)
        model.load_state_dict(checkpoint["state_dict"])
    except (TypeError, ValueError, RuntimeError) as error:
        raise UsageError(f"cannot rebuild the model of {str(path)!r}: {str(error).splitlines()[0]}") from None
    return model.eval()


def load_codec(checkpoint: Mapping[str, Any], path: Path):
    """The vocabulary the data module saved with the checkpoint."""
    from sru_lightning.data import TokenCodec

    for entry in checkpoint.values():  # Lightning files the data module's state under its class name
        if isinstance(entry, Mapping) and isinstance(entry.get("token_codec"), Mapping):
            try:
                return TokenCodec.from_state_dict(entry["token_codec"])
            except (ValueError, TypeError, KeyError, ImportError) as error:
                reason = str(error).splitlines()[0] if str(error) else type(error).__name__
                where = f"the checkpoint {str(path)!r}"
                raise UsageError(f"the vocabulary saved in {where} cannot be read: {reason}") from None
    raise UsageError(
        f"the checkpoint {str(path)!r} holds no vocabulary (its data module saved none): use a "
        "checkpoint of a run of sru_lightning's data modules"
    )
