"""Callbacks a user's own Trainer takes: the recurrence precision policy
(:mod:`.precision`, :mod:`.tensor_cores`), a checkpoint on SIGTERM / Ctrl+C
(:mod:`.interrupts`, :mod:`.signal_watch`), an exact resume (:mod:`.resume`), a stop on a
non-finite loss (:mod:`.nonfinite_loss`), validation of the final weights of a `max_steps`
fit (:mod:`.validate_before_stop`) and training throughput (:mod:`.throughput`)."""

from .precision import SRUPrecisionCallback
from .tensor_cores import ShapeAdvice, TensorCoreShapeWarning, tensor_core_advice

__all__ = ["SRUPrecisionCallback", "ShapeAdvice", "TensorCoreShapeWarning", "tensor_core_advice"]
