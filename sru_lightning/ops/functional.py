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

from .build import cuda_extension_available, extension_available
from .compile_marks import assume_constant_result
from .reference import sru_recurrence_reference
from .shapes import check_recurrence_inputs
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


def _run(
    U,
    x,
    weight_c,
    bias,
    c0,
    scale_x,
    mask_c,
    mask_pad,
    reset,
    bidirectional,
    has_skip_term,
    policy,
    inference,
    c_starts=None,
    return_states=False,
):
    validate_policy(policy)
    shape = check_recurrence_inputs(
        U,
        x,
        weight_c,
        bias,
        c0,
        scale_x,
        mask_c,
        mask_pad,
        bidirectional,
        has_skip_term,
        reset=reset,
        c_starts=c_starts,
    )
    device_type = U.device.type
    out_dtype = U.dtype
    storage = resolve_storage_dtype(policy, out_dtype, device_type=device_type)
    needs_x = has_skip_term and shape.k == 3

    def to_storage(t):
        return None if t is None else t.to(storage)

    with _autocast_disabled(device_type):
        U_s = to_storage(U)
        x_s = to_storage(x) if needs_x else None
        weight_c_s = to_storage(weight_c)
        bias_s = to_storage(bias)
        c0_s = to_storage(c0)
        mask_c_s = to_storage(mask_c)
        c_starts_s = to_storage(c_starts)
        mask_pad_b = None if mask_pad is None else mask_pad.to(torch.bool)
        if shape.single_step:
            U_s = U_s.unsqueeze(0)
            x_s = None if x_s is None else x_s.unsqueeze(0)
            weight_c_s = weight_c_s.unsqueeze(0) if shape.per_step_weight_c else weight_c_s
            mask_pad_b = None if mask_pad_b is None else mask_pad_b.unsqueeze(0)
            reset = None if reset is None else reset.unsqueeze(0)
            c_starts_s = None if c_starts_s is None else c_starts_s.unsqueeze(0)

        call = RecurrenceCall(
            U_s,
            x_s,
            weight_c_s,
            bias_s,
            c0_s,
            scale_x,
            mask_c_s,
            mask_pad_b,
            reset,
            c_starts_s,
            bidirectional,
            has_skip_term,
        )
        if _cpp_backend_ready(device_type):
            from . import op

            if return_states:
                h, c_last, c_all = op.sru_forward_states(*call)
            else:
                h, c_last = (op.sru_inference if inference else op.sru_forward)(*call)
        else:
            h, c_last, c_all = _run_reference(call, inference)
        if shape.single_step:
            h = h.squeeze(0)
        if return_states:
            c_all = c_all.squeeze(0) if shape.single_step else c_all
            return h.to(out_dtype), c_last.to(out_dtype), c_all.to(out_dtype)
        return h.to(out_dtype), c_last.to(out_dtype)


def _run_reference(call: RecurrenceCall, inference: bool):
    storage = call.U.dtype
    accumulate = accumulation_dtype(storage)
    grad_context = torch.no_grad() if inference else contextlib.nullcontext()
    with grad_context:
        h, c_last, c_all = sru_recurrence_reference(
            call.U,
            call.x,
            call.weight_c,
            call.bias,
            call.c0,
            scale_x=call.scale_x,
            mask_c=call.mask_c,
            mask_pad=call.mask_pad,
            reset=call.reset,
            c_starts=call.c_starts,
            return_states=True,
            bidirectional=call.bidirectional,
            has_skip_term=call.has_skip_term,
            compute_dtype=accumulate,
        )
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
    return _run(
        U,
        x,
        weight_c,
        bias,
        c0,
        scale_x,
        mask_c,
        mask_pad,
        reset,
        bidirectional,
        has_skip_term,
        policy,
        False,
        c_starts=c_starts,
        return_states=return_states,
    )


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
    return _run(
        U,
        x,
        weight_c,
        bias,
        c0,
        scale_x,
        mask_c,
        mask_pad,
        reset,
        bidirectional,
        has_skip_term,
        policy,
        True,
        c_starts=c_starts,
    )
