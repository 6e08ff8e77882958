"""The one grammar of the tool commands (sru_lightning/app/key_value.py): settings declared once,
parsed and checked from `key=value`, their help built from the declaration, and the old `--flag`
spellings translated with one notice."""

from __future__ import annotations

import dataclasses

import pytest

from sru_lightning.app import cli, key_value
from sru_lightning.app.key_value import setting


class Refused(Exception):
    pass


@dataclasses.dataclass
class Example:
    length: int = setting(128, "sequence length", at_least=1)
    rate: float = setting(0.5, "a rate")
    dtype: str = setting("fp32", "storage", choices=("fp32", "bf16"))
    parts: str = setting("a,b", "which parts", choices=("a", "b", "c"), listing=True)
    curve: bool = setting(False, "draw the curve")
    include_peer: bool = setting(True, "time the peer too", old_flag=("--no-peer", "false"))
    prompt: str = setting("The ", "text, taken verbatim")
    internal: int = 3  # not a setting: not parsed, not listed


def parse(*argv: str):
    return key_value.parse_key_values(argv, Example, Refused)[0]


def test_values_are_converted_to_the_declared_types_and_strings_kept_verbatim():
    parsed = parse("length=7", "rate=1e-3", "curve=true", "prompt= yes ", "parts=c,a")
    assert (parsed.length, parsed.rate, parsed.curve, parsed.prompt, parsed.parts) == (7, 1e-3, True, " yes ", "c,a")
    assert parse() == Example()


@pytest.mark.parametrize(
    "argument, message",
    [
        ("lenght=3", "unknown setting 'lenght' (did you mean 'length'?); settings: length, rate, dtype, parts, curve,"),
        ("internal=4", "unknown setting 'internal'"),
        ("length", "expected key=value, got 'length'"),
        ("length=x", "`length` must be an integer, got 'x'"),
        ("length=0", "`length` must be an integer >= 1, got 0"),
        ("rate=fast", "`rate` must be a number, got 'fast'"),
        ("curve=maybe", "`curve` must be true or false, got 'maybe'"),
        ("dtype=fp8", "`dtype` must be one of fp32, bf16, got 'fp8'"),
        ("parts=a,d", "`parts` must be one of a, b, c (comma-separated), got 'a,d'"),
    ],
)
def test_a_bad_setting_is_one_sentence_naming_the_key_what_it_takes_and_what_it_got(argument, message):
    with pytest.raises(Refused) as refused:
        parse(argument)
    assert message in str(refused.value)


def test_old_flags_are_translated_and_named_in_one_notice():
    argv, old, new = key_value.translate_old_flags(
        ["--length", "8", "--rate=0.1", "--curve", "--no-peer", "--parts", "a", "c", "--prompt", "a b", "dtype=bf16"],
        Example,
        Refused,
    )
    assert argv == ["length=8", "rate=0.1", "curve=true", "include_peer=false", "parts=a,c", "prompt=a b", "dtype=bf16"]
    assert key_value.old_flags_notice(old, new) == (
        "note: `--length 8 --rate=0.1 --curve --no-peer --parts a c --prompt 'a b'` is now `length=8 rate=0.1 "
        "curve=true include_peer=false parts=a,c 'prompt=a b'`; the --flag form goes away in the next release"
    )


def test_read_settings_prints_the_notice_once_and_only_for_old_flags(capsys):
    settings, _ = key_value.read_settings(["--length", "9", "--curve"], Example, Refused, old_flags=True)
    assert (settings.length, settings.curve) == (9, True)
    assert capsys.readouterr().err.splitlines() == [
        "note: `--length 9 --curve` is now `length=9 curve=true`; the --flag form goes away in the next release"
    ]
    key_value.read_settings(["length=9"], Example, Refused, old_flags=True)
    assert capsys.readouterr().err == ""
    with pytest.raises(Refused, match="expected key=value, got '--length'"):  # commands that never took flags
        key_value.read_settings(["--length", "9"], Example, Refused)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--lenght", "3"], "unknown setting '--lenght' (did you mean 'length'?)"),
        (["--length"], "`--length` (now `length=...`) needs a value, got nothing"),
        (["--length", "--curve"], "`--length` (now `length=...`) needs a value, got nothing"),
    ],
)
def test_an_old_flag_that_cannot_be_translated_is_refused_naming_it(argv, message):
    with pytest.raises(Refused) as refused:
        key_value.translate_old_flags(argv, Example, Refused)
    assert message in str(refused.value)


def test_help_lists_each_declared_setting_with_its_default_and_help_in_one_format():
    text = key_value.command_usage("prog", "Does a thing.", Example, notes=["A note."], examples=["prog length=3"])
    lines = text.splitlines()
    assert lines[:5] == ["usage: prog [key=value ...]", "", "Does a thing.", "", "Settings (key=default):"]
    assert lines[5].split(None, 1) == ["length=128", "sequence length"]
    assert "  dtype=fp32" in text and "storage (fp32 | bf16)" in text
    assert "which parts (comma-separated, of a, b, c)" in text
    assert "  curve=false" in text and "  include_peer=true" in text and "  prompt='The '" in text
    assert "internal" not in text
    assert lines[-4:] == ["A note.", "", "Example:", "  prog length=3"]


@pytest.mark.parametrize("words", [["--help"], ["-h"], ["help"], ["help=true"], ["length=3", "--help"]])
def test_every_spelling_of_help_asks_for_it(words):
    assert key_value.wants_help(words)
    assert not key_value.wants_help(["length=3", "prompt=help me"])


@pytest.mark.parametrize("command", sorted(cli.TOOL_COMMANDS))
def test_every_tool_command_prints_its_help_in_the_one_format(command, capsys):
    assert cli.main([command, "--help"]) == 0
    text = capsys.readouterr().out
    if command == "bench":
        assert text.startswith("usage: python -m sru_lightning bench <subcommand> [key=value ...]")
        assert cli.main([command, "op", "help=true"]) == 0
        text = capsys.readouterr().out
        command = "bench op"
    assert text.startswith(f"usage: python -m sru_lightning {command} [key=value ...]\n"), text
    assert "\nSettings (key=default):\n" in text
