"""A callback a test adds to a real `fit` (`+callbacks.probe._target_=engine_probe.EngineProbe`)
to record, on every rank, what the engine really did: the per-step training losses, the
storage dtypes the recurrence kernels were called with, the regime the precision callback
reported, and whether the SRU layers' weights were really sharded between steps.

It writes `<out>/rank<k>.json` at the end of the fit.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from lightning.pytorch.callbacks import Callback

from sru_lightning.callbacks import SRUPrecisionCallback
from sru_lightning.nn import iter_sru_cells
from sru_lightning.ops import trace_storage_dtypes


def _local_and_full_sizes(trainer, cell) -> tuple[int, int]:
    """(elements this rank holds, elements of the whole weight) of an SRU layer's `weight`."""
    weight = cell.weight
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a torch without DTensor
        DTensor = ()
    if DTensor and isinstance(weight, DTensor):  # FSDP2
        return weight.to_local().numel(), weight.numel()
    if hasattr(weight, "ds_tensor"):  # DeepSpeed ZeRO-3: `weight` itself is empty between steps
        return weight.ds_tensor.numel(), int(weight.ds_numel)
    flat = getattr(trainer.strategy.model, "_flat_param", None)
    for module in trainer.strategy.model.modules():  # FSDP1: the layer's FlatParameter
        handle = getattr(module, "_handle", None)
        if handle is not None and any(sub is cell for sub in module.modules()) and module is not trainer.strategy.model:
            flat = handle.flat_param
    if flat is not None and hasattr(flat, "_unpadded_unsharded_size"):
        return flat._local_shard.numel(), flat._unpadded_unsharded_size.numel()
    return weight.numel(), weight.numel()


class EngineProbe(Callback):
    def __init__(self, out: str) -> None:
        super().__init__()
        self.out = Path(out)
        self.losses: list[float] = []
        self.shard_sizes: list[tuple[int, int]] = []
        self._trace = None
        self._calls = None

    def on_fit_start(self, trainer, pl_module) -> None:
        self._trace = trace_storage_dtypes()
        self._calls = self._trace.__enter__()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        self.losses.append(float(loss.detach().float()))
        cells = [cell for _, cell in iter_sru_cells(pl_module)]
        if cells:
            self.shard_sizes.append(_local_and_full_sizes(trainer, cells[0]))

    def on_fit_end(self, trainer, pl_module) -> None:
        self._trace.__exit__(None, None, None)
        precision = next(cb for cb in trainer.callbacks if isinstance(cb, SRUPrecisionCallback))
        regime = precision.regime
        record = {
            "rank": trainer.global_rank,
            "world_size": trainer.world_size,
            "strategy": type(trainer.strategy).__name__,
            "losses": self.losses,
            "finite": all(math.isfinite(value) for value in self.losses),
            "traced": sorted(
                {f"{call.direction}:{str(call.storage_dtype).replace('torch.', '')}" for call in self._calls}
            ),
            "reported_storage": str(regime.storage_dtype(precision.policy)).replace("torch.", ""),
            "reported_device": regime.device_type,
            "reported_autocast": str(regime.autocast_dtype).replace("torch.", ""),
            "shard_sizes": self.shard_sizes,
        }
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / f"rank{trainer.global_rank}.json").write_text(json.dumps(record))
