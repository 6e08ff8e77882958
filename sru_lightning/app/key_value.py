"""The one grammar of the tool commands (generate, export, serve, prepare, build, bench,
fidelity, gpu-check): `key=value` settings declared once, as the fields of a dataclass, and
what every such command derives from that declaration: the parsing, the checks, the help
text, the words that ask for it, and the translation of the `--flag` spellings that bench,
build, fidelity and gpu-check took before.

A setting is a dataclass field made by :func:`setting`: its name and type are the field's, its
default and help (and optional lower bound, choices and old flag spelling) are given there.
Fields made without :func:`setting` are not settings (a benchmark's internal knobs).

OmegaConf converts and checks each value against the field's type; a string field takes its
value verbatim (no YAML parsing that would strip spaces or turn `yes` into true).
"""

from __future__ import annotations

import difflib
import shlex
import sys
import textwrap
from collections.abc import Sequence
from dataclasses import MISSING, Field, field, fields
from typing import Any, TypeVar

T = TypeVar("T")

KINDS = {"str": "a string", "int": "an integer", "float": "a number", "bool": "true or false"}

#: An argument among these asks a tool command for its help instead of running it.
HELP_WORDS = ("-h", "--help", "help", "help=true")


def setting(
    default: Any,
    help: str,
    *,
    at_least: float | None = None,
    choices: Sequence[str] = (),
    listing: bool = False,
    old_flag: tuple[str, str] | None = None,
) -> Any:
    """A tool command's setting, declared once: its default and what it does (`help`); values
    below `at_least` or outside `choices` are refused; `listing`: the value is a comma-separated
    list (each item checked against `choices`); `old_flag`: an old switch and the value it set
    (`("--no-peer", "false")`) where the switch is not `--<name>`."""
    metadata = {"help": help, "at_least": at_least, "choices": tuple(choices), "listing": listing}
    return field(default=default, metadata={**metadata, "old_flag": old_flag})


def declared(settings_class: type) -> list[Field]:
    """The settings of a settings class: its fields made by :func:`setting`, in order."""
    return [item for item in fields(settings_class) if "help" in item.metadata]


def _default(item: Field) -> Any:
    return item.default if item.default is not MISSING else item.default_factory()


def _kind(item: Field) -> str:
    return type(_default(item)).__name__


