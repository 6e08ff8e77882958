"""The input projection U = x @ W of an SRU layer, on oneDNN where that is faster.

On some CPUs (AMD EPYC among them) the BLAS behind ``torch.matmul`` reaches less than half
the float32 throughput of oneDNN, which ``nn.LSTM`` uses; the projection is most of an SRU
layer's time, so it decides the SRU-vs-LSTM ratio. :func:`input_projection` computes the
same product (float32 accuracy, no reduced-precision mode) through oneDNN's linear kernel
when the inputs are float32 CPU tensors outside autocast with more than one row, and through
``torch.matmul`` otherwise (a single row, other dtypes, autocast, CUDA, a torch build without
that kernel).
"""

from __future__ import annotations

import torch

_LINEAR = getattr(getattr(torch.ops, "mkldnn", None), "_linear_pointwise", None)


# Decided once at import: torch.compile may not trace torch.backends queries, and the answer
# cannot change while the process runs.
_ONEDNN_LINEAR_AVAILABLE = _LINEAR is not None and torch.backends.mkldnn.is_available()


def onednn_linear_available() -> bool:
    return _ONEDNN_LINEAR_AVAILABLE


def _linear(a, b):
    """a @ b.T on oneDNN (both 2-D). Transposed views go in as they are: oneDNN reads the
    strides, which is about twice as fast as materialising the transposes first."""
    return _LINEAR(a, b, None, "none", [], "")


class _OneDNNProjection(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2d, weight):
        ctx.save_for_backward(x2d, weight)
        return _linear(x2d, weight.t())

    @staticmethod
    def backward(ctx, grad_u):
        x2d, weight = ctx.saved_tensors
        grad_x = grad_weight = None
        if ctx.needs_input_grad[0]:
            grad_x = _linear(grad_u, weight)  # dU @ W.T
        if ctx.needs_input_grad[1]:
            grad_weight = _linear(x2d.t(), grad_u.t())  # x.T @ dU
        return grad_x, grad_weight


def _use_onednn(x, weight) -> bool:
    # A single row (one decoding step at batch 1) is a matrix-vector product: there BLAS's
    # gemv takes 6-36 us where oneDNN's linear takes 45-50 us (D=64..256 into 768..1024
    # columns, 1 thread), and text generation ran 1.45x faster end to end on torch.matmul.
    return (
        not torch.compiler.is_compiling()
        and _ONEDNN_LINEAR_AVAILABLE
        and x.numel() > x.shape[-1]
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and weight.dtype == torch.float32
        and not torch.is_autocast_enabled("cpu")
    )


def input_projection(x, weight):
    """``x @ weight`` for x (..., in) and weight (in, out), with autograd."""
    if not _use_onednn(x, weight):
        return torch.matmul(x, weight)
    flat = x.reshape(-1, x.shape[-1])
    return _OneDNNProjection.apply(flat, weight).reshape(*x.shape[:-1], weight.shape[-1])
