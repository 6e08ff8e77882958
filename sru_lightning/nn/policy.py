"""Find the SRU and SRU++ layers inside any model and set their recurrence precision policy at once."""

from __future__ import annotations

from collections.abc import Iterator

from torch import nn

from .cell import SRUCell, checked_policy
from .srupp_cell import SRUppCell

RecurrentLayer = SRUCell | SRUppCell


def iter_sru_cells(module: nn.Module) -> Iterator[tuple[str, RecurrentLayer]]:
    """Yield ``(qualified_name, cell)`` for every :class:`SRUCell` and :class:`SRUppCell` in
    ``module`` (itself included)."""
    if not isinstance(module, nn.Module):
        raise TypeError(f"iter_sru_cells: `module` must be an nn.Module, got {type(module).__name__}")
    for name, child in module.named_modules():
        if isinstance(child, (SRUCell, SRUppCell)):
            yield name, child


def set_recurrence_policy(module: nn.Module, policy: str) -> list[tuple[str, RecurrentLayer]]:
    """Set ``recurrence_policy`` on every SRU and SRU++ layer in ``module``; return the layers changed.

    ``policy`` is "auto" (half storage in a half-precision regime, float32/float64
    otherwise), "fp32" (float32 storage, float64 for float64 models) or "half" (the half
    dtype of U or of the active autocast). The policy is checked before any layer changes.
    An empty list means the model holds no SRU layer.
    """
    policy = checked_policy("set_recurrence_policy", policy)
    cells = list(iter_sru_cells(module))
    for _, cell in cells:
        cell.recurrence_policy = policy
    return cells
