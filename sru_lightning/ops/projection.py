"""The input projection U = x @ W of an SRU layer, on the fastest CPU library for its dtype.

On some CPUs (AMD EPYC among them) the BLAS behind ``torch.matmul`` reaches less than half
the float32 throughput of oneDNN, which ``nn.LSTM`` uses; the projection is most of an SRU
layer's time, so it decides the SRU-vs-LSTM ratio. :func:`input_projection` picks, for CPU
tensors outside autocast:

* float32 with more than one row: oneDNN's linear kernel (float32 accuracy, no
  reduced-precision mode); a single row (one decoding step at batch 1) stays on
  ``torch.matmul``, whose matrix-vector product is faster there;
* bfloat16: ``torch.matmul``, which already runs on oneDNN (AVX-512 BF16 or AMX where the
  CPU has them) whenever oneDNN supports bfloat16 on this CPU;
* float16: ``torch.matmul`` when oneDNN supports float16 on this CPU (AVX-512 FP16, AMX-FP16);
  otherwise oneDNN's float32 linear kernel on widened copies, rounded back to float16 (the
  same float32 accumulation, while torch's own float16 product on such a CPU is a slow
  scalar loop, tens of times slower than float32);

and ``torch.matmul`` for everything else (other dtypes, autocast, CUDA, a torch build
without oneDNN's linear kernel).

:func:`input_projection_with_skip` also hands back the input as the skip term's source, with one
backward for both uses: the skip term's gradient is added inside the product of the input's
gradient (dU @ W^T), where autograd would add the two gradients of the input in a pass of its own.
"""

from __future__ import annotations

import contextlib

import torch

_LINEAR = getattr(getattr(torch.ops, "mkldnn", None), "_linear_pointwise", None)
_LINEAR_ADD = getattr(_LINEAR, "binary", None)


def _onednn_supports(query: str) -> bool:
    check = getattr(getattr(torch.ops, "mkldnn", None), query, None)
    try:
        return bool(check()) if check is not None else False
    except RuntimeError:  # a torch build without oneDNN
        return False


# Decided once at import: torch.compile may not trace torch.backends queries, and the answer
# cannot change while the process runs.
_ONEDNN_LINEAR_AVAILABLE = _LINEAR is not None and torch.backends.mkldnn.is_available()
_ONEDNN_FP16_SUPPORTED = _ONEDNN_LINEAR_AVAILABLE and _onednn_supports("_is_mkldnn_fp16_supported")
_ONEDNN_BF16_SUPPORTED = _ONEDNN_LINEAR_AVAILABLE and _onednn_supports("_is_mkldnn_bf16_supported")


def onednn_linear_available() -> bool:
    return _ONEDNN_LINEAR_AVAILABLE


def _linear(a, b):
    """a @ b.T on oneDNN (both 2-D). Transposed views go in as they are: oneDNN reads the
    strides, which is about twice as fast as materialising the transposes first."""
    return _LINEAR(a, b, None, "none", [], "")


class _OneDNNProjection(torch.autograd.Function):
    """x2d @ weight on oneDNN's float32 linear kernel; inputs of another dtype are widened to
    float32 for the products and the results rounded back to that dtype."""

    @staticmethod
    def forward(ctx, x2d, weight):
        ctx.save_for_backward(x2d, weight)
        return _linear(x2d.float(), weight.float().t()).to(x2d.dtype)

    @staticmethod
    def backward(ctx, grad_u):
        x2d, weight = ctx.saved_tensors
        grad_u = grad_u.float()
        grad_x = grad_weight = None
        if ctx.needs_input_grad[0]:
            grad_x = _linear(grad_u, weight.float()).to(x2d.dtype)  # dU @ W.T
        if ctx.needs_input_grad[1]:
            grad_weight = _linear(x2d.float().t(), grad_u.t()).to(weight.dtype)  # x.T @ dU
        return grad_x, grad_weight


def _input_gradient(grad_u, weight, grad_skip, onednn: bool):
    """dU @ W^T, plus grad_skip added inside the product where a kernel takes an addend."""
    if grad_skip is None:
        return _linear(grad_u, weight) if onednn else grad_u @ weight.t()
    if (
        _LINEAR_ADD is not None
        and grad_u.device.type == "cpu"
        and (grad_u.dtype == torch.float32 or (grad_u.dtype == torch.bfloat16 and _ONEDNN_BF16_SUPPORTED))
    ):
        # oneDNN's linear with a sum post-op: the addend is read once, inside the product.
        return _LINEAR_ADD(grad_u, grad_skip.contiguous(), weight, None, "add")
    return torch.addmm(grad_skip, grad_u, weight.t())


