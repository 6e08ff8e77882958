"""Random inputs of the recurrence for tests and experiments, and how far two results differ.

:func:`recurrence_inputs` is the one builder of random inputs: the tests' `make_case`, the
kernel comparisons of :mod:`sru_lightning.diagnostics.kernel_parity` and the fidelity table
all draw through it, each with its own sizes and scales. :func:`relative_error` is the one
error measure they report.
"""

from __future__ import annotations

import math

import torch

# mask_pad styles: a fixed pattern (a shorter last sequence and a padded first step), or a
# random length per sequence.
MASK_PAD_STYLES = ("fixed", "random")


def _check_choice(name: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"recurrence_inputs: `{name}` must be one of {choices}, got {value!r}")


def _fixed_padding(length: int, batch: int) -> torch.Tensor:
    pad = torch.zeros(length, batch, dtype=torch.bool)
    pad[length // 2 :, 0] = True  # a shorter sequence at the end
    pad[0, batch - 1] = True  # and a padded first step
    return pad


def recurrence_inputs(
    length: int,
    batch: int,
    hidden: int,
    *,
    bidirectional: bool = False,
    k: int = 3,
    single_step: bool = False,
    with_x: bool = True,
    per_step_weight_c: bool = False,
    with_c0: bool = True,
    weight_c_scale: float = 1.0,
    bias_scale: float = 1.0,
    forget_bias: float | None = None,
    c0_scale: float = 1.0,
    mask_c_drop: float | None = None,
    mask_pad: str | None = None,
    with_grad_h: bool = False,
    draw_dtype: torch.dtype = torch.float64,
    dtype: torch.dtype = torch.float64,
    seed: int = 0,
) -> dict:
    """Random tensors of one recurrence call, drawn in `draw_dtype` from one generator seeded
    with `seed` and rounded to `dtype`.

    Keys: U, x, weight_c, bias, c0, mask_c, mask_pad (None where not asked for) and, with
    `with_grad_h`, grad_h (a gradient of h, drawn last). `single_step` drops the length
    dimension. `forget_bias` replaces the random bias by that forget-gate bias and a zero reset
    bias. `mask_c_drop` draws a dropout mask keeping each column with probability 1 - drop,
    scaled by its inverse. `mask_pad` is "fixed" or "random" (see :data:`MASK_PAD_STYLES`).
    """
    if mask_pad is not None:
        _check_choice("mask_pad", mask_pad, MASK_PAD_STYLES)
    generator = torch.Generator().manual_seed(seed)
    columns = (2 if bidirectional else 1) * hidden
    lead = (batch,) if single_step else (length, batch)

    def randn(*shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=generator, dtype=draw_dtype)).to(dtype)

    inputs = {"U": randn(*lead, k * columns), "x": randn(*lead, columns) if with_x else None}
    inputs["weight_c"] = randn(*(lead if per_step_weight_c else ()), 2 * columns, scale=weight_c_scale)
    if forget_bias is None:
        inputs["bias"] = randn(2 * columns, scale=bias_scale)
    else:
        inputs["bias"] = torch.cat([torch.full((columns,), float(forget_bias)), torch.zeros(columns)]).to(dtype)
    inputs["c0"] = randn(batch, columns, scale=c0_scale) if with_c0 else None
    inputs["mask_c"] = inputs["mask_pad"] = None
    if mask_c_drop is not None:
        keep = torch.rand(batch, columns, generator=generator, dtype=draw_dtype) > mask_c_drop
        inputs["mask_c"] = keep.to(dtype) / (1 - mask_c_drop)
    if mask_pad == "fixed":
        inputs["mask_pad"] = _fixed_padding(length, batch)
    elif mask_pad == "random":
        lengths = torch.randint(1, length + 1, (batch,), generator=generator)
        inputs["mask_pad"] = torch.arange(length)[:, None] >= lengths[None, :]
    if with_grad_h:
        inputs["grad_h"] = randn(*lead, columns)
    return inputs


def make_case(
    length=5,
    batch=3,
    hidden=4,
    *,
    bidirectional=False,
    k=3,
    has_skip_term=True,
    per_step_weight_c=False,
    with_c0=True,
    with_mask_c=False,
    with_mask_pad=False,
    scale_x=0.8,
    dtype=torch.float64,
    seed=0,
):
    """Positional tensors (U, x, weight_c, bias, c0) and keyword arguments of one call."""
    inputs = recurrence_inputs(
        length,
        batch,
        hidden,
        bidirectional=bidirectional,
        k=k,
        per_step_weight_c=per_step_weight_c,
        with_c0=with_c0,
        bias_scale=0.5,
        mask_c_drop=0.3 if with_mask_c else None,
        mask_pad="fixed" if with_mask_pad else None,
        dtype=dtype,
        seed=seed,
    )
    kwargs = dict(bidirectional=bidirectional, has_skip_term=has_skip_term)
    if scale_x is not None:
        kwargs["scale_x"] = torch.tensor([scale_x], dtype=dtype)
    for name in ("mask_c", "mask_pad"):
        if inputs[name] is not None:
            kwargs[name] = inputs[name]
    return tuple(inputs[name] for name in ("U", "x", "weight_c", "bias", "c0")), kwargs


def run_with_grads(fn, tensors, kwargs, seed=1):
    """Call fn, backpropagate fixed random weights of h and c_last, return outputs and grads."""
    leaves = [None if t is None else t.detach().clone().requires_grad_(True) for t in tensors]
    h, c_last = fn(*leaves, **kwargs)
    generator = torch.Generator().manual_seed(seed)
    weight_h = torch.randn(h.shape, generator=generator, dtype=torch.float64).to(h.dtype)
    weight_c = torch.randn(c_last.shape, generator=generator, dtype=torch.float64).to(c_last.dtype)
    ((h * weight_h).sum() + (c_last * weight_c).sum()).backward()
    return h.detach(), c_last.detach(), [None if t is None else t.grad for t in leaves]


# Smallest scale an error is divided by: an all-zero expected tensor gives absolute errors.
ERROR_SCALE_FLOOR = 1e-6


def relative_error(actual: torch.Tensor, expected: torch.Tensor, *, floor: float = ERROR_SCALE_FLOOR) -> float:
    """``max |actual - expected| / max |expected|`` in float64 (the scale at least `floor`,
    taken over the finite entries of `expected`; ``floor=1.0`` measures an error relative to
    values of size one and absolute below that).

    Non-finite values: a place where both hold the same value (NaN and NaN, +inf and +inf)
    counts as equal; any other NaN or infinity, on either side, makes the error infinite. So
    does a shape mismatch. Empty tensors have error 0.
    """
    if actual.shape != expected.shape:
        return math.inf
    if actual.numel() == 0:
        return 0.0
    actual, expected = actual.double(), expected.double()
    same = (actual == expected) | (actual.isnan() & expected.isnan())
    difference = torch.where(same, 0.0, (actual - expected).abs()).max().item()
    if not math.isfinite(difference):
        return math.inf
    finite = expected[torch.isfinite(expected)]
    scale = finite.abs().max().item() if finite.numel() else 0.0
    return difference / max(scale, floor)
