"""The one rule every command follows for a usage error: one line on stderr naming the setting,
what it accepts and what it got, exit status 2, no traceback.

Commands raise (:class:`UsageError`, or end with :class:`CommandExit`); the line is printed
here, by :func:`print_error`, and nowhere else."""

from __future__ import annotations

import sys

#: How the package's commands are started, the prefix of every message they print.
PROG = "python -m sru_lightning"


def command_prog(command: str) -> str:
    return f"{PROG} {command}"


def print_error(message: str, prog: str = PROG) -> None:
    """The one place an error line is printed: `<prog>: error: <message>` on stderr."""
    print(f"{prog}: error: {message}", file=sys.stderr, flush=True)


class CommandExit(SystemExit):
    """Leave the command with an exit status after its one error line (Hydra lets SystemExit pass)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(status)
        self.message = message


def error_exit(message: str, status: int, prog: str = PROG) -> CommandExit:
    """Print the error line now (inside Hydra's run, before its handlers close) and return the
    exit to raise."""
    print_error(message, prog)
    return CommandExit(message, status)


class UsageError(Exception):
    """A bad setting, or a checkpoint or config that cannot serve the command: reported as one
    line naming what was expected and what was given, exit status 2."""
