"""The C++ recurrence as PyTorch custom ops: fake kernels for torch.compile and autograd.

Importing this module loads the extension (building it on first use) and checks its op
schemas (csrc/sru_ops.h) against the argument list of :mod:`sru_lightning.ops.signature`,
through which every function here reads the op's arguments. Device kernels live in
csrc/sru_cpu.cpp and csrc/sru_cuda.cpp.
"""

from __future__ import annotations

import torch

from . import signature
from .build import load_extension
from .flops import register_flop_formulas
from .signature import BACKWARD_ARGUMENTS, CPU_VECTOR_LEVELS, FORWARD_ARGUMENTS, RecurrenceCall
from .storage_dtype import accumulation_dtype
from .tracing import record_kernel_call

load_extension()
signature.check_registered_schemas()
# FlopCounterMode keys its formulas on the op objects, which exist from here on.
register_flop_formulas()

_FORWARD = "sru_lightning::recurrence_forward"
_BACKWARD = "sru_lightning::recurrence_backward"


def cuda_kernels_loaded() -> bool:
    """True when the CUDA extension is loaded (its kernels registered for the CUDA dispatch key)."""
    return torch._C._dispatch_has_kernel_for_dispatch_key(_FORWARD, "CUDA")


def cpu_vector_level() -> str:
    """Vector code the CPU kernels run: "baseline", "avx2" (AVX2+FMA+F16C), "avx512", or
    "avx512_bf16" (AVX-512 with the bfloat16 conversion instructions).

    ``SRU_LIGHTNING_CPU_VECTORS=baseline|avx2|avx512`` caps the level for the process. The
    loaded library holds the levels the process needs (:mod:`.cpu_levels`).
    """
    level = torch.ops.sru_lightning.cpu_vector_level()
    if level < 0:
        raise RuntimeError(
            "sru_lightning: the loaded CPU kernel library holds no vector level this processor runs; "
            "`python -m sru_lightning build` builds the one it needs"
        )
    return CPU_VECTOR_LEVELS[level]


def release_cached_buffers() -> int:
    """Free the idle CPU output buffers the kernels keep for reuse; returns the bytes freed.

    Outputs of 1 MiB or more (h, the per-step states, the gradients) go back to a cache when
    their tensors die, so a training loop reuses memory instead of faulting in fresh pages at
    every step. ``SRU_LIGHTNING_CPU_BUFFER_CACHE_MB`` caps the idle bytes (default 256; 0
    turns the cache off).
    """
    return torch.ops.sru_lightning.release_cached_buffers()


def _width(bias) -> int:
    """dirs*D, the width of h and c, from bias's shape (2*dirs*D,)."""
    return bias.shape[0] // 2


@torch.library.register_fake(_FORWARD)
def _forward_fake(*values):
    a = signature.bind(FORWARD_ARGUMENTS, values)
    U, width = a["U"], _width(a["bias"])
    length, batch = U.shape[0], U.shape[1]
    h = U.new_empty((length, batch, width))
    c_last = U.new_empty((batch, width))
    c_all = U.new_empty((length, batch, width)) if a["store_c"] else U.new_empty((0,))
    return h, c_last, c_all


@torch.library.register_fake(_BACKWARD)
def _backward_fake(*values):
    # The kernels return contiguous gradients whatever the inputs' strides (a batch_first
    # U or x arrives transposed): new_empty, not empty_like, which would copy the strides.
    a = signature.bind(BACKWARD_ARGUMENTS, values)
    U, width = a["U"], _width(a["bias"])
    grad_x = U.new_empty(a["x"].shape) if _skip_from_x(a) else U.new_empty((0,))
    return (
        U.new_empty(U.shape),
        grad_x,
        U.new_empty(a["weight_c"].shape),
        U.new_empty(a["bias"].shape),
        U.new_empty((U.shape[1], width)),
        U.new_empty(a["c_starts"].shape) if a["c_starts"] is not None else U.new_empty((0,)),
    )


def _skip_from_x(arguments: dict) -> bool:
    """Whether the skip term reads x (k == 3), so x gets a gradient."""
    return arguments["has_skip_term"] and arguments["U"].shape[-1] == 3 * _width(arguments["bias"])


# The tensors the backward needs: every tensor argument of the forward, and c_all.
_SAVED = tuple(argument.name for argument in FORWARD_ARGUMENTS if argument.schema_type.startswith("Tensor"))
_OPTIONS = tuple(argument.name for argument in FORWARD_ARGUMENTS if not argument.schema_type.startswith("Tensor"))


def _setup_context(ctx, inputs, output):
    a = signature.bind(FORWARD_ARGUMENTS, inputs)
    _, _, c_all = output
    ctx.save_for_backward(*(a[name] for name in _SAVED), c_all)
    ctx.options = {name: a[name] for name in _OPTIONS}
    ctx.skip_from_x = _skip_from_x(a)
    # c_all is an output with a gradient too (a packed document's final state is one of its steps).
    # Unused outputs then get None instead of freshly filled zero tensors.
    ctx.set_materialize_grads(False)


def _saved_arguments(ctx) -> tuple[dict, torch.Tensor]:
    """The forward's arguments by name, and c_all."""
    *tensors, c_all = ctx.saved_tensors
    return {**dict(zip(_SAVED, tensors)), **ctx.options}, c_all


