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


@torch.library.register_fake(_FORWARD)
def _forward_fake(*values):
    a = signature.bind(FORWARD_ARGUMENTS, values)
    call = RecurrenceCall.from_op(a)
    U, width = call.U, call.width
    length, batch = U.shape[0], U.shape[1]
    h = U.new_empty((length, batch, width))
    c_last = U.new_empty((batch, width))
    c_all = U.new_empty((length, batch, width)) if a["store_c"] else U.new_empty((0,))
    return h, c_last, c_all


@torch.library.register_fake(_BACKWARD)
def _backward_fake(*values):
    # The kernels return contiguous gradients whatever the inputs' strides (a batch_first
    # U or x arrives transposed): new_empty, not empty_like, which would copy the strides.
    call = RecurrenceCall.from_op(signature.bind(BACKWARD_ARGUMENTS, values))
    U = call.U
    return (
        U.new_empty(U.shape),
        U.new_empty(call.x.shape) if call.skip_from_x else U.new_empty((0,)),
        U.new_empty(call.weight_c.shape),
        U.new_empty(call.bias.shape),
        U.new_empty((U.shape[1], call.width)),
        U.new_empty(call.c_starts.shape) if call.c_starts is not None else U.new_empty((0,)),
    )


# The tensors the backward needs: every tensor argument of the forward, and c_all.
_SAVED = tuple(argument.name for argument in FORWARD_ARGUMENTS if argument.schema_type.startswith("Tensor"))
_OPTIONS = tuple(argument.name for argument in FORWARD_ARGUMENTS if not argument.schema_type.startswith("Tensor"))


def _setup_context(ctx, inputs, output):
    a = signature.bind(FORWARD_ARGUMENTS, inputs)
    _, _, c_all = output
    ctx.save_for_backward(*(a[name] for name in _SAVED), c_all)
    ctx.options = {name: a[name] for name in _OPTIONS}
    ctx.skip_from_x = RecurrenceCall.from_op(a).skip_from_x
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
    from .reference import reference_recurrence

    call = RecurrenceCall.from_op(a)
    if not skip_from_x:
        call = call.replace(x=None)

    def leaf(t):  # a fresh leaf for an input without grad: its gradient is still returned, as by the kernel
        return t if t is None or t.requires_grad else t.detach().requires_grad_()

    call = call.replace(**{name: leaf(getattr(call, name)) for name in signature.DIFFERENTIABLE})
    inputs = [getattr(call, name) for name in signature.DIFFERENTIABLE]
    U = call.U
    h, c_last, c_all = reference_recurrence(call, compute_dtype=accumulation_dtype(U.dtype))
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


def sru_forward(call: RecurrenceCall):
    """Differentiable recurrence on storage-dtype inputs (L, B, ...). Returns (h, c_last)."""
    h, c_last, _ = sru_forward_states(call)
    return h, c_last


def sru_forward_states(call: RecurrenceCall):
    """:func:`sru_forward` that also returns c_all (L, B, dirs*D), the state after every step,
    with its gradient."""
    h, c_last, c_all = torch.ops.sru_lightning.recurrence_forward(*call.op_arguments(store_c=True))
    U = call.U
    record_kernel_call(U.device.type, U.dtype, accumulation_dtype(U.dtype), "cpp", "forward")
    return h, c_last, c_all


def sru_inference(call: RecurrenceCall):
    """Recurrence without autograd and without storing the per-step states (the call as for
    :func:`sru_forward`)."""
    with torch.no_grad():
        h, c_last, _ = torch.ops.sru_lightning.recurrence_forward(*call.op_arguments(store_c=False))
    U = call.U
    record_kernel_call(U.device.type, U.dtype, accumulation_dtype(U.dtype), "cpp", "inference")
    return h, c_last
