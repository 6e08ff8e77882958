"""The recurrence op's argument list, described once for Python.

The schemas of ``torch.ops.sru_lightning.recurrence_forward`` and ``recurrence_backward``
are defined by the C++ library (csrc/sru_ops.h); :func:`check_registered_schemas` compares
them with the schemas derived here, so the fake kernels, the autograd formula and the
wrappers of :mod:`sru_lightning.ops.op`, which all read their arguments through this
description, cannot drift from the C++ side. :class:`RecurrenceCall` is the same list as one
keyword-only object, what the Python side passes around.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from torch import Tensor


class Argument(NamedTuple):
    """One argument of an op: its name, its schema type, and whether autograd gives it a
    gradient (a differentiable argument of the forward op has a ``grad_<name>`` output of
    the backward op)."""

    name: str
    schema_type: str
    differentiable: bool = False


# What both ops read, in the forward op's order. scale_x is a constant (a buffer of the
# layer): the kernels give it no gradient.
RECURRENCE_ARGUMENTS = (
    Argument("U", "Tensor", differentiable=True),
    Argument("x", "Tensor?", differentiable=True),
    Argument("weight_c", "Tensor", differentiable=True),
    Argument("bias", "Tensor", differentiable=True),
    Argument("c0", "Tensor?", differentiable=True),
    Argument("scale_x", "Tensor?"),
    Argument("scale_x_value", "float"),
    Argument("mask_c", "Tensor?"),
    Argument("mask_pad", "Tensor?"),
    Argument("reset", "Tensor?"),
    Argument("c_starts", "Tensor?", differentiable=True),
    Argument("bidirectional", "bool"),
    Argument("has_skip_term", "bool"),
)

FORWARD_ARGUMENTS = RECURRENCE_ARGUMENTS + (Argument("store_c", "bool"),)
FORWARD_RETURNS = ("h", "c_last", "c_all")
DIFFERENTIABLE = tuple(argument.name for argument in RECURRENCE_ARGUMENTS if argument.differentiable)


def _backward_arguments() -> tuple[Argument, ...]:
    # The backward op takes the forward's arguments with the incoming gradients in front and
    # the stored states c_all before the two flags.
    gradients = (Argument("grad_h", "Tensor"), Argument("grad_c_last", "Tensor?"), Argument("grad_c_all", "Tensor?"))
    tensors, flags = RECURRENCE_ARGUMENTS[:-2], RECURRENCE_ARGUMENTS[-2:]
    return gradients + tensors + (Argument("c_all", "Tensor"),) + flags


BACKWARD_ARGUMENTS = _backward_arguments()
BACKWARD_RETURNS = tuple(f"grad_{name}" for name in DIFFERENTIABLE)


@dataclass(frozen=True, kw_only=True)
class RecurrenceCall:
    """The arguments of one recurrence call, by name: the Python form of ``RecurrenceArgs`` in
    csrc/sru_ops.h, taken by the entry points (:func:`~sru_lightning.ops.functional.sru_recurrence`
    builds one), :func:`~sru_lightning.ops.op.sru_forward`, the reference, the fake kernels and
    the ONNX translation.

    Its fields are :data:`RECURRENCE_ARGUMENTS` in order, with ``scale_x`` a float, a 1-element
    tensor or None: the op takes it as the tensor ``scale_x`` and the float ``scale_x_value``
    (:meth:`op_arguments`, :meth:`from_op`). Built by keyword only. It holds its values as given;
    :func:`sru_lightning.ops.shapes.check_recurrence_inputs` checks them (the ONNX translation
    builds one from graph values, which are not tensors).
    """

    U: Tensor
    x: Tensor | None = None
    weight_c: Tensor
    bias: Tensor
    c0: Tensor | None = None
    scale_x: Tensor | float | None = None
    mask_c: Tensor | None = None
    mask_pad: Tensor | None = None
    reset: Tensor | None = None
    c_starts: Tensor | None = None
    bidirectional: bool = False
    has_skip_term: bool = True

    @property
    def width(self) -> int:
        """dirs*D, the width of h and c, from bias's shape (2*dirs*D,)."""
        return self.bias.shape[0] // 2

    @property
    def skip_from_x(self) -> bool:
        """Whether the skip term reads x (k == 3), so x gets a gradient."""
        return self.has_skip_term and self.U.shape[-1] == 3 * self.width

    def replace(self, **changes) -> RecurrenceCall:
        """This call with the named fields changed."""
        return dataclasses.replace(self, **changes)

    def op_arguments(self, *, store_c: bool) -> tuple:
        """The forward op's positional arguments (:data:`FORWARD_ARGUMENTS` order)."""
        by_name = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        if isinstance(self.scale_x, (int, float)):
            by_name["scale_x"], by_name["scale_x_value"] = None, float(self.scale_x)
        else:
            by_name["scale_x_value"] = 1.0
        return ordered(FORWARD_ARGUMENTS, {**by_name, "store_c": store_c})

    @classmethod
    def from_op(cls, arguments: dict) -> RecurrenceCall:
        """The call from an op's arguments by name (:func:`bind`; the forward's or the
        backward's), ``scale_x`` and ``scale_x_value`` joined into one."""
        scale_x = arguments["scale_x"] if arguments["scale_x"] is not None else arguments["scale_x_value"]
        by_name = {field.name: arguments[field.name] for field in dataclasses.fields(cls) if field.name != "scale_x"}
        return cls(scale_x=scale_x, **by_name)


