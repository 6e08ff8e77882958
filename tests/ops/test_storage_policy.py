"""The precision policy at the op boundary: which storage dtype runs, mixed-dtype inputs,
autocast, outputs in U's dtype, errors that name the argument."""

from __future__ import annotations

import pytest
import torch

from sru_lightning import ops
from sru_lightning.ops import functional
from sru_lightning.ops.testing import make_case


@pytest.mark.parametrize(
    "policy,u_dtype,autocast_dtype,expected",
    [
        ("fp32", torch.float16, None, torch.float32),
        ("fp32", torch.float64, None, torch.float64),
        ("fp32", torch.bfloat16, torch.bfloat16, torch.float32),
        ("half", torch.float16, None, torch.float16),
        ("half", torch.float32, torch.bfloat16, torch.bfloat16),
        ("half", torch.float32, None, torch.float32),
        ("auto", torch.float32, None, torch.float32),
        ("auto", torch.float64, None, torch.float64),
        ("auto", torch.bfloat16, None, torch.bfloat16),
        ("auto", torch.float32, torch.bfloat16, torch.bfloat16),
    ],
)
def test_resolve_storage_dtype(policy, u_dtype, autocast_dtype, expected):
    if autocast_dtype is None:
        assert ops.resolve_storage_dtype(policy, u_dtype, device_type="cpu") == expected
    else:
        with torch.autocast("cpu", dtype=autocast_dtype):
            assert ops.resolve_storage_dtype(policy, u_dtype, device_type="cpu") == expected


def test_accumulation_dtype():
    assert ops.accumulation_dtype(torch.float64) == torch.float64
    for storage in (torch.float32, torch.float16, torch.bfloat16):
        assert ops.accumulation_dtype(storage) == torch.float32


def test_validate_policy_names_argument_expected_and_received():
    assert ops.validate_policy("half") == "half"
    with pytest.raises(ValueError, match=r"`recurrence_policy` must be one of \('auto', 'fp32', 'half'\), got 'bf16'"):
        ops.validate_policy("bf16", argument="recurrence_policy")
    with pytest.raises(TypeError, match="`policy` must be a str"):
        ops.validate_policy(None)


def test_entry_points_are_module_attributes_looked_up_at_call_time(monkeypatch):
    (U, x, weight_c, bias, c0), kwargs = make_case(dtype=torch.float32)
    seen = []
    original = functional.sru_recurrence

    def patched(*args, **kw):
        seen.append(True)
        return original(*args, **kw)

    monkeypatch.setattr(functional, "sru_recurrence", patched)
    ops.functional.sru_recurrence(U, x, weight_c, bias, c0, **kwargs)
    assert seen == [True]


@pytest.mark.parametrize("use_autocast", [False, True], ids=["plain", "autocast-bf16"])
@pytest.mark.parametrize("policy", ["auto", "fp32", "half"])
def test_mixed_dtype_inputs_never_raise_and_return_u_dtype(policy, use_autocast):
    (U, x, weight_c, bias, c0), kwargs = make_case(dtype=torch.float32, with_mask_c=True)
    U = U.half().requires_grad_()  # fp16 U with fp32 x, weights, c0, masks
    weight_c.requires_grad_()
    context = torch.autocast("cpu", dtype=torch.bfloat16) if use_autocast else torch.autocast("cpu", enabled=False)
    with ops.trace_storage_dtypes() as calls, context:
        h, c_last = ops.sru_recurrence(U, x, weight_c, bias, c0, policy=policy, **kwargs)
        h_inf, _ = ops.sru_recurrence_inference(U, x, weight_c, bias, c0, policy=policy, **kwargs)
        h.float().sum().backward()
    assert h.dtype == c_last.dtype == h_inf.dtype == torch.float16
    assert U.grad.dtype == torch.float16 and weight_c.grad.dtype == torch.float32
    expected = torch.float32 if policy == "fp32" else torch.float16
    assert [call.storage_dtype for call in calls] == [expected, expected, expected]
    assert [call.direction for call in calls] == ["forward", "inference", "backward"]
    assert {call.backend for call in calls} == {"cpp"}


