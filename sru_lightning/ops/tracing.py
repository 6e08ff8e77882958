"""Observability: which storage dtype and backend each recurrence kernel call really ran in."""

from __future__ import annotations

import contextlib
from collections import namedtuple

import torch

KernelCall = namedtuple("KernelCall", ["device_type", "storage_dtype", "accumulation_dtype", "backend", "direction"])
KernelCall.__doc__ = """One recurrence kernel call. backend: "cpp" or "reference";
direction: "forward", "backward" or "inference"."""

# Module-wide, not thread-local: autograd runs CUDA backward on its own device threads.
_open_traces: list[list] = []


def _active_lists() -> list:
    return _open_traces


def tracing_active() -> bool:
    return bool(_active_lists())


def record_kernel_call(device_type, storage_dtype, accumulation_dtype, backend, direction) -> None:
    """Append one call to every open :func:`trace_storage_dtypes` block (no-op otherwise)."""
    lists = _active_lists()
    if not lists or torch.compiler.is_compiling():
        return
    call = KernelCall(device_type, storage_dtype, accumulation_dtype, backend, direction)
    for calls in lists:
        calls.append(call)


@contextlib.contextmanager
def trace_storage_dtypes():
    """Record every recurrence kernel call made inside the block.

    >>> with trace_storage_dtypes() as calls:
    ...     h, c = sru_recurrence(U, x, weight_c, bias)
    >>> calls[0].storage_dtype
    torch.float32

    Backward calls are recorded when backward runs inside the block. Calls made while
    ``torch.compile`` traces are not recorded (the compiled graph runs the same kernels).
    """
    calls: list[KernelCall] = []
    _open_traces.append(calls)
    try:
        yield calls
    finally:
        _open_traces[:] = [c for c in _open_traces if c is not calls]
