"""`model/optimizer=muon` through the command line: Muon steps the network's hidden matrices,
a resumed fit continues exactly, and engines that split matrices are refused in one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers.tiny_run import TINY_RUN

from sru_lightning.app import cli

# Constant learning rate, so a fit in two parts and one in a single part take the same steps.
MUON = [*TINY_RUN, "+trainer.enable_progress_bar=false", "model/optimizer=muon", "model.lr_scheduler=null"]
MUON += ["trainer.limit_train_batches=null", "logger=none"]


def fit(*overrides: str) -> int:
    return cli.main(["fit", *MUON, *overrides])


def last_checkpoint(run_dir: Path) -> dict:
    return torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


@pytest.mark.slow
def test_a_muon_fit_steps_hidden_matrices_with_muon_and_resumes_exactly(tmp_path):
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    assert fit("trainer.max_steps=6", f"hydra.run.dir={whole}") == 0
    assert fit("trainer.max_steps=3", f"hydra.run.dir={parts}") == 0
    assert fit("trainer.max_steps=6", f"ckpt_path={parts}", f"hydra.run.dir={parts}") == 0

    one, two = last_checkpoint(whole), last_checkpoint(parts)
    assert one["global_step"] == two["global_step"] == 6
    (saved,) = one["optimizer_states"]
    assert [group["rule"] for group in saved["param_groups"]] == ["muon", "adamw"]
    # Muon's groups hold momentum only; AdamW's hold its two moments.
    muon_ids, adamw_ids = (group["params"] for group in saved["param_groups"])
    assert muon_ids and all(set(saved["state"][i]) == {"momentum_buffer"} for i in muon_ids)
    assert all({"exp_avg", "exp_avg_sq"} <= set(saved["state"][i]) for i in adamw_ids)
    for name, tensor in one["state_dict"].items():
        torch.testing.assert_close(two["state_dict"][name], tensor, rtol=0, atol=0, msg=name)


@pytest.mark.slow
@pytest.mark.parametrize("trainer", ["deepspeed_stage_2", "fsdp", "fsdp2"])
def test_engines_that_split_matrices_refuse_muon_in_one_line(tmp_path, capsys, trainer):
    run_dir = tmp_path / "run"
    code = fit(f"trainer={trainer}", "trainer.accelerator=cpu", "trainer.devices=1", f"hydra.run.dir={run_dir}")
    err = capsys.readouterr().err
    assert code != 0
    assert "model/optimizer=muon" in err and "needs whole matrices" in err, err
    assert "Traceback" not in err
    assert not (run_dir / "checkpoints" / "last.ckpt").exists()
