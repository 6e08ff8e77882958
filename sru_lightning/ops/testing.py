"""Random inputs of the recurrence for tests and experiments: `make_case` builds one call."""

from __future__ import annotations

import torch


def make_case(
    length=5, batch=3, hidden=4, *, bidirectional=False, k=3, has_skip_term=True,
    per_step_weight_c=False, with_c0=True, with_mask_c=False, with_mask_pad=False,
    scale_x=0.8, dtype=torch.float64, seed=0,
):
    """Positional tensors (U, x, weight_c, bias, c0) and keyword arguments of one call."""
    generator = torch.Generator().manual_seed(seed)
    dirs = 2 if bidirectional else 1
    width = dirs * hidden

    def randn(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64).to(dtype)

    U = randn(length, batch, width * k)
    x = randn(length, batch, width)
    weight_c = randn(length, batch, 2 * width) if per_step_weight_c else randn(2 * width)
    bias = randn(2 * width) * 0.5
    c0 = randn(batch, width) if with_c0 else None
    kwargs = dict(bidirectional=bidirectional, has_skip_term=has_skip_term)
    if scale_x is not None:
        kwargs["scale_x"] = torch.tensor([scale_x], dtype=dtype)
    if with_mask_c:
        kwargs["mask_c"] = (torch.rand(batch, width, generator=generator, dtype=torch.float64) > 0.3).to(dtype) / 0.7
    if with_mask_pad:
        pad = torch.zeros(length, batch, dtype=torch.bool)
        pad[length // 2 :, 0] = True  # a shorter sequence at the end
        pad[0, batch - 1] = True      # and a padded first step
        kwargs["mask_pad"] = pad
    return (U, x, weight_c, bias, c0), kwargs


def run_with_grads(fn, tensors, kwargs, seed=1):
    """Call fn, backpropagate fixed random weights of h and c_last, return outputs and grads."""
    leaves = [None if t is None else t.detach().clone().requires_grad_(True) for t in tensors]
    h, c_last = fn(*leaves, **kwargs)
    generator = torch.Generator().manual_seed(seed)
    weight_h = torch.randn(h.shape, generator=generator, dtype=torch.float64).to(h.dtype)
    weight_c = torch.randn(c_last.shape, generator=generator, dtype=torch.float64).to(c_last.dtype)
    ((h * weight_h).sum() + (c_last * weight_c).sum()).backward()
    return h.detach(), c_last.detach(), [None if t is None else t.grad for t in leaves]
