"""input_projection: the same product and gradients as torch.matmul, on oneDNN for float32
CPU tensors outside autocast (and for float16 ones where oneDNN has no float16 kernel, through
float32), and on torch.matmul otherwise."""

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


def test_float16_without_a_onednn_float16_kernel_runs_on_the_float32_kernel(onednn_calls):
    if projection._ONEDNN_FP16_SUPPORTED:
        pytest.skip("oneDNN has a float16 kernel on this CPU: torch.matmul already runs on it")
    x = torch.randn(5, 3, 16, dtype=torch.float16, requires_grad=True)
    weight = torch.randn(16, 24, dtype=torch.float16, requires_grad=True)
    grad = torch.randn(5, 3, 24, dtype=torch.float16)
    u = projection.input_projection(x, weight)
    u.backward(grad)
    assert len(onednn_calls) == 3
    assert u.dtype == x.grad.dtype == weight.grad.dtype == torch.float16
    # float32 products of the float16 values, rounded once to float16
    x32, weight32 = x.detach().float().requires_grad_(), weight.detach().float().requires_grad_()
    u32 = x32 @ weight32
    u32.backward(grad.float())
    torch.testing.assert_close(u, u32.half(), rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(x.grad, x32.grad.half(), rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(weight.grad, weight32.grad.half(), rtol=1e-3, atol=1e-3)


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


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_projection_with_skip_has_the_gradients_of_the_two_uses(dtype):
    x = torch.randn(6, 3, 16, dtype=dtype, requires_grad=True)
    weight = torch.randn(16, 24, dtype=dtype, requires_grad=True)
    grad_u, grad_skip = torch.randn(6, 3, 24, dtype=dtype), torch.randn(6, 3, 16, dtype=dtype)
    u, skip = projection.input_projection_with_skip(x, weight)
    torch.autograd.backward([u, skip], [grad_u, grad_skip])
    assert torch.equal(skip, x) and skip.requires_grad
    x_ref, weight_ref = (t.detach().double().requires_grad_() for t in (x, weight))
    torch.autograd.backward([x_ref @ weight_ref, x_ref], [grad_u.double(), grad_skip.double()])
    tolerance = {"rtol": 2e-2, "atol": 2e-1} if dtype == torch.bfloat16 else {}
    torch.testing.assert_close(u, (x_ref @ weight_ref).detach().to(dtype), **tolerance)
    torch.testing.assert_close(x.grad, x_ref.grad.to(dtype), **tolerance)
    torch.testing.assert_close(weight.grad, weight_ref.grad.to(dtype), **tolerance)


def test_projection_with_skip_adds_the_skip_gradient_inside_the_product(onednn_calls, monkeypatch):
    adds = []
    original = projection._LINEAR_ADD
    monkeypatch.setattr(projection, "_LINEAR_ADD", lambda *args: adds.append(args[1].shape) or original(*args))
    x = torch.randn(5, 3, 16, requires_grad=True)
    weight = torch.randn(16, 24, requires_grad=True)
    u, skip = projection.input_projection_with_skip(x, weight)
    torch.autograd.backward([u, skip], [torch.randn(5, 3, 24), torch.randn(5, 3, 16)])
    assert adds == [torch.Size([15, 16])]  # the input gradient, with the skip's gradient as its addend
    assert len(onednn_calls) == 2  # the forward and the weight gradient


def test_projection_with_skip_under_autocast_runs_in_the_autocast_dtype():
    x = torch.randn(4, 2, 8).bfloat16().requires_grad_()
    weight = torch.randn(8, 12, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        u, skip = projection.input_projection_with_skip(x, weight)
        expected = x @ weight
    assert u.dtype == torch.bfloat16 and torch.equal(u, expected) and skip.dtype == torch.bfloat16
    u.float().sum().backward()
    assert weight.grad.dtype == torch.float32 and x.grad.dtype == torch.bfloat16


def test_projection_with_skip_without_gradients_is_the_plain_projection():
    x, weight = torch.randn(4, 2, 8), torch.randn(8, 12)
    u, skip = projection.input_projection_with_skip(x, weight)
    assert skip is x and torch.equal(u, projection.input_projection(x, weight))
