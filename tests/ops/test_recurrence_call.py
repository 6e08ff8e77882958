"""RecurrenceCall, the one object the recurrence's Python entry points, the reference, the fake
kernels and the ONNX translation take: built by keyword only, frozen, its fields the argument
list of ops/signature.py, and checked once per call."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from sru_lightning.ops import functional, reference, signature
from sru_lightning.ops.signature import FORWARD_ARGUMENTS, RECURRENCE_ARGUMENTS, RecurrenceCall
from sru_lightning.ops.testing import make_case


def _tensors():
    (U, x, weight_c, bias, c0), _ = make_case(length=3, batch=2, hidden=4, dtype=torch.float32)
    return U, x, weight_c, bias, c0


def test_the_call_refuses_positional_arguments():
    U, x, weight_c, bias, c0 = _tensors()
    with pytest.raises(TypeError, match="positional"):
        RecurrenceCall(U, x, weight_c, bias, c0)
    call = RecurrenceCall(U=U, x=x, weight_c=weight_c, bias=bias, c0=c0)
    assert call.U is U and call.c0 is c0 and call.bidirectional is False and call.has_skip_term is True


def test_the_call_is_frozen():
    U, x, weight_c, bias, _ = _tensors()
    call = RecurrenceCall(U=U, x=x, weight_c=weight_c, bias=bias)
    with pytest.raises(dataclasses.FrozenInstanceError):
        call.bidirectional = True
    assert call.replace(bidirectional=True).bidirectional is True and call.bidirectional is False


def test_the_call_fields_are_the_signature_argument_list():
    # One list: the op's arguments, with scale_x and scale_x_value one field (a float or a tensor).
    fields = [field.name for field in dataclasses.fields(RecurrenceCall)]
    assert fields == [argument.name for argument in RECURRENCE_ARGUMENTS if argument.name != "scale_x_value"]


@pytest.mark.parametrize(
    "scale_x, op_scale_x, op_scale_x_value",
    [(None, None, 1.0), (2.5, None, 2.5), ("tensor", "tensor", 1.0)],
    ids=["none", "float", "tensor"],
)
def test_the_op_arguments_split_scale_x_and_read_back_as_the_same_call(scale_x, op_scale_x, op_scale_x_value):
    U, x, weight_c, bias, c0 = _tensors()
    scale = torch.tensor([1.5])
    scale_x = scale if scale_x == "tensor" else scale_x
    call = RecurrenceCall(U=U, x=x, weight_c=weight_c, bias=bias, c0=c0, scale_x=scale_x, bidirectional=False)
    values = call.op_arguments(store_c=True)
    by_name = signature.bind(FORWARD_ARGUMENTS, values)
    assert by_name["scale_x"] is (scale if op_scale_x == "tensor" else None)
    assert by_name["scale_x_value"] == op_scale_x_value and by_name["store_c"] is True
    back = RecurrenceCall.from_op(by_name)
    expected_scale = scale_x if scale_x is not None else 1.0  # None reads back as its value, 1.0
    assert back == call.replace(scale_x=expected_scale)


@pytest.mark.parametrize("backend", ["reference", "cpp"])
def test_sru_recurrence_checks_its_inputs_once(backend, monkeypatch):
    checked = []

    def counting(check):
        def wrapped(*arguments, **keywords):
            checked.append(1)
            return check(*arguments, **keywords)

        return wrapped

    monkeypatch.setattr(functional, "check_recurrence_inputs", counting(functional.check_recurrence_inputs))
    monkeypatch.setattr(reference, "check_recurrence_inputs", counting(reference.check_recurrence_inputs))
    if backend == "reference":
        monkeypatch.setattr(functional, "_cpp_backend_ready", lambda device_type: False)
    U, x, weight_c, bias, c0 = _tensors()
    h, c_last = functional.sru_recurrence(U, x, weight_c, bias, c0)
    assert h.shape == (3, 2, 4) and c_last.shape == (2, 4)
    assert len(checked) == 1


def test_a_bad_argument_is_still_named_by_the_one_check():
    U, x, weight_c, bias, c0 = _tensors()
    with pytest.raises(ValueError, match=r"SRU recurrence: `c0` must have shape \(2, 4\)"):
        functional.sru_recurrence(U, x, weight_c, bias, c0[:1])
    with pytest.raises(ValueError, match=r"SRU recurrence: `c0` must have shape \(2, 4\)"):
        reference.sru_recurrence_reference(U, x, weight_c, bias, c0[:1])