def test_trace_shows_autocast_storage_for_fp32_u_under_half_policy():
    (U, x, weight_c, bias, c0), kwargs = make_case(dtype=torch.float32)
    with ops.trace_storage_dtypes() as calls:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h, _ = ops.sru_recurrence(U, x, weight_c, bias, c0, policy="half", **kwargs)
        ops.sru_recurrence(U, x, weight_c, bias, c0, policy="fp32", **kwargs)
    assert h.dtype == torch.float32
    assert [call.storage_dtype for call in calls] == [torch.bfloat16, torch.float32]
    assert calls[0].device_type == "cpu" and calls[0].accumulation_dtype == torch.float32


def test_trace_records_nothing_outside_the_block():
    (U, x, weight_c, bias, c0), kwargs = make_case(dtype=torch.float32)
    with ops.trace_storage_dtypes() as calls:
        pass
    ops.sru_recurrence(U, x, weight_c, bias, c0, **kwargs)
    assert calls == []


@pytest.mark.parametrize(
    "change,pattern",
    [
        (dict(U=torch.zeros(5, 3, 10)), r"`U` last dimension must be dirs\*D\*k = 12 .* got \(5, 3, 10\)"),
        (dict(x=torch.zeros(5, 3, 5)), r"`x` must have shape \(5, 3, 4\), got \(5, 3, 5\)"),
        (dict(x=None), r"`x` is required"),
        (dict(weight_c=torch.zeros(7)), r"`weight_c` must have shape \(8,\) or \(5, 3, 8\), got \(7,\)"),
        (dict(c0=torch.zeros(4)), r"`c0` must have shape \(3, 4\) \(batch, dirs\*D\), got \(4,\)"),
        (dict(mask_pad=torch.zeros(3, 5, dtype=torch.bool)), r"`mask_pad` must have shape \(5, 3\)"),
        (dict(policy="fp16"), r"`policy` must be one of"),
    ],
)
def test_bad_arguments_name_the_argument(change, pattern):
    (U, x, weight_c, bias, c0), kwargs = make_case(dtype=torch.float32)
    arguments = dict(U=U, x=x, weight_c=weight_c, bias=bias, c0=c0, **kwargs)
    arguments.update(change)
    with pytest.raises(ValueError, match=pattern):
        ops.sru_recurrence(**arguments)


def test_compile_fullgraph_of_the_entry_point_and_a_layer():
    from sru_lightning.nn import SRU

    (U, x, weight_c, bias, c0), kwargs = make_case(dtype=torch.float32, bidirectional=True, with_mask_pad=True)
    leaves = [t.requires_grad_() for t in (U, x, weight_c, bias, c0)]

    def loss(U, x, weight_c, bias, c0):
        h, c_last = functional.sru_recurrence(U, x, weight_c, bias, c0, **kwargs)
        return h.square().sum() + c_last.sum()

    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
    compiled_grads = torch.autograd.grad(compiled(*leaves), leaves)
    eager_grads = torch.autograd.grad(loss(*leaves), leaves)
    for got, expected in zip(compiled_grads, eager_grads):
        torch.testing.assert_close(got, expected)

    torch.manual_seed(0)
    layer = SRU(6, 6, num_layers=2, bidirectional=False)
    inputs = torch.randn(4, 2, 6)
    compiled_layer = torch.compile(layer, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled_layer(inputs)[0], layer(inputs)[0])
    compiled_layer(inputs)[0].sum().backward()
    assert all(p.grad is not None for p in layer.parameters() if p.requires_grad)


@pytest.mark.slow
def test_compile_with_inductor_matches_eager():
    (U, x, weight_c, bias, c0), kwargs = make_case(dtype=torch.float32, k=4)

    def forward(U, weight_c, bias, c0):
        h, c_last = functional.sru_recurrence(U, None, weight_c, bias, c0, **kwargs)
        return torch.tanh(h) * 2, c_last

    compiled = torch.compile(forward, fullgraph=True)
    for got, expected in zip(compiled(U, weight_c, bias, c0), forward(U, weight_c, bias, c0)):
        torch.testing.assert_close(got, expected)
