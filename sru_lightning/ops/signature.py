"""The recurrence op's argument list, described once for Python.

The schemas of ``torch.ops.sru_lightning.recurrence_forward`` and ``recurrence_backward``
are defined by the C++ library (csrc/sru_ops.h); :func:`check_registered_schemas` compares
them with the schemas derived here, so the fake kernels, the autograd formula and the
wrappers of :mod:`sru_lightning.ops.op`, which all read their arguments through this
description, cannot drift from the C++ side.
"""

from __future__ import annotations

from collections import namedtuple
from typing import NamedTuple


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

# The arguments of the Python entry points (op.sru_forward, functional._run): the op's, with
# scale_x a float, a 1-element tensor or None (split into scale_x and scale_x_value for the op).
RecurrenceCall = namedtuple(
    "RecurrenceCall", [argument.name for argument in RECURRENCE_ARGUMENTS if argument.name != "scale_x_value"]
)

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
