"""Tensor-core shape advice: half-precision matmuls whose dimensions are not multiples of 8
leave cuBLAS off the tensor cores; this names each SRU layer's offending dimension and the
nearest sizes that fix it."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

from sru_lightning.nn import SRUCell, SRUppCell
from sru_lightning.precision import Regime

__all__ = [
    "TENSOR_CORE_MULTIPLE",
    "ShapeAdvice",
    "TensorCoreShapeWarning",
    "rows_of",
    "should_advise_tensor_cores",
    "tensor_core_advice",
]

TENSOR_CORE_MULTIPLE = 8  # fp16/bf16 GEMM dimensions that keep cuBLAS on tensor cores


class TensorCoreShapeWarning(UserWarning):
    """A half-precision SRU matmul has a dimension that is not a multiple of 8."""


# --------------------------------------------------------------------------- shape advisor


@dataclasses.dataclass(frozen=True)
class ShapeAdvice:
    """One matmul dimension of one SRU layer that is not a multiple of ``multiple``."""

    layer: str
    dimension: str  # "rows", "input_size", "projection_size", "proj_size", "head_dim" or "u_width"
    value: int
    suggestion: str

    def __str__(self) -> str:
        return f"{self.layer or '<model>'}: {self.suggestion}"


def _next_multiple(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _smallest_at_least(start: int, accept) -> int:
    value = start
    while not accept(value):
        value += 1
    return value


def _srupp_advice(name: str, cell: SRUppCell, multiple: int) -> list[ShapeAdvice]:
    """SRU++ matmuls: x @ linear1 (input_size -> proj_size), the attention per head (head_dim
    wide), and linear2/linear3 (proj_size -> U). Fused attention kernels want head_dim a
    multiple of 8 as well."""
    advice: list[ShapeAdvice] = []
    if cell.input_size % multiple:
        advice.append(
            ShapeAdvice(
                name,
                "input_size",
                cell.input_size,
                f"input_size={cell.input_size} is not a multiple of {multiple} (inner dimension of the "
                f"attention projection); make the layer input {_next_multiple(cell.input_size, multiple)} wide",
            )
        )
    proj = cell.proj_size
    if proj % multiple:
        advice.append(
            ShapeAdvice(
                name,
                "proj_size",
                proj,
                f"proj_size={proj} is not a multiple of {multiple}; use proj_size="
                f"{_next_multiple(proj, multiple * max(cell.num_heads, 1))}",
            )
        )
    heads = cell.num_heads
    if heads and (proj // heads) % multiple:
        head_dim = proj // heads
        better_proj = _next_multiple(head_dim, multiple) * heads
        fewer_heads = [h for h in range(heads - 1, 0, -1) if proj % h == 0 and (proj // h) % multiple == 0]
        alternative = f" or num_heads={fewer_heads[0]}" if fewer_heads else ""
        advice.append(
            ShapeAdvice(
                name,
                "head_dim",
                head_dim,
                f"per-head dimension proj_size / num_heads = {proj} / {heads} = {head_dim} is not a "
                f"multiple of {multiple}; use proj_size={better_proj}{alternative}",
            )
        )
    return advice


def tensor_core_advice(
    cells: Iterable[tuple[str, SRUCell | SRUppCell]],
    rows: Mapping[str, tuple[int, int]] | None = None,
    multiple: int = TENSOR_CORE_MULTIPLE,
) -> list[ShapeAdvice]:
    """Matmul dimensions of the SRU layers in ``cells`` that are not multiples of ``multiple``.

    Each layer computes ``U = x @ W`` with x of shape (seq_len * batch, input_size) and W of
    shape (input_size, output_size * num_matrices) (through ``projection_size`` when the layer
    projects). SRU++ layers are judged on their own matmuls instead: input_size and
    proj_size of the projections, the per-head dimension of the attention, and U's width.
    ``rows`` maps a layer name to the (seq_len, batch) it saw; layers absent from
    it get no row advice. Each advice names the layer and the value to change.
    """
    advice: list[ShapeAdvice] = []
    rows = rows or {}
    row_layers: dict[tuple[int, int], list[str]] = {}
    for name, cell in cells:
        if name in rows:
            row_layers.setdefault(tuple(rows[name]), []).append(name)
        advice.extend(_layer_advice(name, cell, multiple))
    for (length, batch), names in row_layers.items():
        advice.extend(_rows_advice(length, batch, names, multiple))
    return advice


def _layer_advice(name: str, cell: SRUCell | SRUppCell, multiple: int) -> list[ShapeAdvice]:
    """The advice on one layer's own matmul dimensions (its rows are judged with its peers')."""
    if isinstance(cell, SRUppCell):
        advice = _srupp_advice(name, cell, multiple)
    elif getattr(cell, "custom_m", None) is not None:
        return []  # the user's module computes U; its shapes are not ours to judge
    else:
        advice = _input_size_advice(name, cell.input_size, multiple)
    advice += _projection_advice(name, getattr(cell, "projection_size", 0), multiple)
    advice += _u_width_advice(name, cell, multiple)
    return advice


def _input_size_advice(name: str, input_size: int, multiple: int) -> list[ShapeAdvice]:
    if input_size % multiple == 0:
        return []
    return [
        ShapeAdvice(
            name,
            "input_size",
            input_size,
            f"input_size={input_size} is not a multiple of {multiple} (inner dimension of "
            f"U = x @ W); make the layer input {_next_multiple(input_size, multiple)} wide",
        )
    ]


def _projection_advice(name: str, projection: int, multiple: int) -> list[ShapeAdvice]:
    if not projection or projection % multiple == 0:
        return []
    return [
        ShapeAdvice(
            name,
            "projection_size",
            projection,
            f"n_proj={projection} is not a multiple of {multiple}; use n_proj={_next_multiple(projection, multiple)}",
        )
    ]


def _u_width_advice(name: str, cell: SRUCell | SRUppCell, multiple: int) -> list[ShapeAdvice]:
    """U's width: output size (hidden_size x directions) times the number of matrices k."""
    dirs, k, hidden = cell.num_directions, cell.num_matrices, cell.hidden_size
    width = hidden * dirs * k
    if width % multiple == 0:
        return []
    better = _smallest_at_least(hidden + 1, lambda h: (h * dirs * k) % multiple == 0)
    return [
        ShapeAdvice(
            name,
            "u_width",
            width,
            f"output size x num matrices = {hidden * dirs} x {k} = {width} is not a "
            f"multiple of {multiple}; use hidden_size={better} "
            f"({better * dirs} x {k} = {better * dirs * k})",
        )
    ]


