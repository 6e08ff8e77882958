"""FLOP formulas, so ``torch.utils.flop_counter.FlopCounterMode`` counts what an SRU layer computes.

FlopCounterMode counts only the ops in its registry (matmuls, convolutions, CUDA attention). An
SRU layer's forward and backward run three kinds of op it does not know:

* the recurrence, ``torch.ops.sru_lightning.recurrence_forward`` and ``recurrence_backward``;
* the input projection on oneDNN (``torch.ops.mkldnn._linear_pointwise``, see
  :mod:`sru_lightning.ops.projection`), float32 on the CPU, forward and backward;
* SRU++'s attention on the CPU (``aten._scaled_dot_product_flash_attention_for_cpu`` and its
  backward), counted here with torch's own formula for the CUDA attention kernels.

Convention, FlopCounterMode's: a multiply and an add are one FLOP each, so a matmul of
(M, K) by (K, N) is 2*M*N*K. For the recurrence, every arithmetic operation of the step math in
``csrc/sru_step.h`` counts one FLOP: each +, -, *, each exponential and each division; a
sigmoid 1/(1 + e^-z) is three (exp, add, divide). An expression the step math writes twice
(``c_prev - u0``, ``1 - forget``) counts once. Clamps, selects, loads and stores count zero.
The count does not follow how a kernel evaluates a sigmoid (the float kernels share one
division between the two gates; the CPU exponential is a polynomial), so the same call counts
the same on every device and dtype. Per column (time step, batch entry, direction, hidden
unit) of a step that is not padding:

* forward: 19 -- the two gate logits ``u + w*c_prev + b`` (3 each), the two sigmoids (3 each),
  ``c = u0 + (c_prev - u0)*f`` (3), ``h = skip + ((c - skip)*r)*mask`` (4);
* backward: 42 -- the forward's logits, gates and c again (15, the backward recomputes c_t
  from c_{t-1}), then the gradients (23) and the four running sums of the gate weight and bias
  gradients (4);
* with the skip term read from x (k = 3 and ``has_skip_term``): +1 forward (``scale_x * x``)
  and +2 backward (``scale_x * x`` again, ``grad_x = grad_skip * scale_x``). A skip column in U
  (k = 4) is read as it is, and without a skip term h has the same four operations with
  skip = 0, as the branch-free kernels run it; a missing ``mask_c`` is a multiply by one.

Steps that ``mask_pad`` marks as padding run no step math in either pass (the state is carried
over), so they count zero; a ``mask_pad`` whose values cannot be read (a fake or meta tensor,
as when torch.compile estimates FLOPs) counts every step. The backward also reduces its
per-batch partial sums of the bias gradient over the batch, ``(B - 1) * 2 * dirs * D`` adds,
and as many again for a ``weight_c`` shared by all steps (a per-step ``weight_c`` has none).

FlopCounterMode copies the registry when it is constructed, and the recurrence ops exist only
once the extension is loaded, usually during the first forward, inside the counter (Lightning's
``measure_flops`` and ``ModelSummary`` create theirs just before it). So registering adds the
formulas to every FlopCounterMode active at that moment as well; one created before the load
and entered only after it does not have them.
"""

from __future__ import annotations

import math

import torch
from torch.utils.flop_counter import (
    FlopCounterMode,
    flop_registry,
    register_flop_formula,
    sdpa_backward_flop_count,
    sdpa_flop_count,
)

from .signature import BACKWARD_ARGUMENTS, FORWARD_ARGUMENTS

#: FLOPs of one forward step of one column (direction, hidden unit) of one batch entry.
FORWARD_FLOPS_PER_ELEMENT = 19
#: FLOPs of one backward step of one column of one batch entry.
BACKWARD_FLOPS_PER_ELEMENT = 42
#: Extra FLOPs per element when the skip term is ``scale_x * x`` (k = 3 with a skip term).
SKIP_FROM_X_FORWARD_FLOPS = 1
SKIP_FROM_X_BACKWARD_FLOPS = 2


def _bound(arguments, args, kwargs) -> dict:
    """The op call's values by argument name (FlopCounterMode passes them as the caller did)."""
    values = {argument.name: value for argument, value in zip(arguments, args)}
    values.update(kwargs)
    return values


