"""Public entry points of the SRU recurrence, with the precision policy at the boundary.

The layers call these through the module attribute (``functional.sru_recurrence(...)``), so
tools that patch functions by name (``apex.amp.register_half_function(functional,
"sru_recurrence")``) reach every call.

Boundary rule: pick the storage dtype S from the policy and U's dtype A
(:func:`~sru_lightning.ops.storage_dtype.resolve_storage_dtype`), cast every floating input to S
with autocast disabled, run the kernel (accumulating in float32, float64 for float64), and
return ``h`` and ``c_last`` in A. Inputs of mixed dtypes therefore never reach the kernel.
"""

from __future__ import annotations

import contextlib

import torch

from .build import extension_available
from .build_cuda import cuda_extension_available
from .compile_marks import assume_constant_result
from .reference import reference_recurrence
from .shapes import RecurrenceShape, check_recurrence_inputs
from .signature import RecurrenceCall
from .storage_dtype import accumulation_dtype, resolve_storage_dtype, validate_policy
from .tracing import record_kernel_call, tracing_active

_AUTOCAST_DEVICE_TYPES = ("cpu", "cuda", "xpu", "mps", "hpu")


def _autocast_disabled(device_type: str):
    if device_type in _AUTOCAST_DEVICE_TYPES:
        return torch.autocast(device_type=device_type, enabled=False)
    return contextlib.nullcontext()


# Under torch.compile the answer is computed once while tracing and baked into the graph.
@assume_constant_result
def _cpp_backend_ready(device_type: str) -> bool:
    if device_type not in ("cpu", "cuda"):
        return False
    if not extension_available():
        return False
    if device_type == "cuda":
        # The CUDA kernels are a separate library, built on first use; when they cannot be
        # built, CUDA tensors run the reference after one warning naming the cause.
        return cuda_extension_available()
    return True


def _run(call: RecurrenceCall, *, policy: str, inference: bool, return_states: bool = False):
    validate_policy(policy)
    shape = check_recurrence_inputs(call)
    device_type = call.U.device.type
    out_dtype = call.U.dtype
    storage = resolve_storage_dtype(policy, out_dtype, device_type=device_type)
    with _autocast_disabled(device_type):
        stored = _in_storage(call, shape, storage)
        if _cpp_backend_ready(device_type):
            from . import op

            if return_states:
                h, c_last, c_all = op.sru_forward_states(stored)
            else:
                h, c_last = (op.sru_inference if inference else op.sru_forward)(stored)
        else:
            h, c_last, c_all = _run_reference(stored, inference)
        if shape.single_step:
            h = h.squeeze(0)
        if return_states:
            c_all = c_all.squeeze(0) if shape.single_step else c_all
            return h.to(out_dtype), c_last.to(out_dtype), c_all.to(out_dtype)
        return h.to(out_dtype), c_last.to(out_dtype)


def _in_storage(call: RecurrenceCall, shape: RecurrenceShape, storage: torch.dtype) -> RecurrenceCall:
    """What the kernel reads: every floating tensor in the storage dtype, the padding as bool,
    x only where the skip term reads it, and one step (B, ...) as a sequence of one (1, B, ...)."""

    def to_storage(t):
        return None if t is None else t.to(storage)

    def as_sequence(t):
        return t.unsqueeze(0) if shape.single_step and t is not None else t

    weight_c = to_storage(call.weight_c)
    return call.replace(
        U=as_sequence(to_storage(call.U)),
        x=as_sequence(to_storage(call.x)) if call.has_skip_term and shape.k == 3 else None,
        weight_c=as_sequence(weight_c) if shape.per_step_weight_c else weight_c,
        bias=to_storage(call.bias),
        c0=to_storage(call.c0),
        mask_c=to_storage(call.mask_c),
        mask_pad=as_sequence(None if call.mask_pad is None else call.mask_pad.to(torch.bool)),
        reset=as_sequence(call.reset),
        c_starts=as_sequence(to_storage(call.c_starts)),
    )


