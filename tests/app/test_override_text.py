"""Overrides the application prints (resume, continue a sweep) read back by Hydra as the folder
they name, whatever its characters; an override Hydra cannot parse gets the quoted form."""

from __future__ import annotations

import shlex

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from sru_lightning.app.override_text import command_line, override, quoting_hint

FOLDERS = [
    "/runs/plain-1.2_x",
    "runs/it's dir ü/r2",
    "/data/中文/运行",
    'a "quoted" name',
    "C:\\\\runs\\\\",
    "/tmp/${HOME}/x",
    "123",
    "null",
    "a,b",
    "[x]",
    "/x/\\",
]


@pytest.mark.parametrize("folder", FOLDERS)
def test_hydra_reads_back_the_folder_through_the_shell(folder):
    (word,) = shlex.split(command_line([override("hydra.run.dir", folder)]))
    parsed = OverridesParser.create().parse_override(word)
    # as the composed config gives it to the run (interpolation resolved)
    assert OmegaConf.create({"dir": parsed.value()}).dir == folder


def test_a_folder_hydra_reads_unquoted_stays_as_it_is():
    assert override("ckpt_path", "/runs/2026-01-01/12-00-00") == "ckpt_path=/runs/2026-01-01/12-00-00"


def test_an_unparsable_value_gets_its_quoted_form():
    assert quoting_hint("data.path=/data/ü.txt") == """'data.path="/data/ü.txt"'"""
    assert quoting_hint("data.path=/data/中文.txt") == """'data.path="/data/中文.txt"'"""
    assert quoting_hint("data.path=/data/plain.txt") is None  # parses already
    assert quoting_hint("dätä.path=x") is None  # the key is the problem: quoting is no help
