"""int8 dynamic quantisation of SRU input projections (eager CPU inference).

An SRU layer's projection ``U = x @ W`` is a raw parameter, which ``quantize_dynamic`` (it
converts ``nn.Linear`` modules) never sees. :func:`projection_as_linear` moves each layer's W into
an ``nn.Linear`` given as the layer's ``custom_m`` (the ``sru`` hook for computing U), which
changes no output; :func:`quantize_input_projections` then quantises those and the other linear
layers (the language model's decoder) to int8 weights with dynamically quantised activations.
"""

from __future__ import annotations

import copy

import torch
from torch import nn


def projection_as_linear(model: nn.Module) -> list[str]:
    """In place: every :class:`~sru_lightning.nn.SRUCell` without ``custom_m`` or a factorised
    projection computes U through an ``nn.Linear`` (its ``custom_m``) holding W transposed.
    Returns the names of the layers changed."""
    from sru_lightning.nn import SRUCell

    changed = []
    for name, cell in model.named_modules():
        if not isinstance(cell, SRUCell) or cell.custom_m is not None or cell.weight_proj is not None:
            continue
        weight = cell.weight.detach()
        linear = nn.Linear(weight.shape[0], weight.shape[1], bias=False, device=weight.device, dtype=weight.dtype)
        with torch.no_grad():
            linear.weight.copy_(weight.t())
        cell.custom_m = linear
        cell.weight = None
        changed.append(name)
    return changed


def quantize_input_projections(model: nn.Module) -> nn.Module:
    """A copy of `model` (eval mode, float32, CPU) whose SRU projections and ``nn.Linear`` layers
    run with int8 weights (``torch.ao.quantization.quantize_dynamic``)."""
    import warnings

    quantized = copy.deepcopy(model).float().cpu().eval()
    projection_as_linear(quantized)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao's deprecation notices: the measured result is what counts
        return torch.ao.quantization.quantize_dynamic(quantized, {nn.Linear}, dtype=torch.qint8)