def _differentiable_gradients(a, skip_from_x, grad_h, grad_c_last, grad_c_all):
    """First-order gradients as a graph of the inputs (``create_graph=True``), through the reference.

    The backward kernel has no derivative of its own; recomputing the recurrence with the
    differentiable reference gives exact second-order gradients (slower, and rarely needed:
    gradient penalties, meta-learning). Returns the gradients of the differentiable arguments
    by name.
    """
    from .reference import sru_recurrence_reference

    U = a["U"]
    inputs = [U, a["x"] if skip_from_x else None, a["weight_c"], a["bias"], a["c0"], a["c_starts"]]
    # A fresh leaf for an input without grad: its gradient is still returned, as by the kernel.
    inputs = [None if t is None else (t if t.requires_grad else t.detach().requires_grad_()) for t in inputs]
    scale_x = a["scale_x"] if a["scale_x"] is not None else a["scale_x_value"]
    h, c_last, c_all = sru_recurrence_reference(
        *inputs[:5],
        c_starts=inputs[5],
        return_states=True,
        scale_x=scale_x,
        mask_c=a["mask_c"],
        mask_pad=a["mask_pad"],
        reset=a["reset"],
        bidirectional=a["bidirectional"],
        has_skip_term=a["has_skip_term"],
        compute_dtype=accumulation_dtype(U.dtype),
    )
    outputs, grads = [h.to(U.dtype)], [grad_h]
    if grad_c_last is not None:
        outputs.append(c_last.to(U.dtype))
        grads.append(grad_c_last)
    if grad_c_all is not None:
        outputs.append(c_all.to(U.dtype))
        grads.append(grad_c_all)
    wanted = [t for t in inputs if t is not None]
    found = iter(torch.autograd.grad(outputs, wanted, grads, create_graph=True, allow_unused=True))
    gradients = [None if t is None else next(found) for t in inputs]
    gradients = [g if g is not None or t is None else torch.zeros_like(t) for g, t in zip(gradients, inputs)]
    return dict(zip(signature.DIFFERENTIABLE, gradients))


def _backward(ctx, grad_h, grad_c_last, grad_c_all):
    a, c_all = _saved_arguments(ctx)
    U = a["U"]
    if grad_h is None:
        grad_h = torch.zeros_like(c_all)
    if torch.is_grad_enabled() and not torch.compiler.is_compiling():
        # backward(create_graph=True): the gradients must be differentiable themselves.
        gradients = _differentiable_gradients(a, ctx.skip_from_x, grad_h, grad_c_last, grad_c_all)
        backend = "reference"
    else:
        values = signature.ordered(
            BACKWARD_ARGUMENTS,
            {**a, "grad_h": grad_h, "grad_c_last": grad_c_last, "grad_c_all": grad_c_all, "c_all": c_all},
        )
        gradients = dict(zip(signature.DIFFERENTIABLE, torch.ops.sru_lightning.recurrence_backward(*values)))
        backend = "cpp"
    record_kernel_call(U.device.type, U.dtype, accumulation_dtype(U.dtype), backend, "backward")
    # Inputs the forward did not read get no gradient.
    if not ctx.skip_from_x:
        gradients["x"] = None
    for optional in ("c0", "c_starts"):
        if a[optional] is None:
            gradients[optional] = None
    return signature.forward_input_gradients(gradients)


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


def _op_arguments(arguments, store_c: bool) -> tuple:
    """The forward op's positional arguments for the entry points' ``arguments``
    (:class:`~sru_lightning.ops.signature.RecurrenceCall` order)."""
    call = RecurrenceCall(*arguments)._asdict()
    scale_x = call["scale_x"]
    if scale_x is None or isinstance(scale_x, torch.Tensor):
        call["scale_x_value"] = 1.0
    else:
        call["scale_x"], call["scale_x_value"] = None, float(scale_x)
    return signature.ordered(FORWARD_ARGUMENTS, {**call, "store_c": store_c})


def sru_forward(*arguments):
    """Differentiable recurrence on storage-dtype inputs (L, B, ...). Returns (h, c_last).

    ``arguments`` are those of :class:`~sru_lightning.ops.signature.RecurrenceCall`: U, x,
    weight_c, bias, c0, scale_x, mask_c, mask_pad, reset, c_starts, bidirectional, has_skip_term.
    """
    h, c_last, _ = sru_forward_states(*arguments)
    return h, c_last


def sru_forward_states(*arguments):
    """:func:`sru_forward` that also returns c_all (L, B, dirs*D), the state after every step,
    with its gradient."""
    h, c_last, c_all = torch.ops.sru_lightning.recurrence_forward(*_op_arguments(arguments, store_c=True))
    U = arguments[0]
    record_kernel_call(U.device.type, U.dtype, accumulation_dtype(U.dtype), "cpp", "forward")
    return h, c_last, c_all


def sru_inference(*arguments):
    """Recurrence without autograd and without storing the per-step states (arguments as
    for :func:`sru_forward`)."""
    with torch.no_grad():
        h, c_last, _ = torch.ops.sru_lightning.recurrence_forward(*_op_arguments(arguments, store_c=False))
    U = arguments[0]
    record_kernel_call(U.device.type, U.dtype, accumulation_dtype(U.dtype), "cpp", "inference")
    return h, c_last
