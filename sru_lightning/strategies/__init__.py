"""Lightning's DeepSpeed, FSDP and FSDP2 strategies, also on CPU.

Each class is Lightning's strategy of the same name where Lightning runs it (CUDA), and adds
what running on CPU processes (gloo) needs: Lightning refuses DeepSpeed and FSDP on CPU by its
own checks, not because the engines cannot run there. DeepSpeed selects its CPU accelerator by
itself when no GPU is present; FSDP and FSDP2 run on gloo.

* :class:`DeepSpeedStrategy` -- ZeRO stages 1-3; refuses a dtype the hardware cannot run
  (DeepSpeed fp16 on CPUs without fp16 kernels) with one sentence saying what works instead.
* :class:`FSDPStrategy` -- FSDP1 wrapping; gradient clipping by norm through the root
  module's own ``clip_grad_norm_`` (the sharded-correct one); full state dicts on CPU without
  the CPU offload that crashes there.
* :class:`FSDP2Strategy` -- FSDP2 (``fully_shard``) through Lightning's
  ``ModelParallelStrategy``: one shard group per recurrent layer and one for the root, and
  ``MixedPrecisionPolicy`` from ``Trainer(precision=...)``, for any LightningModule.
* :mod:`sru_lightning.strategies.fabric` -- the same three for ``lightning.fabric.Fabric``.
* :class:`AtomicCheckpointIO` -- checkpoint files that are complete or absent (written beside
  the target, then renamed), and a :class:`CheckpointWriteError` that names the file.
"""

from __future__ import annotations

from .checkpoint_io import AtomicCheckpointIO, CheckpointWriteError
from .deepspeed import DeepSpeedStrategy
from .fsdp import FSDPStrategy
from .fsdp2 import FSDP2Strategy, fsdp2_mixed_precision, shard_recurrent_model

__all__ = [
    "AtomicCheckpointIO",
    "CheckpointWriteError",
    "DeepSpeedStrategy",
    "FSDPStrategy",
    "FSDP2Strategy",
    "fsdp2_mixed_precision",
    "shard_recurrent_model",
]
