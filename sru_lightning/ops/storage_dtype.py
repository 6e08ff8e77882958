"""Precision policy at the recurrence boundary: which dtype the kernel stores tensors in.

Let A be the dtype of ``U`` (what the input matmul produced, so it already reflects autocast
or the weights' dtype). The recurrence picks a storage dtype S, casts every floating input
to S, accumulates in float32 (float64 when S is float64) and hands h and c back in A.

========  ==================================================================
policy    storage dtype S
========  ==================================================================
``fp32``  float32 (float64 when A is float64)
``half``  A when A is fp16/bf16; else the active autocast dtype; else float32
``auto``  ``half`` in every half regime, float32/float64 otherwise
========  ==================================================================
"""

from __future__ import annotations

import torch

POLICIES = ("auto", "fp32", "half")

HALF_DTYPES = (torch.float16, torch.bfloat16)


def validate_policy(policy, argument: str = "policy") -> str:
    """Return ``policy`` when it is one of :data:`POLICIES`, else raise naming ``argument``."""
    if not isinstance(policy, str):
        raise TypeError(f"`{argument}` must be a str, one of {POLICIES}, got {type(policy).__name__} {policy!r}")
    if policy not in POLICIES:
        raise ValueError(f"`{argument}` must be one of {POLICIES}, got {policy!r}")
    return policy


def active_autocast_dtype(device_type: str | None = None) -> torch.dtype | None:
    """The autocast dtype in force for ``device_type`` (any device when None), or None."""
    device_types = (device_type,) if device_type is not None else ("cuda", "cpu")
    for kind in device_types:
        if kind in ("cuda", "cpu", "xpu", "mps") and torch.is_autocast_enabled(kind):
            return torch.get_autocast_dtype(kind)
    return None


def resolve_storage_dtype(policy: str, u_dtype: torch.dtype, *, device_type: str | None = None) -> torch.dtype:
    """Storage dtype of the recurrence for ``policy`` when ``U`` has dtype ``u_dtype``.

    ``device_type`` selects whose autocast state counts ("cpu", "cuda", ...); None looks at
    CUDA first, then CPU.
    """
    validate_policy(policy)
    if not isinstance(u_dtype, torch.dtype) or not u_dtype.is_floating_point:
        raise TypeError(f"`u_dtype` must be a floating torch.dtype, got {u_dtype!r}")
    if policy == "fp32":
        return torch.float64 if u_dtype == torch.float64 else torch.float32
    if policy == "auto" and u_dtype == torch.float64:
        return torch.float64
    # "half", and "auto" outside float64: follow the half regime when there is one.
    if u_dtype in HALF_DTYPES:
        return u_dtype
    autocast_dtype = active_autocast_dtype(device_type)
    if autocast_dtype in HALF_DTYPES:
        return autocast_dtype
    return torch.float32


def accumulation_dtype(storage_dtype: torch.dtype) -> torch.dtype:
    """Dtype the kernel accumulates in: float64 for float64 storage, float32 otherwise."""
    return torch.float64 if storage_dtype == torch.float64 else torch.float32
