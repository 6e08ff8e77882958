"""Contracts of the custom ops torch.ops.sru_lightning.*: what torch.library.opcheck checks
(schema, autograd registration, fake kernels whose outputs match the real ones in shape and
strides, AOT dispatch) for contiguous, transposed (batch_first) and expanded inputs;
torch.compile against eager; second-order gradients."""

from __future__ import annotations

import pytest
import torch

from sru_lightning.ops import (
    functional,
    op,  # noqa: F401  (registers the fake kernels and autograd)
    sru_recurrence_reference,
    trace_storage_dtypes,
)
from sru_lightning.ops.testing import make_case

LAYOUTS = ("contiguous", "transposed", "expanded")


def laid_out(tensor, layout, lead_dims):
    """``tensor`` with the same values in a given memory layout.

    transposed: (L, B, ...) stored as (B, L, ...), what batch_first hands the op;
    expanded: a batch dimension of stride 0 (every batch element equal)."""
    if tensor is None or layout == "contiguous":
        return tensor
    if layout == "transposed" and lead_dims == 2:
        return tensor.transpose(0, 1).contiguous().transpose(0, 1)
    if layout == "expanded":
        batch_dim = lead_dims - 1
        first = tensor.narrow(batch_dim, 0, 1)
        return first.expand_as(tensor)
    return tensor


