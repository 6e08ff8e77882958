"""The signals that stop a fit, and the small protocol between a callback that stops the fit on
one and whoever supervises the whole process.

A callback that stops the fit itself (a :class:`StopsOnSignal`, such as
:class:`~sru_lightning.callbacks.graceful_interrupt.GracefulInterrupt`) works alone in a user's
script. The command line also runs a supervisor of the process, which notices a signal even
while the main thread is blocked where Python cannot run a handler. That supervisor lives above
the library: it finds the callbacks among the trainer's and hands itself to them as their
:attr:`StopsOnSignal.supervisor`, and each callback calls :meth:`StopsOnSignal.notify_supervisor`
once it handles the signals itself. The library never needs to know who supervises.
"""

from __future__ import annotations

import signal
from typing import Protocol

__all__ = ["HANDLED_SIGNALS", "SignalSupervisor", "StopsOnSignal", "signal_name"]

# SIGUSR1 and SIGUSR2 are what schedulers send ahead of a preemption or time limit
# (`#SBATCH --signal=USR1@90`, submitit's USR2): the same stop as SIGTERM.
HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)


def signal_name(signum: int) -> str:
    """A signal as messages name it: `SIGTERM`, `SIGINT (Ctrl+C)`."""
    return "SIGINT (Ctrl+C)" if signum == signal.SIGINT else signal.Signals(signum).name


class SignalSupervisor(Protocol):
    """Watches the process's signals besides the callback (the command line's signal watch)."""

    def take_over(self, owner: StopsOnSignal) -> None:
        """From now on `owner` decides how a signal stops the fit; the supervisor only keeps time."""


class StopsOnSignal:
    """A callback that stops the fit itself on SIGTERM or Ctrl+C (GracefulInterrupt is one).

    A run whose trainer has such a callback is one a signal can stop with a checkpoint. Once the
    callback's handlers are in place it tells its supervisor, if it has one
    (:meth:`notify_supervisor`), which from then on only keeps time through
    :meth:`start_watchdog`.
    """

    #: Set on the callback by the process's supervisor; None in a script that has none.
    supervisor: SignalSupervisor | None = None

    def start_watchdog(self, signum: int) -> None:
        """End the process if the stop asked for by ``signum`` has not finished in time."""
        raise NotImplementedError

    def notify_supervisor(self) -> None:
        """Tell the supervisor, if any, that this callback now decides how a signal stops the fit."""
        if self.supervisor is not None:
            self.supervisor.take_over(self)