# --------------------------------------------------------------------------------------------
# parsing
def parse_key_values(argv: Sequence[str], settings_class: type[T], error: type[Exception]) -> tuple[T, dict[str, str]]:
    """(settings, the raw strings given) from `key=value` arguments; a problem raises `error`
    with one sentence naming the key, what it takes and what it got."""
    from omegaconf import OmegaConf
    from omegaconf.errors import ValidationError

    settings = {item.name: item for item in declared(settings_class)}
    names = list(settings)
    raw: dict[str, str] = {}
    for argument in argv:
        key, equals, value = argument.partition("=")
        if not equals:
            raise error(f"expected key=value, got {argument!r}; settings: {', '.join(names)}")
        if key not in settings:
            close = difflib.get_close_matches(key, names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise error(f"unknown setting {key!r}{hint}; settings: {', '.join(names)}")
        raw[key] = value
    schema = OmegaConf.structured(settings_class)
    for key, value in raw.items():
        try:
            schema[key] = value
        except ValidationError:
            kind = _kind(settings[key])
            raise error(f"`{key}` must be {KINDS.get(kind, kind)}, got {value!r}") from None
    parsed = settings_class(**OmegaConf.to_container(schema))
    for key in raw:
        _check_bounds(settings[key], getattr(parsed, key), error)
    return parsed, raw


def _check_bounds(item: Field, value: Any, error: type[Exception]) -> None:
    least, choices = item.metadata["at_least"], item.metadata["choices"]
    if least is not None and value < least:
        kind = "an integer" if isinstance(value, int) else "a number"
        raise error(f"`{item.name}` must be {kind} >= {least:g}, got {value}")
    if choices:
        given = [part.strip() for part in value.split(",")] if item.metadata["listing"] else [value]
        wrong = [part for part in given if part not in choices]
        if wrong or not given:
            many = " (comma-separated)" if item.metadata["listing"] else ""
            raise error(f"`{item.name}` must be one of {', '.join(choices)}{many}, got {value!r}")


def read_settings(
    argv: Sequence[str], settings_class: type[T], error: type[Exception], *, old_flags: bool = False
) -> tuple[T, dict[str, str]]:
    """:func:`parse_key_values`, after translating the old `--flag` spellings where the command
    took them (`old_flags`), with one notice line on stderr naming the new form."""
    if old_flags:
        argv, old, new = translate_old_flags(argv, settings_class, error)
        if old:
            print(old_flags_notice(old, new), file=sys.stderr, flush=True)
    return parse_key_values(argv, settings_class, error)


def translate_old_flags(
    argv: Sequence[str], settings_class: type, error: type[Exception]
) -> tuple[list[str], list[str], list[str]]:
    """(argv in `key=value` form, the old words translated, the settings they became):
    `--name value`, `--name=value`, a switch `--name` (true) and the switches named by a
    setting's `old_flag`; a listing setting takes every word up to the next `--` or `=`."""
    settings = {item.name: item for item in declared(settings_class)}
    switches = {item.metadata["old_flag"][0]: item for item in settings.values() if item.metadata["old_flag"]}
    result, old, new = [], [], []
    words = list(argv)
    index = 0
    while index < len(words):
        word = words[index]
        index += 1
        if not word.startswith("--") or word in HELP_WORDS:
            result.append(word)
            continue
        flag, equals, value = word.partition("=")
        if flag in switches:
            item = switches[flag]
            translated, taken = f"{item.name}={item.metadata['old_flag'][1]}", [word]
        else:
            name = flag[2:].replace("-", "_")
            item = settings.get(name)
            if item is None:
                close = difflib.get_close_matches(name, list(settings), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise error(f"unknown setting {flag!r}{hint}; settings: {', '.join(settings)}")
            taken = [word]
            if not equals and _kind(item) == "bool":
                value = "true"
            elif not equals:
                values = []
                while index < len(words) and (not values or item.metadata["listing"]):
                    following = words[index]
                    if following.startswith("--") or (values and "=" in following):
                        break
                    values.append(following)
                    index += 1
                if not values:
                    raise error(f"`{flag}` (now `{name}=...`) needs a value, got nothing")
                taken += values
                value = ",".join(values)
            translated = f"{name}={value}"
        result.append(translated)
        old.append(shlex.join(taken))
        new.append(shlex.quote(translated) if " " in translated else translated)
    return result, old, new


def old_flags_notice(old: Sequence[str], new: Sequence[str]) -> str:
    """The one line a command prints when it translated old `--flag` spellings."""
    return f"note: `{' '.join(old)}` is now `{' '.join(new)}`; the --flag form goes away in the next release"


# --------------------------------------------------------------------------------------------
# help
def wants_help(argv: Sequence[str]) -> bool:
    """Whether the command line asks for the command's help."""
    return any(argument in HELP_WORDS for argument in argv)


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return shlex.quote(value)
    if value is None:
        return "''"
    return str(value)


def settings_lines(settings_class: type) -> list[str]:
    """One entry per setting: `name=default`, then its help, wrapped under the column."""
    items = declared(settings_class)
    heads = [f"  {item.name}={_shown(_default(item))}" for item in items]
    width = min(max(map(len, heads), default=0) + 2, 34)
    lines = []
    for head, item in zip(heads, items):
        words = item.metadata["help"]
        if item.metadata["choices"] and item.metadata["listing"]:
            words += f" (comma-separated, of {', '.join(item.metadata['choices'])})"
        elif item.metadata["choices"]:
            words += f" ({' | '.join(item.metadata['choices'])})"
        wrapped = textwrap.wrap(words, 100 - width) or [""]
        first = f"{head:<{width}}{wrapped[0]}" if len(head) < width else f"{head}\n{'':<{width}}{wrapped[0]}"
        lines.append(first)
        lines += [f"{'':<{width}}{line}" for line in wrapped[1:]]
    return lines


def settings_usage(prog: str, purpose: str, settings_class: type) -> list[str]:
    """The opening lines of a tool command's help: usage, what it does, each setting and its default."""
    lines = [f"usage: {prog} [key=value ...]", "", *textwrap.wrap(purpose, 100), "", "Settings (key=default):"]
    return lines + settings_lines(settings_class)


def command_usage(
    prog: str, purpose: str, settings_class: type, notes: Sequence[str] = (), examples: Sequence[str] = ()
) -> str:
    """A tool command's whole help: its settings (`settings_usage`), a paragraph of notes, then
    example command lines."""
    lines = settings_usage(prog, purpose, settings_class)
    if notes:
        lines += ["", *notes]
    if examples:
        lines += ["", "Example:" if len(examples) == 1 else "Examples:", *(f"  {example}" for example in examples)]
    return "\n".join(lines)


def subcommands_usage(prog: str, purpose: str, subcommands: dict[str, str], notes: Sequence[str] = ()) -> str:
    """The help of a command made of subcommands (bench): each subcommand and what it does."""
    lines = [f"usage: {prog} <subcommand> [key=value ...]", "", *textwrap.wrap(purpose, 100), "", "Subcommands:"]
    width = max(map(len, subcommands)) + 4
    for name, text in subcommands.items():
        wrapped = textwrap.wrap(text, 100 - width)
        lines += [f"  {name:<{width - 2}}{wrapped[0]}", *(f"{'':<{width}}{line}" for line in wrapped[1:])]
    if notes:
        lines += ["", *notes]
    return "\n".join(lines)


def check_device(device: str, error: type[Exception]) -> None:
    """`device` must be "cpu", or "cuda" where torch sees a CUDA device; raises `error` otherwise."""
    import torch

    if device not in ("cpu", "cuda"):
        raise error(f"`device` must be 'cpu' or 'cuda', got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise error("`device` is 'cuda', but torch sees no CUDA device here; use device=cpu")
