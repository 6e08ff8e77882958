"""Callbacks a user's own Trainer takes: the recurrence precision policy, fault tolerance
(graceful interrupts, exact resume) and guards that keep a run honest."""

from .precision import SRUPrecisionCallback
from .tensor_cores import ShapeAdvice, TensorCoreShapeWarning, tensor_core_advice

__all__ = ["SRUPrecisionCallback", "ShapeAdvice", "TensorCoreShapeWarning", "tensor_core_advice"]
