"""The checks of a recurrence call, in one place that knows the layout: the entry points and
the public reference check their :class:`~sru_lightning.ops.signature.RecurrenceCall` here, once.

Layout (identical to the ``sru`` package, so its checkpoints load unchanged):

* ``U``: (L, B, dirs*D*k), viewed as (L, B, dirs, D, k); k = 3 (skip from ``x``) or 4
  (skip from ``U[..., 3]``). A single step may be given as (B, dirs*D*k).
* ``x``: (L, B, dirs*D), the skip source when k == 3.
* ``weight_c``: (2*dirs*D,) viewed as (2, dirs, D) = (forget, reset), or per step
  (L, B, 2*dirs*D) viewed as (L, B, dirs, D, 2).
* ``bias``: (2*dirs*D,) viewed as (2, dirs, D).
* ``c0``, ``mask_c``: (B, dirs*D); ``mask_pad``: (L, B) bool, True = padding;
  ``reset``: (L, B) bool, True where a document starts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .signature import RecurrenceCall


@dataclass(frozen=True)
class RecurrenceShape:
    length: int
    batch: int
    directions: int
    hidden_size: int
    k: int
    single_step: bool
    per_step_weight_c: bool

    @property
    def columns(self) -> int:
        """Width of h and c: dirs * D."""
        return self.directions * self.hidden_size

    @classmethod
    def of(cls, call: RecurrenceCall) -> RecurrenceShape:
        """The sizes of a call that :func:`check_recurrence_inputs` accepted (read, not checked)."""
        directions = 2 if call.bidirectional else 1
        hidden = call.bias.numel() // (2 * directions)
        single_step = call.U.dim() == 2
        length = 1 if single_step else call.U.shape[0]
        k = call.U.shape[-1] // (directions * hidden)
        per_step = call.weight_c.dim() != 1
        return cls(length, call.U.shape[-2], directions, hidden, k, single_step, per_step)


def _shape(t) -> tuple:
    return tuple(t.shape)


def _require_tensor(name: str, value, allow_none: bool = False):
    if value is None and allow_none:
        return
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"SRU recurrence: `{name}` must be a torch.Tensor, got {type(value).__name__}")


def _check_types(U, x, weight_c, bias, c0, mask_c, mask_pad, reset) -> None:
    _require_tensor("U", U)
    _require_tensor("bias", bias)
    _require_tensor("weight_c", weight_c)
    for name, value in (("x", x), ("c0", c0), ("mask_c", mask_c), ("mask_pad", mask_pad), ("reset", reset)):
        _require_tensor(name, value, allow_none=True)
    if reset is not None and reset.dtype != torch.bool:
        raise TypeError(
            f"SRU recurrence: `reset` must be a bool tensor (True where a document starts), got {reset.dtype}"
        )
    if not U.is_floating_point():
        raise TypeError(f"SRU recurrence: `U` must be a floating tensor, got dtype {U.dtype}")


def _check_devices(U, **tensors) -> None:
    # Before any kernel reads memory: on a GPU a tensor from another device is an illegal access.
    for name, value in tensors.items():
        if isinstance(value, torch.Tensor) and value.device != U.device:
            raise ValueError(f"SRU recurrence: `{name}` must be on U's device {U.device}, got device {value.device}")


def _hidden_from_bias(bias, directions: int) -> int:
    if bias.dim() != 1 or bias.numel() % (2 * directions) != 0 or bias.numel() == 0:
        raise ValueError(
            f"SRU recurrence: `bias` must have shape (2*dirs*D,) with dirs={directions}, got {_shape(bias)}"
        )
    return bias.numel() // (2 * directions)


def _k_from_U(U, directions: int, hidden: int) -> int:
    columns = directions * hidden
    if U.dim() not in (2, 3):
        raise ValueError(f"SRU recurrence: `U` must have shape (L, B, dirs*D*k) or (B, dirs*D*k), got {_shape(U)}")
    if U.shape[-1] not in (3 * columns, 4 * columns):
        raise ValueError(
            f"SRU recurrence: `U` last dimension must be dirs*D*k = {3 * columns} (k=3) or "
            f"{4 * columns} (k=4) for dirs={directions}, D={hidden} (from `bias`), got {_shape(U)}"
        )
    return U.shape[-1] // columns


def _check_x(x, lead: tuple, columns: int) -> None:
    if x is None:
        raise ValueError("SRU recurrence: `x` is required when k == 3 and has_skip_term=True, got None")
    if _shape(x) != lead + (columns,):
        raise ValueError(f"SRU recurrence: `x` must have shape {lead + (columns,)}, got {_shape(x)}")


def _check_weight_c(weight_c, lead: tuple, columns: int) -> None:
    if weight_c.dim() != 1:
        wrong = _shape(weight_c) != lead + (2 * columns,)
    else:
        wrong = weight_c.numel() != 2 * columns
    if wrong:
        raise ValueError(
            f"SRU recurrence: `weight_c` must have shape ({2 * columns},) or "
            f"{lead + (2 * columns,)}, got {_shape(weight_c)}"
        )


def _check_batch_tensors(c0, mask_c, mask_pad, reset, lead: tuple, batch: int, columns: int) -> None:
    for name, value in (("c0", c0), ("mask_c", mask_c)):
        if value is not None and _shape(value) != (batch, columns):
            raise ValueError(
                f"SRU recurrence: `{name}` must have shape ({batch}, {columns}) (batch, dirs*D), got {_shape(value)}"
            )
    for name, value in (("mask_pad", mask_pad), ("reset", reset)):
        if value is not None and _shape(value) != lead:
            raise ValueError(f"SRU recurrence: `{name}` must have shape {lead} (L, B), got {_shape(value)}")


def _check_document_starts(c_starts, reset, lead: tuple, columns: int) -> None:
    if c_starts is None:
        return
    if reset is None:
        raise ValueError(
            "SRU recurrence: `c_starts` gives the state each document starts from, so it needs `reset` "
            "(where the documents start), got reset=None"
        )
    if _shape(c_starts) != lead + (columns,):
        raise ValueError(
            f"SRU recurrence: `c_starts` must have shape {lead + (columns,)} (L, B, dirs*D), got {_shape(c_starts)}"
        )


def _check_scale_x(scale_x) -> None:
    if scale_x is None:
        return
    if isinstance(scale_x, torch.Tensor):
        if scale_x.numel() != 1:
            raise ValueError(
                f"SRU recurrence: `scale_x` must be a float or a 1-element tensor, got shape {_shape(scale_x)}"
            )
    elif not isinstance(scale_x, (int, float)):
        raise TypeError(
            f"SRU recurrence: `scale_x` must be None, a float or a 1-element tensor, got {type(scale_x).__name__}"
        )


def check_recurrence_inputs(call: RecurrenceCall) -> RecurrenceShape:
    """Validate every argument of ``call`` against the layout and return the inferred sizes."""
    U, x, weight_c, bias = call.U, call.x, call.weight_c, call.bias
    c0, mask_c, mask_pad, reset, c_starts = call.c0, call.mask_c, call.mask_pad, call.reset, call.c_starts
    _check_types(U, x, weight_c, bias, c0, mask_c, mask_pad, reset)
    _require_tensor("c_starts", c_starts, allow_none=True)
    _check_devices(
        U,
        x=x,
        weight_c=weight_c,
        bias=bias,
        c0=c0,
        mask_c=mask_c,
        mask_pad=mask_pad,
        reset=reset,
        scale_x=call.scale_x,
        c_starts=c_starts,
    )
    directions = 2 if call.bidirectional else 1
    hidden = _hidden_from_bias(bias, directions)
    columns = directions * hidden
    k = _k_from_U(U, directions, hidden)
    single_step = U.dim() == 2
    length, batch = 1 if single_step else U.shape[0], U.shape[-2]
    lead = (batch,) if single_step else (length, batch)
    if call.has_skip_term and k == 3:
        _check_x(x, lead, columns)
    _check_weight_c(weight_c, lead, columns)
    _check_batch_tensors(c0, mask_c, mask_pad, reset, lead, batch, columns)
    _check_document_starts(c_starts, reset, lead, columns)
    _check_scale_x(call.scale_x)
    return RecurrenceShape.of(call)
