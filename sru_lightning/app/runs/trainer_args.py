"""Check the `trainer.*` settings against `lightning.pytorch.Trainer`'s own annotations.

A wrong type otherwise surfaces deep inside Lightning as a bare `TypeError` that names no
setting (`trainer.max_steps=abc`); here it becomes one sentence naming the key, what it
accepts and what it got.
"""

from __future__ import annotations

import functools
import typing
from collections.abc import Mapping
from typing import Any

from sru_lightning.app.usage import UsageError

__all__ = ["check_trainer_settings"]


@functools.lru_cache(maxsize=1)
def _trainer_annotations() -> dict[str, Any]:
    import lightning.pytorch as pl

    try:
        return typing.get_type_hints(pl.Trainer.__init__)
    except Exception:  # annotations Lightning cannot resolve here: check nothing
        return {}


def _members(annotation: Any) -> list[Any]:
    if typing.get_origin(annotation) is typing.Union:
        return [member for arg in typing.get_args(annotation) for member in _members(arg)]
    return [annotation]


def _accepts(member: Any, value: Any) -> bool | None:
    """True/False for the simple types a config can hold; None for anything else."""
    if member is type(None):
        return value is None
    if member is bool:
        return isinstance(value, bool)
    if member is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if member is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if member is str:
        return isinstance(value, str)
    if typing.get_origin(member) is typing.Literal:
        return any(value == choice and type(value) is type(choice) for choice in typing.get_args(member))
    return None


def _describe(member: Any) -> str | None:
    if member is type(None):
        return "null"
    if member is bool:
        return "true/false"
    if member is int:
        return "an integer"
    if member is float:
        return "a number"
    if member is str:
        return "a string"
    if typing.get_origin(member) is typing.Literal:
        return "one of " + ", ".join(repr(choice) for choice in typing.get_args(member))
    return None


def check_trainer_settings(settings: Mapping[str, Any]) -> None:
    """Raise UsageError naming the first `trainer.<key>` whose value the Trainer cannot take.

    Mapping and list values (objects built with `_target_`) are left to Lightning, and so
    is any key whose annotation admits types a config cannot spell.
    """
    annotations = _trainer_annotations()
    for key, value in settings.items():
        annotation = annotations.get(key)
        if annotation is None or isinstance(value, (Mapping, list, tuple)):
            continue
        members = _members(annotation)
        if any(_accepts(member, value) for member in members):
            continue
        described = [text for text in (_describe(member) for member in members) if text]
        if not described:  # only object types: nothing a plain config value could match
            continue
        raise UsageError(f"`trainer.{key}` must be {' or '.join(described)}, got {value!r} ({type(value).__name__})")
    _check_training_happens(settings)
    max_steps = settings.get("max_steps")
    if isinstance(max_steps, int) and not isinstance(max_steps, bool) and (max_steps == 0 or max_steps < -1):
        raise UsageError(
            f"`trainer.max_steps` must be a positive number of optimizer steps, or -1 for no step "
            f"limit, got {max_steps}"
        )
    # Lightning takes any int: 0 turns per-step logging off, and a negative interval logs
    # every |n| steps as if it were positive (Python's modulo), so a typo goes unnoticed.
    log_every = settings.get("log_every_n_steps")
    if isinstance(log_every, int) and not isinstance(log_every, bool) and log_every < 0:
        raise UsageError(
            f"`trainer.log_every_n_steps` must be a positive number of steps, 0 to log no training steps, "
            f"or null for Lightning's default (50), got {log_every}"
        )


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_training_happens(settings: Mapping[str, Any]) -> None:
    """A fit that could make no optimizer step, or never validate on schedule, is a usage error."""
    max_epochs = settings.get("max_epochs")
    if _is_number(max_epochs) and (max_epochs == 0 or max_epochs < -1):
        raise UsageError(
            f"`trainer.max_epochs` must be a positive number of epochs, or -1 for no epoch limit, got {max_epochs}"
        )
    limit = settings.get("limit_train_batches")
    if _is_number(limit) and limit <= 0:
        raise UsageError(
            f"`trainer.limit_train_batches` must be a positive number of batches or a fraction in (0, 1], got {limit}"
        )
    _check_max_time(settings.get("max_time"))
    interval = settings.get("val_check_interval")
    if _is_number(interval) and (interval <= 0 or (isinstance(interval, float) and interval > 1.0)):
        raise UsageError(
            "`trainer.val_check_interval` must be a positive number of training batches or a fraction of the "
            f"epoch in (0, 1], got {interval}"
        )


def _check_max_time(max_time: Any) -> None:
    """`trainer.max_time` as Lightning reads a string or a mapping; a zero budget trains nothing."""
    if max_time is None:
        return
    expected = "a duration 'DD:HH:MM:SS' (or days/hours/minutes/seconds) above zero, or null for no time limit"
    if isinstance(max_time, str):
        parts = max_time.split(":")
        if len(parts) != 4 or not all(part.strip().isdigit() for part in parts):
            raise UsageError(f"`trainer.max_time` must be {expected}, got {max_time!r}")
        days, hours, minutes, seconds = (int(part) for part in parts)
        total = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    elif isinstance(max_time, Mapping):
        units = {"days": 86400, "hours": 3600, "minutes": 60, "seconds": 1}
        unknown = sorted(set(max_time) - set(units))
        if unknown or not all(_is_number(value) for value in max_time.values()):
            raise UsageError(f"`trainer.max_time` must be {expected}, got {dict(max_time)!r}")
        total = sum(units[key] * value for key, value in max_time.items())
    else:
        raise UsageError(f"`trainer.max_time` must be {expected}, got {max_time!r}")
    if total <= 0:
        raise UsageError(f"`trainer.max_time` must be {expected}, got {max_time!r}: it would train nothing")
