"""A 2-process `fit trainer=ddp_cpu` stopped by SIGTERM or Ctrl+C mid-epoch and resumed gives
the uninterrupted run's per-step losses bit for bit: the checkpoint carries every rank's
recurrent state (the language model's `carry_hidden`), and each rank continues from its own.

The signal goes to the whole process group, as a terminal's Ctrl+C and SLURM deliver it, from
inside the fit (tests/helpers/signal_sender.py) so the stop step is the same on every run.
"""

from __future__ import annotations

import shlex
import signal
import sys

import pytest
import torch
from helpers.distributed_fits import finish, result, run_fit, send_signal_callback, start, step_losses
from helpers.language_models import language_model

from sru_lightning.models.checkpoint_format import FORMAT_KEY, FORMAT_VERSION

MAX_STEPS, SIGNAL_AT_STEP = 30, 6


@pytest.fixture(scope="module")
def uninterrupted_losses(tmp_path_factory) -> dict[int, float]:
    run_dir = tmp_path_factory.mktemp("ddp") / "uninterrupted"
    ended = run_fit(run_dir, f"trainer.max_steps={MAX_STEPS}")
    assert ended.returncode == 0, ended.stdout[-3000:]
    losses = step_losses(run_dir)
    assert sorted(losses) == list(range(MAX_STEPS))
    return losses


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_ddp_fit_stopped_and_resumed_has_the_uninterrupted_losses(tmp_path, signum, uninterrupted_losses):
    run_dir = tmp_path / "run"
    stopped = run_fit(
        run_dir,
        f"trainer.max_steps={MAX_STEPS}",
        *send_signal_callback("on_before_backward", "group", signum, SIGNAL_AT_STEP),
        timeout=180,
    )
    assert stopped.returncode == 1, stopped.stdout[-3000:]
    assert not stopped.leftover, "every rank must end"
    checkpoint = torch.load(run_dir / "checkpoints" / "interrupted.ckpt", map_location="cpu", weights_only=True)
    stop_step = checkpoint["global_step"]
    assert SIGNAL_AT_STEP < stop_step < MAX_STEPS - 10
    carried = checkpoint["carried_train_state"]
    assert carried["world_size"] == 2 and len(carried["per_rank"]) == 2
    # each rank's own streams: different states, each (layers of) (batch, hidden)
    assert not torch.equal(carried["per_rank"][0][0], carried["per_rank"][1][0])
    assert carried["per_rank"][0][0].shape == (4, 32)
    name = "SIGINT" if signum == signal.SIGINT else "SIGTERM"
    assert name in result(run_dir)["error"]

    # The printed command, without the callback that sent the signal.
    command = [
        word
        for word in shlex.split(stopped.stdout.split("resume with: ", 1)[1].splitlines()[0])
        if not word.startswith("+callbacks.send_signal")
    ]
    resumed = finish(start(run_dir, command=[sys.executable, *command[1:]], log=tmp_path / "resumed.out"), timeout=240)
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    losses = step_losses(run_dir)
    assert sorted(losses) == list(range(MAX_STEPS))
    differing = {
        step: (losses[step], uninterrupted_losses[step])
        for step in losses
        if losses[step] != uninterrupted_losses[step]
    }
    assert not differing, f"{len(differing)} of {MAX_STEPS} steps differ after the resume at {stop_step}: {differing}"


class _Trainer:
    """What `on_load_checkpoint` reads from the trainer."""

    def __init__(self, world_size: int, global_rank: int, fn: str = "fit") -> None:
        from types import SimpleNamespace

        self.world_size, self.global_rank = world_size, global_rank
        self.state = SimpleNamespace(fn=fn)


def carried_state_after_load(saved: dict, world_size: int, global_rank: int, fn: str = "fit"):
    model = language_model(vocab_size=5, embedding_dim=4, hidden_size=6, num_layers=1)
    model._trainer = _Trainer(world_size, global_rank, fn)
    model.on_load_checkpoint({"carried_train_state": saved, FORMAT_KEY: FORMAT_VERSION})
    return model.carried.get("train")


def test_each_rank_restores_its_own_carried_state():
    per_rank = [(torch.full((2, 6), 0.5),), (torch.full((2, 6), -1.0),)]
    saved = {"world_size": 2, "per_rank": per_rank}
    assert carried_state_after_load(saved, 2, 1) is per_rank[1]
    assert carried_state_after_load(saved, 2, 0) is per_rank[0]


def test_another_world_size_starts_from_zeros_with_one_warning():
    saved = {"world_size": 2, "per_rank": [(torch.ones(2, 6),), (torch.ones(2, 6),)]}
    with pytest.warns(UserWarning, match="recurrent state of 2 process.*this fit runs 1.*zero state"):
        assert carried_state_after_load(saved, 1, 0) is None


def test_evaluating_another_world_sizes_checkpoint_says_nothing_of_training_state():
    import warnings

    saved = {"world_size": 2, "per_rank": [(torch.ones(2, 6),), (torch.ones(2, 6),)]}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the zero-state warning is about resuming a fit only
        assert carried_state_after_load(saved, 1, 0, fn="validate") is None