def _rows_advice(length: int, batch: int, names: list[str], multiple: int) -> list[ShapeAdvice]:
    """The rows of x (seq_len x batch) shared by the layers in ``names``."""
    total = length * batch
    if total % multiple == 0:
        return []
    better_batch = _smallest_at_least(batch + 1, lambda b: (length * b) % multiple == 0)
    better_length = _smallest_at_least(length + 1, lambda n: (n * batch) % multiple == 0)
    layers = names[0] if len(names) == 1 else f"{names[0]} (and {len(names) - 1} more layers)"
    return [
        ShapeAdvice(
            layers,
            "rows",
            total,
            f"seq_len x batch = {length} x {batch} = {total} rows is not a multiple of "
            f"{multiple}; use batch_size={better_batch} or seq_len={better_length}",
        )
    ]


def should_advise_tensor_cores(regime: Regime) -> bool:
    """Tensor-core shape advice matters for half-precision matmuls on CUDA."""
    return regime.is_half and regime.device_type == "cuda"


def rows_of(inputs, batch_first: bool) -> tuple[int, int] | None:
    """(seq_len, batch) of a layer's first positional input, None when it is not a tensor."""
    x = inputs[0] if inputs else None
    shape = getattr(x, "shape", None)
    if shape is None or len(shape) not in (2, 3):
        return None
    if len(shape) == 2:
        return 1, int(shape[0])  # one step of a cell
    return (int(shape[1]), int(shape[0])) if batch_first else (int(shape[0]), int(shape[1]))
