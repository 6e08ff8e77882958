"""The one rule every command follows for a usage error: one line on stderr naming the setting,
what it accepts and what it got, exit status 2, no traceback."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn


class UsageError(Exception):
    """A bad setting, or a checkpoint or config that cannot serve the command: reported as one
    line naming what was expected and what was given, exit status 2."""


class CommandParser(argparse.ArgumentParser):
    """argparse with a one-line error (argparse prints the whole usage block first); `--help`
    still shows the usage."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message} (see --help)", file=sys.stderr)
        raise SystemExit(2)
