"""Hydra's refusals of a command line told in one line: an override it cannot parse, and a
composition error (an unknown key or option, a key that moved), for every command that composes
the config."""

from __future__ import annotations

import dataclasses
import re

#: Hydra's refusal of an override of a key the config lacks (its first line names the key, its
#: next one the override to append it with: "To append to your config use +<key>=<value>").
_NOT_OVERRIDDEN = re.compile(r"Could not override '(?P<key>[^']+)'")


def moved_network_key(message: str) -> str | None:
    """The refusal of an override of a network setting under its old place (`model.hidden_size=`,
    now `model.net.hidden_size=`), naming the new one; None for any other message. The network's
    settings are :class:`~sru_lightning.nn.configs.LanguageNetConfig`'s fields."""
    from sru_lightning.nn.configs import LanguageNetConfig

    match = _NOT_OVERRIDDEN.search(message)
    if match is None:
        return None
    key = match.group("key")
    parts = key.split(".")
    network_keys = {field.name for field in dataclasses.fields(LanguageNetConfig)}
    if len(parts) < 2 or parts[0] != "model" or parts[1] not in network_keys:
        return None
    moved = "model.net." + ".".join(parts[1:])
    value = re.search(r"use \+" + re.escape(key) + r"=(?P<value>.*)$", message, re.MULTILINE)
    override = f"{moved}={value.group('value').strip()}" if value else f"{moved}=..."
    return f"`{key}` is a setting of the network, which moved to `{moved}`: use {override}"


def configuration_error(error: BaseException) -> str | None:
    """Hydra's composition errors (unknown key, missing option) as one line; None for anything else."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    if not isinstance(error, (HydraException, OmegaConfBaseException)):
        return None
    moved = moved_network_key(str(error))
    if moved is not None:
        return moved
    parts: list[str] = []
    for cause in (error, error.__cause__):
        if cause is None:
            continue
        options: list[str] = []
        for line in str(cause).splitlines():
            text = line.strip()
            if text.startswith("Config search path") or text.startswith("provider="):
                break
            if not text or text.startswith(("full_key:", "object_type=", "reference_type=")):
                continue
            if line.startswith("\t"):
                options.append(text)
                continue
            if options:
                parts[-1] += " " + ", ".join(options)
                options = []
            if text not in parts:
                parts.append(text.rstrip("."))
        if options:
            parts[-1] += " " + ", ".join(options)
    return "; ".join(parts) or type(error).__name__


def unparsable_override(overrides: list[str]) -> str | None:
    """Hydra's parse error names the bad token but not the override; name it here."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser = OverridesParser.create()
    for override in overrides:
        if override.startswith("-") or "=" not in override:
            continue  # Hydra's own flags and their values
        try:
            parser.parse_overrides([override])
        except OverrideParseException as error:
            from sru_lightning.app.override_text import quoting_hint

            message = f"cannot parse override {override!r}: {error.message.splitlines()[0]}"
            quoted = quoting_hint(override)
            return message + (f"; Hydra reads such a value only in quotes: {quoted}" if quoted else "")
    return None
