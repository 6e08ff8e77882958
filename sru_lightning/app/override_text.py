"""`key=value` overrides written for Hydra's override grammar, for the commands the application
prints (resume a run, continue a sweep) and the hint of an override Hydra cannot parse.

Hydra reads a value unquoted only when it is made of ASCII letters, digits and a few symbols,
and reads `123`, `null`, `a,b` or `[x]` as other things than the string: a folder such as
`runs/it's dir ü/r2` must be quoted (`"runs/it's dir ü/r2"`). The printed command is also
quoted for the shell (`shlex`), so it runs as printed.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable

__all__ = ["command_line", "override", "quoting_hint"]


def _reads_back(text: str, value: str) -> bool:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    if "${" in value:  # an interpolation, whether quoted or not
        return False
    try:
        parsed = OverridesParser.create().parse_override(text)
    except Exception:  # any parse error means: quote it
        return False
    return not parsed.is_sweep_override() and parsed.value() == value


def override(key: str, value: str) -> str:
    """`key=value` that Hydra reads back as the string `value`: as it is where that parses so,
    else in Hydra's double quotes (with `${` escaped, so no interpolation is attempted)."""
    from hydra.core.override_parser.types import Quote, QuotedString

    plain = f"{key}={value}"
    if _reads_back(plain, value):
        return plain
    escaped = value.replace("${", "\\${")
    return f"{key}={QuotedString(escaped, Quote.double).with_quotes()}"


def command_line(words: Iterable[str]) -> str:
    """The words as one shell command line."""
    return " ".join(shlex.quote(word) for word in words)


def quoting_hint(text: str) -> str | None:
    """For an override Hydra cannot parse (`data.path=/data/ü.txt`): the same override quoted
    for Hydra and the shell, when that parses; None otherwise (the error is not about quoting)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    key, equals, value = text.partition("=")
    if not equals or not key or value[:1] in ("'", '"'):
        return None
    quoted = override(key, value)
    try:
        OverridesParser.create().parse_override(quoted)
    except Exception:  # the key itself, say: quoting the value is no help
        return None
    return shlex.quote(quoted) if quoted != text else None
