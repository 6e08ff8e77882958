"""`key=value` settings of the tool commands (generate, export) checked against a dataclass.

OmegaConf converts and checks each value against the dataclass field's type; a string field
takes its value verbatim (no YAML parsing that would strip spaces or turn `yes` into true).
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import fields
from typing import TypeVar

T = TypeVar("T")

KINDS = {"str": "a string", "int": "an integer", "float": "a number", "bool": "true or false"}


def parse_key_values(argv: Sequence[str], settings_class: type[T], error: type[Exception]) -> tuple[T, dict[str, str]]:
    """(settings, the raw strings given) from `key=value` arguments; a problem raises `error`
    with one sentence naming the key, what it takes and what it got."""
    from omegaconf import OmegaConf
    from omegaconf.errors import ValidationError

    names = [field.name for field in fields(settings_class)]
    raw: dict[str, str] = {}
    for argument in argv:
        key, equals, value = argument.partition("=")
        if not equals:
            raise error(f"expected key=value, got {argument!r}; settings: {', '.join(names)}")
        if key not in names:
            close = difflib.get_close_matches(key, names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise error(f"unknown setting {key!r}{hint}; settings: {', '.join(names)}")
        raw[key] = value
    schema = OmegaConf.structured(settings_class)
    defaults = settings_class()
    for key, value in raw.items():
        try:
            schema[key] = value
        except ValidationError:
            kind = type(getattr(defaults, key)).__name__
            raise error(f"`{key}` must be {KINDS.get(kind, kind)}, got {value!r}") from None
    return settings_class(**OmegaConf.to_container(schema)), raw


def settings_usage(prog: str, purpose: str, settings_class: type) -> list[str]:
    """The opening lines of a tool command's help: usage, what it does, each setting and its default."""
    defaults = settings_class()
    lines = [f"usage: {prog} [key=value ...]", "", f"{purpose} Settings (default):"]
    lines += [f"  {field.name}={getattr(defaults, field.name)!r}" for field in fields(settings_class)]
    return lines
