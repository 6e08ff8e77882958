"""Which precision regime a Lightning Trainer (or a Fabric) trains in, and what that means for
the recurrence.

An SRU layer is a matmul (``U = x @ W``) followed by a custom recurrence kernel. The matmul's
output dtype -- A, "the U dtype" -- follows the weights' dtype and the active autocast (or
APEX's function patching); the kernel then stores its tensors in a dtype picked by the
recurrence policy (``sru_lightning.ops.resolve_storage_dtype``) and accumulates in float32.

:func:`detect_regime` reads a Trainer or a Fabric (or a strategy, or a precision plugin of
either) and returns a :class:`Regime`: the weights' dtype, the autocast dtype, the expected U
dtype and, for every policy, the storage and accumulation dtypes the kernel will run in.
Sources, most specific first:

* DeepSpeed (read by :mod:`sru_lightning.precision.deepspeed`): the config sections ``amp``
  (APEX AMP inside DeepSpeed), ``fp16``, ``bf16`` (alias ``bfloat16``) and ``torch_autocast``;
  a section Lightning will add at setup from ``precision=`` counts as present.
* FSDP: ``FSDPStrategy(mixed_precision=MixedPrecision(param_dtype=...))``, else the plugin.
* The precision plugin: ``Precision`` (32-true), ``DoublePrecision``, ``MixedPrecision``
  (16-mixed / bf16-mixed), ``HalfPrecision`` (16-true / bf16-true),
  ``TransformerEnginePrecision``, ``BitsandbytesPrecision``, or a plugin's precision string.
* APEX AMP initialised by the user (``amp.initialize(..., opt_level="O1")``) on top of a
  32-true Trainer.

Modules import one way, each only from the levels below it: :mod:`.regime` (the Regime
type) at the bottom; the readers :mod:`.lightning`, :mod:`.fsdp` and :mod:`.apex` (APEX AMP:
registration with ``apex.amp`` and its regime) above it; :mod:`.deepspeed` above those (its
``amp`` section is APEX's regime); :mod:`.detect` on top. :mod:`.cpu_half` stands apart (it
needs only torch): whether this CPU multiplies half-precision matrices natively, for the report.
"""

from __future__ import annotations

from .detect import detect_regime
from .regime import Regime, dtype_name, regime_from_dtypes

__all__ = ["Regime", "detect_regime", "regime_from_dtypes", "dtype_name"]
