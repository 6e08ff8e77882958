"""The C++ recurrence as PyTorch custom ops: fake kernels for torch.compile and autograd.

Importing this module loads the extension (building it on first use). The schemas live in
csrc/sru_ops.cpp; device kernels in csrc/sru_cpu.cpp and csrc/sru_cuda.cpp.
"""

from __future__ import annotations

import torch

from .build import load_extension
from .storage_dtype import accumulation_dtype
from .tracing import record_kernel_call

load_extension()

_FORWARD = "sru_lightning::recurrence_forward"
_BACKWARD = "sru_lightning::recurrence_backward"


def cuda_kernels_loaded() -> bool:
    """True when the CUDA extension is loaded (its kernels registered for the CUDA dispatch key)."""
    return torch._C._dispatch_has_kernel_for_dispatch_key(_FORWARD, "CUDA")


CPU_VECTOR_LEVELS = ("baseline", "avx2", "avx512", "avx512_bf16")


def cpu_vector_level() -> str:
    """Vector code the CPU kernels run: "baseline", "avx2" (AVX2+FMA+F16C), "avx512", or
    "avx512_bf16" (AVX-512 with the bfloat16 conversion instructions).

    ``SRU_LIGHTNING_CPU_VECTORS=baseline|avx2|avx512`` caps the level for the process.
    """
    return CPU_VECTOR_LEVELS[torch.ops.sru_lightning.cpu_vector_level()]


def release_cached_buffers() -> int:
    """Free the idle CPU output buffers the kernels keep for reuse; returns the bytes freed.

    Outputs of 1 MiB or more (h, the per-step states, the gradients) go back to a cache when
    their tensors die, so a training loop reuses memory instead of faulting in fresh pages at
    every step. ``SRU_LIGHTNING_CPU_BUFFER_CACHE_MB`` caps the idle bytes (default 256; 0
    turns the cache off).
    """
    return torch.ops.sru_lightning.release_cached_buffers()


def _width(bias) -> int:
    return bias.shape[0] // 2


@torch.library.register_fake(_FORWARD)
def _forward_fake(U, x, weight_c, bias, c0, scale_x, scale_x_value, mask_c, mask_pad,
                  bidirectional, has_skip_term, store_c):
    length, batch, width = U.shape[0], U.shape[1], _width(bias)
    h = U.new_empty((length, batch, width))
    c_last = U.new_empty((batch, width))
    c_all = U.new_empty((length, batch, width)) if store_c else U.new_empty((0,))
    return h, c_last, c_all


@torch.library.register_fake(_BACKWARD)
def _backward_fake(grad_h, grad_c_last, U, x, weight_c, bias, c0, scale_x, scale_x_value, mask_c,
                   mask_pad, c_all, bidirectional, has_skip_term):
    # The kernels return contiguous gradients whatever the inputs' strides (a batch_first
    # U or x arrives transposed): new_empty, not empty_like, which would copy the strides.
    width = _width(bias)
    skip_from_x = has_skip_term and U.shape[-1] == 3 * width
    grad_x = U.new_empty(x.shape) if skip_from_x else U.new_empty((0,))
    return (
        U.new_empty(U.shape),
        grad_x,
        U.new_empty(weight_c.shape),
        U.new_empty(bias.shape),
        U.new_empty((U.shape[1], width)),
    )


def _setup_context(ctx, inputs, output):
    (U, x, weight_c, bias, c0, scale_x, scale_x_value, mask_c, mask_pad, bidirectional,
     has_skip_term, store_c) = inputs
    _, _, c_all = output
    ctx.save_for_backward(U, x, weight_c, bias, c0, scale_x, mask_c, mask_pad, c_all)
    skip_from_x = has_skip_term and U.shape[-1] == 3 * _width(bias)
    ctx.options = (scale_x_value, bidirectional, has_skip_term, skip_from_x)
    ctx.mark_non_differentiable(c_all)
    # Unused outputs then get None instead of freshly filled zero tensors.
    ctx.set_materialize_grads(False)


