"""The pure-PyTorch reference is the specification: check it against hand-written math,
its padding semantics, and the `sru` package's own naive implementation (layout parity)."""

from __future__ import annotations

import itertools
import warnings

import pytest
import torch

from sru_lightning.ops import sru_recurrence_reference
from sru_lightning.ops.testing import make_case


def test_one_step_matches_the_formula():
    U = torch.tensor([[[0.5, -1.0, 2.0]]], dtype=torch.float64)  # (L=1, B=1, D*k=3)
    x = torch.tensor([[[0.3]]], dtype=torch.float64)
    weight_c = torch.tensor([0.7, -0.2], dtype=torch.float64)
    bias = torch.tensor([0.1, 0.4], dtype=torch.float64)
    c0 = torch.tensor([[1.5]], dtype=torch.float64)
    h, c = sru_recurrence_reference(U, x, weight_c, bias, c0, scale_x=2.0)
    f = torch.sigmoid(torch.tensor(-1.0 + 0.7 * 1.5 + 0.1, dtype=torch.float64))
    r = torch.sigmoid(torch.tensor(2.0 - 0.2 * 1.5 + 0.4, dtype=torch.float64))
    c_expected = f * 1.5 + (1 - f) * 0.5
    h_expected = r * c_expected + (1 - r) * 2.0 * 0.3
    assert torch.allclose(c.flatten(), c_expected.reshape(1))
    assert torch.allclose(h.flatten(), h_expected.reshape(1))


def test_padding_keeps_state_and_zeroes_output():
    (U, x, weight_c, bias, c0), kwargs = make_case(length=6, batch=3, with_mask_pad=True)
    h, c_last = sru_recurrence_reference(U, x, weight_c, bias, c0, **kwargs)
    pad = kwargs["mask_pad"]
    assert torch.all(h[pad] == 0)
    # Batch element 0 is padded from step 3 on: its final state is the state after step 2.
    kwargs_short = dict(kwargs, mask_pad=None)
    _, c_short = sru_recurrence_reference(U[:3, :1], x[:3, :1], weight_c, bias, c0[:1], **kwargs_short)
    assert torch.allclose(c_last[:1], c_short)


def test_backward_direction_runs_from_the_end():
    (U, x, weight_c, bias, c0), kwargs = make_case(bidirectional=True, hidden=3)
    h, c_last = sru_recurrence_reference(U, x, weight_c, bias, c0, **kwargs)
    # The second direction over the time-reversed input equals a forward pass over it.
    D = 3
    U_b = U.view(5, 3, 2, D, 3)[:, :, 1].reshape(5, 3, D * 3).flip(0)
    x_b = x.view(5, 3, 2, D)[:, :, 1].flip(0)
    w_b = weight_c.view(2, 2, D)[:, 1].reshape(-1)
    b_b = bias.view(2, 2, D)[:, 1].reshape(-1)
    h_b, c_b = sru_recurrence_reference(U_b, x_b, w_b, b_b, c0[:, D:], scale_x=kwargs["scale_x"])
    assert torch.allclose(h[:, :, D:], h_b.flip(0))
    assert torch.allclose(c_last[:, D:], c_b)


def test_half_compute_dtype_runs_in_half_and_returns_u_dtype():
    (U, x, weight_c, bias, c0), kwargs = make_case(dtype=torch.float32)
    h_half, _ = sru_recurrence_reference(U, x, weight_c, bias, c0, compute_dtype=torch.float16, **kwargs)
    h_full, _ = sru_recurrence_reference(U, x, weight_c, bias, c0, **kwargs)
    assert h_half.dtype == torch.float32
    difference = (h_half - h_full).abs().max().item()
    assert 0 < difference < 5e-2


@pytest.mark.peer
@pytest.mark.parametrize(
    "bidirectional,k,has_skip_term,per_step",
    list(itertools.product([False, True], [3, 4], [True, False], [False, True])),
)
def test_reference_matches_sru_package_layout(bidirectional, k, has_skip_term, per_step):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from sru.ops import elementwise_recurrence_naive
    (U, x, weight_c, bias, c0), kwargs = make_case(
        bidirectional=bidirectional,
        k=k,
        has_skip_term=has_skip_term,
        per_step_weight_c=per_step,
        with_mask_c=True,
        with_mask_pad=True,
    )
    hidden = 4
    with torch.enable_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        h_sru, c_sru = elementwise_recurrence_naive(
            U,
            x,
            weight_c,
            bias,
            c0,
            0,
            hidden,
            bidirectional,
            has_skip_term,
            kwargs["scale_x"],
            kwargs["mask_c"],
            kwargs["mask_pad"],
        )
    h, c_last = sru_recurrence_reference(U, x, weight_c, bias, c0, **kwargs)
    assert torch.allclose(h, h_sru, atol=1e-12)
    assert torch.allclose(c_last, c_sru, atol=1e-12)