class _ProjectionWithSkip(torch.autograd.Function):
    """(x2d @ weight, x2d): the product and the input itself as the skip term's source. Both
    gradients arrive in one backward, so the skip term's is added inside the input gradient's
    product instead of in a pass of its own over memory. `onednn`: the product runs as
    :class:`_OneDNNProjection` runs it (oneDNN's float32 kernel, widening other dtypes)."""

    @staticmethod
    def forward(ctx, x2d, weight, onednn: bool):
        ctx.save_for_backward(x2d, weight)
        ctx.onednn = onednn
        ctx.set_materialize_grads(False)
        u = _linear(x2d.float(), weight.float().t()).to(x2d.dtype) if onednn else x2d @ weight
        return u, x2d.view_as(x2d)

    @staticmethod
    def backward(ctx, grad_u, grad_skip):
        x2d, weight = ctx.saved_tensors
        if grad_u is None:
            return grad_skip, None, None
        compute = torch.float32 if ctx.onednn else x2d.dtype
        grad_u = grad_u.to(compute)
        grad_x = grad_weight = None
        if ctx.needs_input_grad[0]:
            skip = None if grad_skip is None else grad_skip.to(compute)
            grad_x = _input_gradient(grad_u, weight.to(compute), skip, ctx.onednn).to(x2d.dtype)
        if ctx.needs_input_grad[1]:
            if ctx.onednn:
                grad_weight = _linear(x2d.to(compute).t(), grad_u.t()).to(weight.dtype)  # x.T @ dU
            else:
                grad_weight = x2d.t() @ grad_u
        return grad_x, grad_weight, None


def _use_onednn(x, weight) -> bool:
    if (
        torch.compiler.is_compiling()
        or not _ONEDNN_LINEAR_AVAILABLE
        or x.device.type != "cpu"
        or x.dtype != weight.dtype
        or torch.is_autocast_enabled("cpu")
    ):
        return False
    if x.dtype == torch.float32:
        # A single row (one decoding step at batch 1) is a matrix-vector product: there BLAS's
        # gemv takes 6-36 us where oneDNN's linear takes 45-50 us (D=64..256 into 768..1024
        # columns, 1 thread), and text generation ran 1.45x faster end to end on torch.matmul.
        return x.numel() > x.shape[-1]
    return x.dtype == torch.float16 and not _ONEDNN_FP16_SUPPORTED


def input_projection(x, weight):
    """``x @ weight`` for x (..., in) and weight (in, out), with autograd."""
    if not _use_onednn(x, weight):
        return torch.matmul(x, weight)
    flat = x.reshape(-1, x.shape[-1])
    return _OneDNNProjection.apply(flat, weight).reshape(*x.shape[:-1], weight.shape[-1])


def input_projection_with_skip(x, weight):
    """``(x @ weight, x)`` for x (..., in) and weight (in, out): the projection and the skip term's
    source, whose gradients autograd would otherwise add in a separate pass (the second is x's
    values, a view of x under autograd).

    Under autocast (with x already in its dtype, as the layers cast it once) the product runs in
    the autocast dtype as ``torch.matmul`` would there. Without a gradient, or while compiling,
    it is :func:`input_projection` and x itself.
    """
    needs_grad = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)
    if not needs_grad or torch.compiler.is_compiling():
        return input_projection(x, weight), x
    autocast = x.device.type in ("cpu", "cuda") and torch.is_autocast_enabled(x.device.type)
    if autocast:
        dtype = torch.get_autocast_dtype(x.device.type)
        if x.dtype != dtype:
            return input_projection(x, weight), x
        weight = weight.to(dtype)  # the cast autocast makes of the weight for torch.matmul
    if x.dtype != weight.dtype:
        return input_projection(x, weight), x
    flat = x.reshape(-1, x.shape[-1])
    with torch.autocast(x.device.type, enabled=False) if autocast else contextlib.nullcontext():
        u, skip = _ProjectionWithSkip.apply(flat, weight, _use_onednn(flat, weight))
    return u.reshape(*x.shape[:-1], weight.shape[-1]), skip.view(x.shape)