def _differentiable_gradients(saved, options, grad_h, grad_c_last):
    """First-order gradients as a graph of the inputs (``create_graph=True``), through the reference.

    The backward kernel has no derivative of its own; recomputing the recurrence with the
    differentiable reference gives exact second-order gradients (slower, and rarely needed:
    gradient penalties, meta-learning).
    """
    from .reference import sru_recurrence_reference

    U, x, weight_c, bias, c0, scale_x, mask_c, mask_pad, _ = saved
    scale_x_value, bidirectional, has_skip_term, skip_from_x = options
    inputs = [U, x if skip_from_x else None, weight_c, bias, c0]
    # A fresh leaf for an input without grad: its gradient is still returned, as by the kernel.
    inputs = [None if t is None else (t if t.requires_grad else t.detach().requires_grad_()) for t in inputs]
    h, c_last = sru_recurrence_reference(
        *inputs, scale_x=scale_x if scale_x is not None else scale_x_value, mask_c=mask_c, mask_pad=mask_pad,
        bidirectional=bidirectional, has_skip_term=has_skip_term, compute_dtype=accumulation_dtype(U.dtype),
    )
    outputs, grads = [h.to(U.dtype)], [grad_h]
    if grad_c_last is not None:
        outputs.append(c_last.to(U.dtype))
        grads.append(grad_c_last)
    wanted = [t for t in inputs if t is not None]
    found = iter(torch.autograd.grad(outputs, wanted, grads, create_graph=True, allow_unused=True))
    gradients = [None if t is None else next(found) for t in inputs]
    return [g if g is not None or t is None else torch.zeros_like(t) for g, t in zip(gradients, inputs)]


def _backward(ctx, grad_h, grad_c_last, _grad_c_all):
    U, x, weight_c, bias, c0, scale_x, mask_c, mask_pad, c_all = ctx.saved_tensors
    scale_x_value, bidirectional, has_skip_term, skip_from_x = ctx.options
    if grad_h is None:
        grad_h = torch.zeros_like(c_all)
    if torch.is_grad_enabled() and not torch.compiler.is_compiling():
        # backward(create_graph=True): the gradients must be differentiable themselves.
        grad_U, grad_x, grad_weight_c, grad_bias, grad_c0 = _differentiable_gradients(
            ctx.saved_tensors, ctx.options, grad_h, grad_c_last)
        record_kernel_call(U.device.type, U.dtype, accumulation_dtype(U.dtype), "reference", "backward")
        return (grad_U, grad_x, grad_weight_c, grad_bias, grad_c0 if c0 is not None else None,
                None, None, None, None, None, None, None)
    grad_U, grad_x, grad_weight_c, grad_bias, grad_c0 = torch.ops.sru_lightning.recurrence_backward(
        grad_h, grad_c_last, U, x, weight_c, bias, c0, scale_x, scale_x_value, mask_c, mask_pad,
        c_all, bidirectional, has_skip_term,
    )
    record_kernel_call(U.device.type, U.dtype, accumulation_dtype(U.dtype), "cpp", "backward")
    # scale_x is a constant of the layer (a buffer), and the masks are not differentiable.
    return (
        grad_U,
        grad_x if skip_from_x else None,
        grad_weight_c,
        grad_bias,
        grad_c0 if c0 is not None else None,
        None, None, None, None, None, None, None,
    )


torch.library.register_autograd(_FORWARD, _backward, setup_context=_setup_context)


def _no_derivative_of_the_backward(ctx, *grads):
    raise RuntimeError(
        "sru_lightning::recurrence_backward has no derivative of its own. For second-order gradients "
        "call backward/autograd.grad with create_graph=True on the output of sru_recurrence (or an SRU "
        "layer): the recurrence then differentiates through its reference implementation."
    )


def _setup_backward_context(ctx, inputs, output):
    pass


# Without a rule, differentiating the backward op would give zeros with only a warning.
torch.library.register_autograd(_BACKWARD, _no_derivative_of_the_backward, setup_context=_setup_backward_context)


def _split_scale(scale_x):
    if scale_x is None:
        return None, 1.0
    if isinstance(scale_x, torch.Tensor):
        return scale_x, 1.0
    return None, float(scale_x)


def sru_forward(U, x, weight_c, bias, c0, scale_x, mask_c, mask_pad, bidirectional, has_skip_term):
    """Differentiable recurrence on storage-dtype inputs (L, B, ...). Returns (h, c_last)."""
    scale_tensor, scale_value = _split_scale(scale_x)
    h, c_last, _ = torch.ops.sru_lightning.recurrence_forward(
        U, x, weight_c, bias, c0, scale_tensor, scale_value, mask_c, mask_pad,
        bidirectional, has_skip_term, True,
    )
    record_kernel_call(U.device.type, U.dtype, accumulation_dtype(U.dtype), "cpp", "forward")
    return h, c_last


def sru_inference(U, x, weight_c, bias, c0, scale_x, mask_c, mask_pad, bidirectional, has_skip_term):
    """Recurrence without autograd and without storing the per-step states."""
    scale_tensor, scale_value = _split_scale(scale_x)
    with torch.no_grad():
        h, c_last, _ = torch.ops.sru_lightning.recurrence_forward(
            U, x, weight_c, bias, c0, scale_tensor, scale_value, mask_c, mask_pad,
            bidirectional, has_skip_term, False,
        )
    record_kernel_call(U.device.type, U.dtype, accumulation_dtype(U.dtype), "cpp", "inference")
    return h, c_last