# The vector code of the CPU kernels, in the order of torch.ops.sru_lightning.cpu_vector_level()'s
# numbers; the C++ library lists the same names (torch.ops.sru_lightning.cpu_vector_levels()).
CPU_VECTOR_LEVELS = ("baseline", "avx2", "avx512", "avx512_bf16")


def schema(name: str, arguments: tuple[Argument, ...], returns: tuple[str, ...]) -> str:
    """The torch.library schema string of an op (without namespace)."""
    listed = ", ".join(f"{argument.schema_type} {argument.name}" for argument in arguments)
    results = ", ".join(f"Tensor {result}" for result in returns)
    return f"{name}({listed}) -> ({results})"


SCHEMAS = {
    "recurrence_forward": schema("recurrence_forward", FORWARD_ARGUMENTS, FORWARD_RETURNS),
    "recurrence_backward": schema("recurrence_backward", BACKWARD_ARGUMENTS, BACKWARD_RETURNS),
}


def bind(arguments: tuple[Argument, ...], values) -> dict:
    """The op call's ``values`` (positional, in schema order) by argument name."""
    if len(values) != len(arguments):
        raise TypeError(f"expected the {len(arguments)} arguments {[a.name for a in arguments]}, got {len(values)}")
    return {argument.name: value for argument, value in zip(arguments, values)}


def ordered(arguments: tuple[Argument, ...], by_name: dict) -> tuple:
    """The values of ``by_name`` in the order of ``arguments`` (the op's positional call)."""
    return tuple(by_name[argument.name] for argument in arguments)


def forward_input_gradients(gradients: dict) -> tuple:
    """What the autograd formula returns for the forward op's inputs: the gradient named in
    ``gradients`` for each differentiable argument (None when absent), None for the others."""
    return tuple(gradients.get(argument.name) if argument.differentiable else None for argument in FORWARD_ARGUMENTS)


def check_registered_schemas(namespace: str = "sru_lightning") -> None:
    """Raise when the schemas the C++ library registered differ from :data:`SCHEMAS`."""
    import torch

    for name, expected in SCHEMAS.items():
        registered = str(getattr(getattr(torch.ops, namespace), name).default._schema)
        if registered != f"{namespace}::{expected}":
            raise RuntimeError(
                f"The C++ schema of {namespace}::{name} differs from sru_lightning/ops/signature.py: "
                f"expected {namespace}::{expected}, got {registered}. Keep csrc/sru_ops.h and signature.py in step."
            )