def _values_readable(tensor: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import is_fake

    return not (tensor.is_meta or is_fake(tensor))


def _computed_steps(mask_pad, length, batch):
    """How many (time step, batch entry) pairs run the step math: all but the padding."""
    if mask_pad is None or not _values_readable(mask_pad):
        return length * batch
    return length * batch - int(mask_pad.count_nonzero())


def _layout(values: dict):
    """(width = dirs*D, steps that compute, skip read from x), as the kernels derive them
    (csrc/sru_checks.cpp: width from bias, k from U's last dimension)."""
    U, bias = values["U"], values["bias"]
    width = bias.shape[0] // 2
    k = U.shape[2] // width
    skip_from_x = bool(values["has_skip_term"]) and k == 3
    return width, _computed_steps(values["mask_pad"], U.shape[0], U.shape[1]), skip_from_x


def recurrence_forward_flops(values: dict):
    """FLOPs of one ``recurrence_forward`` call, from its arguments by name."""
    width, steps, skip_from_x = _layout(values)
    per_element = FORWARD_FLOPS_PER_ELEMENT + (SKIP_FROM_X_FORWARD_FLOPS if skip_from_x else 0)
    return per_element * steps * width


def recurrence_backward_flops(values: dict):
    """FLOPs of one ``recurrence_backward`` call, from its arguments by name."""
    width, steps, skip_from_x = _layout(values)
    per_element = BACKWARD_FLOPS_PER_ELEMENT + (SKIP_FROM_X_BACKWARD_FLOPS if skip_from_x else 0)
    # The kernels leave per-batch partial sums of the bias (and shared weight_c) gradients,
    # which the op adds up over the batch (csrc/sru_ops.h).
    batch = values["U"].shape[1]
    reduced = 2 if values["weight_c"].dim() == 1 else 1
    reduction = reduced * 2 * width * max(batch - 1, 0)
    return per_element * steps * width + reduction


def _recurrence_forward_formula(*args, out_val=None, **kwargs):
    return recurrence_forward_flops(_bound(FORWARD_ARGUMENTS, args, kwargs))


def _recurrence_backward_formula(*args, out_val=None, **kwargs):
    return recurrence_backward_flops(_bound(BACKWARD_ARGUMENTS, args, kwargs))


def _linear_flops(input_shape, *args, out_shape=None, **kwargs):
    """``mkldnn._linear_pointwise``: Y = X @ W.T (+ B), 2 FLOPs per multiply-add. Read from
    X and Y alone, so both overloads (``default`` and ``binary``, whose W is the third
    argument) count alike; the bias add is not counted, as for ``aten.addmm``."""
    return 2 * math.prod(out_shape) * input_shape[-1]


def _cpu_attention_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs):
    return sdpa_flop_count(query_shape, key_shape, value_shape)


def _cpu_attention_backward_flops(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs):
    return sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)


def _op_packet(namespace: str, name: str):
    """``torch.ops.<namespace>.<name>``, or None when this process has no such op (the extension
    not loaded yet, a torch build without oneDNN)."""
    try:
        return getattr(getattr(torch.ops, namespace), name)
    except (AttributeError, RuntimeError):
        return None


# (namespace, op, formula, whether the formula reads the tensors themselves rather than shapes).
# The recurrence formulas read mask_pad's values and the op's flags, so they take the raw call.
_FORMULAS = (
    ("sru_lightning", "recurrence_forward", _recurrence_forward_formula, True),
    ("sru_lightning", "recurrence_backward", _recurrence_backward_formula, True),
    ("mkldnn", "_linear_pointwise", _linear_flops, False),
    ("aten", "_scaled_dot_product_flash_attention_for_cpu", _cpu_attention_flops, False),
    ("aten", "_scaled_dot_product_flash_attention_for_cpu_backward", _cpu_attention_backward_flops, False),
)


def _counters_in_use() -> list[FlopCounterMode]:
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    counters = (getattr(mode, "counter", None) for mode in _get_current_dispatch_mode_stack())
    return [counter for counter in counters if isinstance(counter, FlopCounterMode)]


def register_flop_formulas() -> None:
    """Register the formula of every op above that exists in this process; idempotent.

    Runs when :mod:`sru_lightning.ops` is imported (the projection and attention ops) and
    again when :mod:`sru_lightning.ops.op` has loaded the extension (the recurrence ops). An op
    whose formula torch already has (a later torch may count these itself) keeps torch's.
    """
    counters = _counters_in_use()
    for namespace, name, formula, get_raw in _FORMULAS:
        packet = _op_packet(namespace, name)
        if packet is None or packet in flop_registry:
            continue
        registered = register_flop_formula(packet, get_raw=get_raw)(formula)
        for counter in counters:
            counter.flop_registry.setdefault(packet, registered)


register_flop_formulas()
