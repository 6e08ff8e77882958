"""A callback that holds a fit at a chosen step until the process is signalled, for the scheduler
tests: a tiny fit runs its steps in well under a second, far faster than a test can watch its
log and call `scancel`, so the test waits for the marker file this callback writes instead.

Used through the CLI as an extra callback (the tests put this folder on PYTHONPATH):

    +callbacks.pause._target_=pause_for_signal.PauseForSignal +callbacks.pause.at_step=6
    +callbacks.pause.marker=/tmp/x/paused

Every rank stops at the end of the batch that completes optimizer step `at_step` and waits, at
most `timeout` seconds, until its GracefulInterrupt has received a signal; rank 0 first
writes `marker`. Holding changes nothing the fit computes. A run that finds `marker` already
written at setup (the same job, requeued) does not hold again.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import lightning.pytorch as pl

from sru_lightning.callbacks import GracefulInterrupt


class PauseForSignal(pl.Callback):
    def __init__(self, at_step: int, marker: str, timeout: float = 60.0) -> None:
        self.at_step, self.marker, self.timeout = int(at_step), Path(marker), float(timeout)
        self.armed = True

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self.armed = not self.marker.exists()

    def on_train_batch_end(self, trainer: pl.Trainer, *args, **kwargs) -> None:
        if not self.armed or trainer.global_step < self.at_step:
            return
        self.armed = False
        graceful = next((cb for cb in trainer.callbacks if isinstance(cb, GracefulInterrupt)), None)
        if trainer.is_global_zero:
            self.marker.write_text(f"{trainer.global_step} {os.getpid()}\n")
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline and (graceful is None or graceful.received_signal is None):
            time.sleep(0.02)


class SignalOnce(pl.Callback):
    """tests/helpers/signal_sender.SendSignal, but once per run directory: a requeued job runs the
    same command (the same callback), and must not be stopped again. `marker` is written when
    the signal is sent; a run that finds it at setup sends nothing."""

    def __init__(self, marker: str, **send_signal) -> None:
        from signal_sender import SendSignal

        self.marker = Path(marker)
        self.sender = SendSignal(**send_signal)
        self.armed = True
        setattr(self, self.sender.hook, self._maybe_send)

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self.armed = not self.marker.exists()

    def _maybe_send(self, trainer: pl.Trainer, *args, **kwargs) -> None:
        if not self.armed or trainer.sanity_checking or trainer.global_step < self.sender.at_step:
            return
        self.armed = False
        if trainer.is_global_zero:
            self.marker.write_text(f"{trainer.global_step}\n")
        self.sender._maybe_send(trainer, *args, **kwargs)


class SignalAtMoments(pl.Callback):
    """One signal per attempt of a run, at the next of several moments: a job requeued after each
    stop runs the same command, and its attempt k sends the signal at moment k.

    `moments` is ``"hook@step/hook@step/..."`` (hooks of signal_sender.POINTS); moment k fires
    the first time its hook runs at or after optimizer step `step` (outside the sanity check).
    Rank 0 writes ``<marker_dir>/moment-<k>`` just before the signal goes to the whole process
    group; an attempt arms the first moment without a marker, so every moment fires once."""

    def __init__(self, moments: str, marker_dir: str, signum: int = 10) -> None:
        from signal_sender import POINTS

        self.moments = []
        for entry in moments.split("/"):
            hook, step = entry.split("@")
            if hook not in POINTS:
                raise ValueError(f"SignalAtMoments: each hook must be one of {sorted(POINTS)}, got {hook!r}")
            self.moments.append((hook, int(step)))
        self.marker_dir, self.signum = Path(marker_dir), int(signum)
        self.armed: int | None = None
        for hook in POINTS:
            setattr(self, hook, lambda trainer, *args, _hook=hook, **kwargs: self._maybe_send(_hook, trainer))

    def marker(self, index: int) -> Path:
        return self.marker_dir / f"moment-{index}"

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        fired = [index for index in range(len(self.moments)) if self.marker(index).exists()]
        self.armed = len(fired) if len(fired) < len(self.moments) else None

    def _maybe_send(self, hook: str, trainer: pl.Trainer) -> None:
        if self.armed is None or trainer.sanity_checking:
            return
        armed_hook, at_step = self.moments[self.armed]
        if hook != armed_hook or trainer.global_step < at_step:
            return
        index, self.armed = self.armed, None
        if trainer.is_global_zero:
            self.marker(index).write_text(f"{hook} at step {trainer.global_step}\n")
            os.killpg(os.getpgid(0), self.signum)
