"""The SRU elementwise recurrence: entry points, precision policy, reference and extension."""

from . import (
    flops,  # noqa: F401  (FlopCounterMode formulas of the projection and attention ops)
    functional,
)
from .build import extension_available, load_extension
from .build_cuda import cuda_extension_available, load_cuda_extension
from .functional import sru_recurrence, sru_recurrence_inference
from .reference import sru_recurrence_reference
from .storage_dtype import POLICIES, accumulation_dtype, resolve_storage_dtype, validate_policy
from .tracing import KernelCall, trace_storage_dtypes

__all__ = [
    "POLICIES",
    "KernelCall",
    "accumulation_dtype",
    "cuda_extension_available",
    "extension_available",
    "functional",
    "load_cuda_extension",
    "load_extension",
    "resolve_storage_dtype",
    "sru_recurrence",
    "sru_recurrence_inference",
    "sru_recurrence_reference",
    "trace_storage_dtypes",
    "validate_policy",
]
