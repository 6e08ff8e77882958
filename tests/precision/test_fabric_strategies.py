"""Fabric's engines on two CPU processes, against the Trainer's: DeepSpeed ZeRO-2 and ZeRO-3,
FSDP and FSDP2 through sru_lightning.strategies (Trainer) and sru_lightning.strategies.fabric
(Fabric), in 32-true and bf16-mixed. Under each engine and precision the two front doors run
the recurrence in the same storage dtype, print the same report and train the same model on
the same data to the same per-step losses.

Run as a script (`python test_fabric_strategies.py ENGINE OUT`), this file is one process of
the 2-process run: it runs both precisions under Fabric, then under a Trainer, in the same
process group (Fabric launches the second process; the Trainer finds it started).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

PRECISIONS = {"32-true": "torch.float32", "bf16-mixed": "torch.bfloat16"}
ENGINES = ("deepspeed_stage_2", "deepspeed_stage_3", "fsdp", "fsdp2")


def trainer_strategy(engine: str):
    from sru_lightning import strategies

    if engine.startswith("deepspeed"):
        # The loader's windows are batches already (no batch sampler to read the size from).
        return strategies.DeepSpeedStrategy(stage=int(engine[-1]), logging_batch_size_per_gpu=4)
    return strategies.FSDPStrategy() if engine == "fsdp" else strategies.FSDP2Strategy()


def fabric_strategy(engine: str):
    from sru_lightning.strategies import fabric

    if engine.startswith("deepspeed"):
        return fabric.DeepSpeedStrategy(stage=int(engine[-1]))
    return fabric.FSDPStrategy() if engine == "fsdp" else fabric.FSDP2Strategy()


def both_front_doors(engine: str, out: Path) -> None:
    """One process of the 2-process run: every precision under Fabric, then under a Trainer."""
    from test_fabric import fabric_run, trainer_run

    def record(callback, losses, traced) -> dict:
        return {"report": callback.report, "storage": sorted(map(str, traced)), "losses": losses}

    rank = int(os.environ.get("LOCAL_RANK", "0"))  # set in the process Fabric starts
    results: dict[str, dict] = {}
    for precision in PRECISIONS:
        results[f"fabric {precision}"] = record(*fabric_run(precision, devices=2, strategy=fabric_strategy(engine)))
    for precision in PRECISIONS:
        strategy = trainer_strategy(engine)
        results[f"trainer {precision}"] = record(*trainer_run(precision, devices=2, rank=rank, strategy=strategy))
    Path(f"{out}.rank{rank}.json").write_text(json.dumps(results))


@pytest.mark.slow
@pytest.mark.parametrize("engine", ENGINES)
def test_fabric_engines_pick_the_trainers_storage_report_and_losses(engine, tmp_path):
    from helpers import distributed_fits

    out = tmp_path / engine
    command = [sys.executable, str(Path(__file__).resolve()), engine, str(out)]
    ended = distributed_fits.finish(distributed_fits.start(out, command=command), timeout=300)
    assert ended.returncode == 0, ended.stdout[-3000:]
    ranks = [json.loads(Path(f"{out}.rank{rank}.json").read_text()) for rank in range(2)]
    for results in ranks:
        for precision, storage in PRECISIONS.items():
            fabric, trainer = results[f"fabric {precision}"], results[f"trainer {precision}"]
            assert fabric["storage"] == trainer["storage"] == [storage], precision
            assert fabric["report"] == trainer["report"], precision
            assert "on cpu" in fabric["report"]
            assert len(fabric["losses"]) == 3
            # The same weights, data, optimizer and reduction: the same numbers, step by step.
            assert fabric["losses"] == trainer["losses"], precision
    assert ranks[0]["fabric 32-true"]["losses"] != ranks[1]["fabric 32-true"]["losses"]  # own streams


def test_fsdp2_refuses_an_optimizer_that_has_stepped_before_sharding():
    import torch

    from sru_lightning.nn import SRU
    from sru_lightning.strategies.fabric import FSDP2Strategy

    model = SRU(4, 4)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(3, 2, 4))[0].sum().backward()
    optimizer.step()
    with pytest.raises(ValueError, match=r"`optimizers` must have no state yet, got Adam with state for \d+"):
        FSDP2Strategy().setup_module_and_optimizers(model, [optimizer])


if __name__ == "__main__":
    both_front_doors(sys.argv[1], Path(sys.argv[2]))
