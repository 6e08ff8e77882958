"""Argument checks shared by the SRU layers (:class:`SRUCell`, :class:`SRU`) and the SRU++ layers.

Every error names the argument, what was expected and what was received, so a wrong call
fails at the layer that received it rather than deep inside the recurrence kernel.
"""

from __future__ import annotations

import numbers

import torch
from torch import Tensor


def check_positive_int(owner: str, name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{owner}: `{name}` must be an int, got {type(value).__name__} {value!r}")
    if value <= 0:
        raise ValueError(f"{owner}: `{name}` must be a positive int, got {value}")
    return int(value)


def check_non_negative_int(owner: str, name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{owner}: `{name}` must be an int, got {type(value).__name__} {value!r}")
    if value < 0:
        raise ValueError(f"{owner}: `{name}` must be >= 0, got {value}")
    return int(value)


def check_probability(owner: str, name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{owner}: `{name}` must be a float in [0, 1), got {type(value).__name__} {value!r}")
    if not 0.0 <= float(value) < 1.0:
        raise ValueError(f"{owner}: `{name}` must be in [0, 1), got {value}")
    return float(value)


def check_floating_tensor(owner: str, name: str, value) -> Tensor:
    if not isinstance(value, Tensor):
        raise TypeError(f"{owner}: `{name}` must be a torch.Tensor, got {type(value).__name__}")
    if not value.is_floating_point():
        raise TypeError(
            f"{owner}: `{name}` must be a floating-point tensor (float16, bfloat16, float32 or "
            f"float64), got dtype {value.dtype}"
        )
    return value


def check_input_dtype(owner: str, value: Tensor, weight_dtype: torch.dtype) -> None:
    """Outside autocast the input projection needs the input in the weights' dtype."""
    if value.dtype == weight_dtype or torch.is_autocast_enabled(value.device.type):
        return
    raise TypeError(
        f"{owner}: `input` has dtype {value.dtype}, but the layer's weights are {weight_dtype}; cast one to "
        f"the other (input.to({weight_dtype}) or layer.to({value.dtype})), or run under torch.autocast"
    )


def check_same_device(owner: str, name: str, value: Tensor, expected: torch.device, what: str) -> None:
    if value.device != expected:
        raise ValueError(f"{owner}: `{name}` must be on {what} device {expected}, got device {value.device}")


def check_shape(owner: str, name: str, value: Tensor, expected: tuple, meaning: str) -> None:
    if tuple(value.shape) != tuple(expected):
        raise ValueError(f"{owner}: `{name}` must have shape {tuple(expected)} {meaning}, got {tuple(value.shape)}")


def as_padding_mask(
    owner: str, mask_pad, expected: tuple, meaning: str, device: torch.device, name: str = "mask_pad"
) -> Tensor:
    """Validate a padding mask (the argument ``name``) and return it as a bool tensor (True = padding).

    Bool, integer (0/1) and floating (0.0/1.0) masks are accepted, as the ``sru`` package does;
    any non-zero entry marks a padded position.
    """
    if not isinstance(mask_pad, Tensor):
        raise TypeError(f"{owner}: `{name}` must be a torch.Tensor, got {type(mask_pad).__name__}")
    if mask_pad.is_complex():
        raise TypeError(f"{owner}: `{name}` must be a bool, integer or float tensor, got {mask_pad.dtype}")
    check_shape(owner, name, mask_pad, expected, meaning)
    check_same_device(owner, name, mask_pad, device, "the input's")
    return mask_pad if mask_pad.dtype == torch.bool else mask_pad != 0


def to_time_major(
    owner: str, input, input_size: int, batch_first: bool, device: torch.device, one_step_allowed: bool = True
):
    """Check a layer input and return ``(x, one_step)`` with x laid out (L, B, input_size).

    A 2-D input is one time step (B, input_size) and comes back as (1, B, input_size), unless
    ``one_step_allowed`` is False (then only 3-D input is accepted).
    """
    check_floating_tensor(owner, "input", input)
    if input.dim() not in ((2, 3) if one_step_allowed else (3,)):
        layout = "(B, L, input_size)" if batch_first else "(L, B, input_size)"
        one_step = " or 2-D (B, input_size) for one step" if one_step_allowed else ""
        raise ValueError(f"{owner}: `input` must be 3-D {layout}{one_step}, got shape {tuple(input.shape)}")
    if input.shape[-1] != input_size:
        raise ValueError(
            f"{owner}: `input` last dimension must be input_size={input_size}, got shape {tuple(input.shape)}"
        )
    check_same_device(owner, "input", input, device, "the parameters'")
    one_step = input.dim() == 2
    if one_step:
        return input.unsqueeze(0), True
    return (input.transpose(0, 1) if batch_first else input), False


def time_major_padding_mask(
    owner: str,
    mask_pad,
    length: int,
    batch: int,
    one_step: bool,
    batch_first: bool,
    device: torch.device,
    name: str = "mask_pad",
) -> Tensor:
    """Check a padding mask (the argument ``name``) against the input's layout and return it as (L, B) bool."""
    if one_step:
        expected, meaning = (batch,), "(batch,) for one step"
    elif batch_first:
        expected, meaning = (batch, length), "(batch, length) with batch_first=True"
    else:
        expected, meaning = (length, batch), "(length, batch)"
    mask = as_padding_mask(owner, mask_pad, expected, meaning, device, name)
    if one_step:
        return mask.unsqueeze(0)
    return mask.t() if batch_first else mask