def _run_reference(call: RecurrenceCall, inference: bool):
    storage = call.U.dtype
    accumulate = accumulation_dtype(storage)
    grad_context = torch.no_grad() if inference else contextlib.nullcontext()
    with grad_context:
        h, c_last, c_all = reference_recurrence(call, compute_dtype=accumulate)
    device_type = call.U.device.type
    record_kernel_call(device_type, storage, accumulate, "reference", "inference" if inference else "forward")
    if not inference and h.requires_grad and tracing_active() and not torch.compiler.is_compiling():

        def _record_backward(grad):
            record_kernel_call(device_type, storage, accumulate, "reference", "backward")
            return grad

        h.register_hook(_record_backward)
    # Results are stored in S like the kernel's, before the caller casts them to U's dtype.
    return h.to(storage), c_last.to(storage), c_all.to(storage)


def sru_recurrence(
    U,
    x,
    weight_c,
    bias,
    c0=None,
    *,
    scale_x=None,
    mask_c=None,
    mask_pad=None,
    reset=None,
    c_starts=None,
    bidirectional: bool = False,
    has_skip_term: bool = True,
    policy: str = "auto",
    return_states: bool = False,
):
    """SRU elementwise recurrence with autograd. Returns ``(h, c_last)`` in ``U``'s dtype, and
    ``c_all`` after them with ``return_states``.

    Args:
        U: (L, B, dirs*D*k) output of the input matmul, viewed as (L, B, dirs, D, k), k in
            {3, 4}; or (B, dirs*D*k) for one step (then h is (B, dirs*D)).
        x: (L, B, dirs*D) skip source when k == 3 and ``has_skip_term``; else may be None.
        weight_c: (2*dirs*D,) as (forget, reset) x dirs x D, or per step (L, B, 2*dirs*D).
        bias: (2*dirs*D,) as (forget, reset) x dirs x D.
        c0: (B, dirs*D) initial state, zeros when None.
        scale_x: None, a float or a 1-element tensor multiplying ``x`` in the skip term
            (a constant: it gets no gradient from the C++ kernel).
        mask_c: (B, dirs*D) already-scaled dropout mask applied to the gated cell term of h.
        mask_pad: (L, B) bool, True on padding: c is carried over and h is 0 there.
        reset: (L, B) bool (or (B,) for one step), True at each document's first step:
            documents packed into one row are computed as if each were alone (the state
            restarts from zero there, in both directions; no gradient crosses a boundary).
            Flags per step rather than ``cu_seqlens`` offsets: they share the (L, B) layout
            of ``mask_pad``, slice with a truncated-BPTT window, and scan in ONNX.
        c_starts: (L, B, dirs*D), with ``reset``: the state each document starts from instead
            of zero (a per-document initial state, with its gradient). It is read only where a
            document starts in a direction's order: at a flagged step t for the forward
            direction's columns, at a document's last step (``reset[t + 1]``) for the backward
            direction's.
        bidirectional: the second half of the columns runs from t = L-1 down to 0.
        has_skip_term: add the highway skip term to h.
        policy: "auto", "fp32" or "half" (see :mod:`sru_lightning.ops.storage_dtype`).
        return_states: also return ``c_all`` (L, B, dirs*D), the state after every step, with
            its gradient: a packed document's final state is ``c_all`` at its last step.
    """
    call = RecurrenceCall(
        U=U,
        x=x,
        weight_c=weight_c,
        bias=bias,
        c0=c0,
        scale_x=scale_x,
        mask_c=mask_c,
        mask_pad=mask_pad,
        reset=reset,
        c_starts=c_starts,
        bidirectional=bidirectional,
        has_skip_term=has_skip_term,
    )
    return _run(call, policy=policy, inference=False, return_states=return_states)


def sru_recurrence_inference(
    U,
    x,
    weight_c,
    bias,
    c0=None,
    *,
    scale_x=None,
    mask_c=None,
    mask_pad=None,
    reset=None,
    c_starts=None,
    bidirectional: bool = False,
    has_skip_term: bool = True,
    policy: str = "auto",
):
    """Same as :func:`sru_recurrence` without autograd; the per-step c is never stored."""
    call = RecurrenceCall(
        U=U,
        x=x,
        weight_c=weight_c,
        bias=bias,
        c0=c0,
        scale_x=scale_x,
        mask_c=mask_c,
        mask_pad=mask_pad,
        reset=reset,
        c_starts=c_starts,
        bidirectional=bidirectional,
        has_skip_term=has_skip_term,
    )
    return _run(call, policy=policy, inference=True)
