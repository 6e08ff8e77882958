"""input_projection: the same product and gradients as torch.matmul, on oneDNN for float32
CPU tensors outside autocast and on torch.matmul otherwise."""

from __future__ import annotations

import pytest
import torch

from sru_lightning.ops import projection


@pytest.fixture
def onednn_calls(monkeypatch):
    if not projection.onednn_linear_available():
        pytest.skip("this torch build has no oneDNN linear kernel")
    calls = []
    original = projection._LINEAR

    def counting(*args):
        calls.append(args[0].shape)
        return original(*args)

    monkeypatch.setattr(projection, "_LINEAR", counting)
    return calls


def test_float32_runs_on_onednn_and_matches_matmul(onednn_calls):
    x = torch.randn(5, 3, 16, requires_grad=True)
    weight = torch.randn(16, 24, requires_grad=True)
    grad = torch.randn(5, 3, 24)
    u = projection.input_projection(x, weight)
    u.backward(grad)
    assert len(onednn_calls) == 3  # forward, grad of x, grad of weight
    x_ref, weight_ref = x.detach().clone().requires_grad_(), weight.detach().clone().requires_grad_()
    u_ref = x_ref @ weight_ref
    u_ref.backward(grad)
    torch.testing.assert_close(u, u_ref)
    torch.testing.assert_close(x.grad, x_ref.grad)
    torch.testing.assert_close(weight.grad, weight_ref.grad)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_other_dtypes_use_matmul(onednn_calls, dtype):
    x, weight = torch.randn(4, 8, dtype=dtype), torch.randn(8, 6, dtype=dtype)
    assert torch.equal(projection.input_projection(x, weight), x @ weight)
    assert onednn_calls == []


def test_autocast_uses_matmul_so_the_output_follows_autocast(onednn_calls):
    x, weight = torch.randn(4, 8), torch.randn(8, 6)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        u = projection.input_projection(x, weight)
    assert u.dtype == torch.bfloat16 and onednn_calls == []


def test_a_single_row_uses_matmul(onednn_calls):
    x, weight = torch.randn(1, 1, 16), torch.randn(16, 48)  # one decoding step at batch 1
    assert torch.equal(projection.input_projection(x, weight), x @ weight)
    assert onednn_calls == []
    projection.input_projection(torch.randn(2, 1, 16), weight)
    assert len(onednn_calls) == 1
