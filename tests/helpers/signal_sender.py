"""A callback that sends a signal from inside a real fit, at a chosen point, for the signal tests.

Used through the CLI as an extra callback (the tests put this folder on PYTHONPATH):

    +callbacks.send_signal._target_=signal_sender.SendSignal +callbacks.send_signal.hook=on_before_backward
    +callbacks.send_signal.target=group +callbacks.send_signal.signum=15 +callbacks.send_signal.at_step=3

`target` is `group` (every process of the run, as a terminal or SLURM delivers it), or
`rank0` / `rank1` (only that rank signals itself). It fires once, the first time `hook` runs at
or after optimizer step `at_step`; `count=2` sends the signal twice (a double Ctrl+C).
"""

from __future__ import annotations

import os

import lightning.pytorch as pl

POINTS = {
    "on_train_batch_start": "forward",
    "on_before_backward": "backward",
    "on_before_optimizer_step": "optimizer step",
    "on_validation_batch_start": "validation",
    "on_save_checkpoint": "checkpoint saving",
}


class SendSignal(pl.Callback):
    def __init__(self, hook: str, target: str, signum: int, at_step: int = 3, count: int = 1) -> None:
        if hook not in POINTS:
            raise ValueError(f"SendSignal: `hook` must be one of {sorted(POINTS)}, got {hook!r}")
        if target not in ("group", "rank0", "rank1"):
            raise ValueError(f"SendSignal: `target` must be group, rank0 or rank1, got {target!r}")
        self.hook, self.target, self.signum, self.at_step, self.count = hook, target, int(signum), at_step, count
        self.sent = False
        setattr(self, hook, self._maybe_send)

    def _maybe_send(self, trainer: pl.Trainer, *args, **kwargs) -> None:
        if self.sent or trainer.sanity_checking or trainer.global_step < self.at_step:
            return
        self.sent = True
        for _ in range(self.count):
            if self.target == "group":
                if trainer.global_rank == 0:
                    os.killpg(os.getpgid(0), self.signum)
            elif trainer.global_rank == int(self.target[-1]):
                os.kill(os.getpid(), self.signum)
