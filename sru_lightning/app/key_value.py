"""`key=value` settings of the tool commands (generate, export, serve) checked against a
dataclass, and what those commands share: their help text, the words that ask for it, and the
`device` setting's check.

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


#: An argument among these asks a tool command for its help instead of running it.
HELP_WORDS = ("-h", "--help", "help")


def wants_help(argv: Sequence[str]) -> bool:
    """Whether the command line asks for the command's help."""
    return any(argument in HELP_WORDS for argument in argv)


def settings_usage(prog: str, purpose: str, settings_class: type) -> list[str]:
    """The opening lines of a tool command's help: usage, what it does, each setting and its default."""
    defaults = settings_class()
    lines = [f"usage: {prog} [key=value ...]", "", f"{purpose} Settings (default):"]
    lines += [f"  {field.name}={getattr(defaults, field.name)!r}" for field in fields(settings_class)]
    return lines


def command_usage(prog: str, purpose: str, settings_class: type, notes: Sequence[str], examples: Sequence[str]) -> str:
    """A tool command's whole help: its settings (`settings_usage`), a paragraph of notes, then
    example command lines."""
    lines = settings_usage(prog, purpose, settings_class)
    lines += ["", *notes, "", "Example:", *(f"  {example}" for example in examples)]
    return "\n".join(lines)


def check_device(device: str, error: type[Exception]) -> None:
    """`device` must be "cpu", or "cuda" where torch sees a CUDA device; raises `error` otherwise."""
    import torch

    if device not in ("cpu", "cuda"):
        raise error(f"`device` must be 'cpu' or 'cuda', got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise error("`device` is 'cuda', but torch sees no CUDA device here; use device=cpu")
