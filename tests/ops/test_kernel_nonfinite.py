"""NaN and Inf in the input travel through SRU the way NaN travels through nn.LSTM.

A non-finite value poisons its own batch element from that step on (both ways in time when
bidirectional) and nothing else; the kernels never crash on it, in any storage dtype,
forward, backward or inference; padded steps never let it leak.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from sru_lightning.nn import SRU
from sru_lightning.ops import functional, sru_recurrence_reference, trace_storage_dtypes

L, B, IN, H = 5, 3, 3, 4
STORAGE_DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
BAD_VALUES = [float("nan"), float("inf"), float("-inf")]


def non_finite_steps(output: torch.Tensor, directions: int) -> torch.Tensor:
    """(L, B, dirs) bool: where any unit of a direction is not finite."""
    return ~torch.isfinite(output.reshape(L, B, directions, H)).all(-1)


@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize("bad", BAD_VALUES, ids=["nan", "inf", "-inf"])
def test_layer_output_is_poisoned_exactly_where_lstm_output_is(bidirectional, bad):
    # nn.LSTM squashes an infinite pre-activation (its gates and candidate saturate), so it
    # is fed NaN to mark the region a bad value can reach; SRU's candidate is not squashed,
    # so +-Inf must poison that same region (as Inf or NaN), and nothing outside it.
    x = torch.randn(L, B, IN)
    x_for_lstm = x.clone()
    x[2, 0, 1] = bad
    x_for_lstm[2, 0, 1] = float("nan")
    directions = 2 if bidirectional else 1
    sru_out, sru_c = SRU(IN, H, num_layers=2, bidirectional=bidirectional)(x)
    lstm_out, (_, lstm_c) = nn.LSTM(IN, H, num_layers=2, bidirectional=bidirectional)(x_for_lstm)

    expected = non_finite_steps(lstm_out, directions)
    assert expected[2:, 0].all() and not expected[:, 1:].any()
    assert torch.equal(non_finite_steps(sru_out, directions), expected)
    # the other batch elements are untouched, in h and in the final states
    assert torch.isfinite(sru_out[:, 1:]).all() and torch.isfinite(sru_c[:, 1:]).all()
    assert not torch.isfinite(sru_c[:, 0]).all() and not torch.isfinite(lstm_c[:, 0]).all()


def recurrence_inputs(dtype, bidirectional=False):
    directions = 2 if bidirectional else 1
    columns = directions * H
    generator = torch.Generator().manual_seed(0)
    U = torch.randn(L, B, 3 * columns, generator=generator).to(dtype)
    x = torch.randn(L, B, columns, generator=generator).to(dtype)
    weight_c = (0.5 * torch.randn(2 * columns, generator=generator)).to(dtype)
    bias = torch.zeros(2 * columns, dtype=dtype)
    return U, x, weight_c, bias


@pytest.mark.parametrize("dtype", STORAGE_DTYPES, ids=str)
@pytest.mark.parametrize("bad", BAD_VALUES, ids=["nan", "inf", "-inf"])
def test_kernels_run_through_non_finite_values_in_every_storage_dtype(dtype, bad):
    U, x, weight_c, bias = recurrence_inputs(dtype)
    U[1, 0, 0] = bad  # the candidate value of column 0 of batch element 0 at step 1
    U.requires_grad_(True)

    with trace_storage_dtypes() as calls:
        h, c_last = functional.sru_recurrence(U, x, weight_c, bias)
        h.float().sum().backward()
        h_inference, _ = functional.sru_recurrence_inference(U.detach(), x, weight_c, bias)
    assert {call.direction for call in calls} >= {"forward", "backward", "inference"}
    assert {call.storage_dtype for call in calls} == {dtype}

    for output in (h, h_inference):
        assert torch.isfinite(output[:1]).all(), "steps before the bad value stay finite"
        assert torch.isfinite(output[:, 1:]).all(), "other batch elements stay finite"
        assert not torch.isfinite(output[1:, 0, 0]).all(), "the bad value must show up downstream"
        assert torch.isfinite(output[:, 0, 1:]).all(), "other columns of the same element stay finite"
    assert torch.isfinite(c_last[1:]).all() and not torch.isfinite(c_last[0, 0])
    assert torch.isfinite(U.grad[:, 1:]).all(), "gradients of other batch elements stay finite"


@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
def test_reference_agrees_with_the_kernel_on_where_nan_goes(bidirectional):
    U, x, weight_c, bias = recurrence_inputs(torch.float32, bidirectional)
    U[2, 1, 3] = float("nan")
    h_kernel, c_kernel = functional.sru_recurrence(U, x, weight_c, bias, bidirectional=bidirectional)
    h_reference, c_reference = sru_recurrence_reference(U, x, weight_c, bias, bidirectional=bidirectional)
    assert torch.equal(torch.isnan(h_kernel), torch.isnan(h_reference))
    assert torch.equal(torch.isnan(c_kernel), torch.isnan(c_reference))
    finite = torch.isfinite(h_reference)
    torch.testing.assert_close(h_kernel[finite], h_reference[finite])


@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize("inference", [False, True], ids=["train", "inference"])
def test_non_finite_values_in_padding_do_not_leak(bidirectional, inference):
    # Padded positions often hold garbage; like a packed nn.LSTM, SRU must ignore them.
    model = SRU(IN, H, num_layers=2, bidirectional=bidirectional)
    x = torch.randn(L, B, IN)
    mask_pad = torch.zeros(L, B, dtype=torch.bool)
    mask_pad[3:, 0] = True  # element 0 has length 3
    x[3, 0] = float("nan")
    x[4, 0] = float("inf")
    with torch.set_grad_enabled(not inference):
        h, c_last = model(x, mask_pad=mask_pad)
    assert torch.isfinite(h).all() and torch.isfinite(c_last).all()
    assert torch.equal(h[3:, 0], torch.zeros_like(h[3:, 0]))
    # and the valid steps equal those of the same sequence without padding
    h_short, c_short = model(x[:3, :1])
    torch.testing.assert_close(h[:3, :1], h_short)
    torch.testing.assert_close(c_last[:, :1], c_short)


@pytest.mark.parametrize("hidden", [5, 64], ids=["partial-block", "full-block"])
@pytest.mark.parametrize("gate", [1, 2], ids=["forget", "reset"])
def test_nan_in_one_gate_logit_stays_in_that_gate(gate, hidden):
    # float32 computes both gates with one shared division: a NaN forget logit must still
    # poison c (and so every later h), while a NaN reset logit poisons only that step's h.
    generator = torch.Generator().manual_seed(3)
    U = torch.randn(L, 2, 3 * hidden, generator=generator)
    x = torch.randn(L, 2, hidden, generator=generator)
    weight_c = 0.5 * torch.randn(2 * hidden, generator=generator)
    bias = torch.zeros(2 * hidden)
    U[2, 0, 3 * 1 + gate] = float("nan")  # column 1 of batch element 0, step 2
    h, c_last = functional.sru_recurrence(U, x, weight_c, bias)
    h_ref, c_ref = sru_recurrence_reference(U.double(), x.double(), weight_c.double(), bias.double())
    assert torch.equal(torch.isnan(h), torch.isnan(h_ref))
    assert torch.equal(torch.isnan(c_last), torch.isnan(c_ref))
    poisoned_later = torch.isnan(h[3:, 0, 1]).all().item()
    assert poisoned_later == (gate == 1)
    assert torch.isnan(h[2, 0, 1]) and torch.isfinite(h[:, 1]).all()
    finite = torch.isfinite(h_ref)
    torch.testing.assert_close(h[finite], h_ref[finite].float(), rtol=1e-5, atol=1e-5)