def forward_arguments(
    layout, *, k=3, bidirectional=False, per_step_weight_c=False, with_c_starts=False, dtype=torch.float64
):
    (U, x, weight_c, bias, c0), kwargs = make_case(
        length=4,
        batch=3,
        hidden=5,
        k=k,
        bidirectional=bidirectional,
        per_step_weight_c=per_step_weight_c,
        with_mask_c=True,
        with_mask_pad=True,
        dtype=dtype,
    )
    U, x = laid_out(U, layout, 2), laid_out(x, layout, 2)
    weight_c = laid_out(weight_c, layout, 2) if per_step_weight_c else weight_c
    c0, mask_c = laid_out(c0, layout, 1), laid_out(kwargs["mask_c"], layout, 1)
    mask_pad = laid_out(kwargs["mask_pad"], layout, 2)
    reset = torch.zeros(mask_pad.shape, dtype=torch.bool)
    reset[0, 1] = reset[2, 0] = True  # documents starting inside the rows
    reset = laid_out(reset, layout, 2)
    # the states those documents start from (the variant with c_starts; None in the others)
    c_starts = laid_out(torch.randn(*mask_pad.shape, bias.shape[0] // 2, dtype=dtype), layout, 2)
    differentiable = [t.detach().requires_grad_() for t in (U, x, weight_c, bias, c0, c_starts)]
    U, x, weight_c, bias, c0, c_starts = differentiable
    return (
        U,
        x if k == 3 else None,
        weight_c,
        bias,
        c0,
        kwargs["scale_x"],
        1.0,
        mask_c,
        mask_pad,
        reset,
        c_starts if with_c_starts else None,
        bidirectional,
        True,
        True,
    )


VARIANTS = [dict(), dict(k=4, bidirectional=True, with_c_starts=True), dict(per_step_weight_c=True)]


@pytest.mark.parametrize("variant", VARIANTS, ids=["k3", "k4-bidirectional", "per-step-weight_c"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_opcheck_recurrence_forward(layout, variant):
    arguments = forward_arguments(layout, **variant)
    torch.library.opcheck(torch.ops.sru_lightning.recurrence_forward.default, arguments)


@pytest.mark.parametrize("variant", VARIANTS, ids=["k3", "k4-bidirectional", "per-step-weight_c"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_opcheck_recurrence_backward(layout, variant):
    forward = forward_arguments(layout, **variant)
    with torch.no_grad():
        h, c_last, c_all = torch.ops.sru_lightning.recurrence_forward(*forward)
    (U, x, weight_c, bias, c0, scale_x, scale_value, mask_c, mask_pad, reset, c_starts, bidirectional, skip, _) = (
        forward
    )
    grad_h = laid_out(torch.randn_like(h), layout, 2)
    grad_c_last = laid_out(torch.randn_like(c_last), layout, 1)
    grad_c_all = laid_out(torch.randn_like(c_all), layout, 2)
    arguments = (
        grad_h,
        grad_c_last,
        grad_c_all,
        U.detach(),
        None if x is None else x.detach(),
        weight_c.detach(),
        bias.detach(),
        c0.detach(),
        scale_x,
        scale_value,
        mask_c,
        mask_pad,
        reset,
        None if c_starts is None else c_starts.detach(),
        c_all,
        bidirectional,
        skip,
    )
    torch.library.opcheck(torch.ops.sru_lightning.recurrence_backward.default, arguments)


@pytest.mark.parametrize("name", ["cpu_vector_level", "cpu_vector_levels", "release_cached_buffers"])
def test_opcheck_of_the_utility_ops(name):
    torch.library.opcheck(
        getattr(torch.ops.sru_lightning, name).default, (), test_utils=("test_schema", "test_autograd_registration")
    )


def test_every_op_of_the_namespace_is_checked():
    checked = {
        "recurrence_forward",
        "recurrence_backward",
        "cpu_vector_level",
        "cpu_vector_levels",
        "release_cached_buffers",
    }
    registered = {
        name.split("::", 1)[1] for name in torch._C._dispatch_get_all_op_names() if name.startswith("sru_lightning::")
    }
    assert registered == checked


# -- one argument list: the C++ schemas against ops/signature.py --------------------------------
from sru_lightning.ops import signature  # noqa: E402


@pytest.mark.parametrize("name", ["recurrence_forward", "recurrence_backward"])
def test_registered_schema_is_the_one_signature_describes(name):
    registered = str(getattr(torch.ops.sru_lightning, name).default._schema)
    assert registered == f"sru_lightning::{signature.SCHEMAS[name]}"


def test_a_schema_that_differs_from_signature_fails_loudly(monkeypatch):
    changed = dict(
        signature.SCHEMAS,
        recurrence_forward=signature.SCHEMAS["recurrence_forward"].replace("bool store_c", "bool store_c, bool extra"),
    )
    monkeypatch.setattr(signature, "SCHEMAS", changed)
    with pytest.raises(RuntimeError, match=r"recurrence_forward differs from sru_lightning/ops/signature.py"):
        signature.check_registered_schemas()


def test_autograd_returns_one_gradient_slot_per_forward_argument():
    gradients = signature.forward_input_gradients({"U": "gU", "x": "gx", "bias": "gb", "mask_c": "ignored"})
    assert len(gradients) == len(signature.FORWARD_ARGUMENTS)
    by_name = dict(zip((a.name for a in signature.FORWARD_ARGUMENTS), gradients))
    assert by_name["U"] == "gU" and by_name["x"] == "gx" and by_name["bias"] == "gb"
    assert by_name["weight_c"] is None and by_name["mask_c"] is None and by_name["store_c"] is None


def test_backward_returns_the_gradients_of_the_differentiable_arguments():
    assert signature.BACKWARD_RETURNS == ("grad_U", "grad_x", "grad_weight_c", "grad_bias", "grad_c0", "grad_c_starts")


def test_cpp_vector_level_names_are_the_python_ones():
    assert tuple(torch.ops.sru_lightning.cpu_vector_levels()) == signature.CPU_VECTOR_LEVELS


# -- torch.compile against eager ----------------------------------------------------------------
from sru_lightning.diagnostics import compile_parity  # noqa: E402


@pytest.mark.parametrize("case", compile_parity.CASES, ids=lambda case: case.name)
def test_compiled_sru_equals_eager_through_aot_autograd(case):
    # aot_eager runs the fake kernels and the joint graph of AOTAutograd, where fake strides matter.
    differences = compile_parity.compare_compiled_with_eager(case, backend="aot_eager")
    assert max(differences.values()) <= 1e-5, differences
    assert {"output", "c_last", "grad input"} <= set(differences) and len(differences) > 3


@pytest.mark.slow
def test_compiled_sru_equals_eager_with_inductor():
    differences = compile_parity.compare_compiled_with_eager(compile_parity.CASES[0], backend="inductor")
    assert max(differences.values()) <= 1e-4, differences


@pytest.mark.slow
def test_inductor_backward_of_batch_first_inputs_equals_eager():
    # Failed ("expected stride ...") while the fake backward copied the transposed input strides.
    differences = compile_parity.compare_compiled_op_with_batch_first_inputs(backend="inductor")
    assert max(differences.values()) <= 1e-6, differences


# -- second-order gradients -----------------------------------------------------------------------
def second_order(recurrence, tensors, kwargs):
    """Gradient of a gradient penalty, |d(loss)/dU|^2, with respect to every input."""
    leaves = [None if t is None else t.detach().clone().requires_grad_() for t in tensors]
    h, c_last = recurrence(*leaves, **kwargs)
    loss = (h * torch.linspace(-1, 1, h.numel(), dtype=h.dtype).view_as(h)).sum() + c_last.square().sum()
    present = [t for t in leaves if t is not None]
    first = torch.autograd.grad(loss, present, create_graph=True)
    penalty = sum(g.square().sum() for g in first)
    return first, torch.autograd.grad(penalty, present, allow_unused=True)


@pytest.mark.parametrize(
    "variant",
    [dict(), dict(bidirectional=True, k=4, with_mask_pad=True), dict(per_step_weight_c=True, with_mask_c=True)],
    ids=["k3", "bidirectional-k4-mask_pad", "per-step-weight_c"],
)
def test_second_order_gradients_match_the_reference(variant):
    tensors, kwargs = make_case(dtype=torch.float64, **variant)
    if variant.get("k") == 4:
        tensors = (tensors[0], None) + tuple(tensors[2:])

    def reference(*args, **options):
        return sru_recurrence_reference(*args, compute_dtype=torch.float64, **options)

    with trace_storage_dtypes() as calls:
        first, second = second_order(functional.sru_recurrence, tensors, kwargs)
    # the forward ran the kernel, the differentiable first-order gradients came from the
    # reference (the penalty's own backward reaches the kernel again through grad of c_last)
    assert [(call.backend, call.direction) for call in calls][:2] == [("cpp", "forward"), ("reference", "backward")]
    expected_first, expected_second = second_order(reference, tensors, kwargs)
    for got, expected in zip(first + second, expected_first + expected_second):
        assert got is not None and expected is not None
        torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-9)
    assert any(g.abs().max() > 0 for g in second)


def test_gradgradcheck_through_the_op():
    (U, x, weight_c, bias, c0), kwargs = make_case(length=3, batch=2, hidden=2, dtype=torch.float64)

    def recurrence(U, x, weight_c, bias, c0):
        return functional.sru_recurrence(U, x, weight_c, bias, c0, **kwargs)

    inputs = [t.requires_grad_() for t in (U, x, weight_c, bias, c0)]
    assert torch.autograd.gradgradcheck(recurrence, inputs)


def test_differentiating_the_backward_op_itself_is_refused_by_name():
    forward = forward_arguments("contiguous")
    h, c_last, c_all = torch.ops.sru_lightning.recurrence_forward(*forward)
    (U, x, weight_c, bias, c0, scale_x, scale_value, mask_c, mask_pad, reset, c_starts, bidirectional, skip, _) = (
        forward
    )
    grad_h = torch.randn_like(h).requires_grad_()
    grads = torch.ops.sru_lightning.recurrence_backward(
        grad_h,
        None,
        None,
        U,
        x,
        weight_c,
        bias,
        c0,
        scale_x,
        scale_value,
        mask_c,
        mask_pad,
        reset,
        c_starts,
        c_all.detach(),
        bidirectional,
        skip,
    )
    with pytest.raises(RuntimeError, match="create_graph=True"):
        grads[0].sum().backward()
