"""One SRU++ layer: the input transform (attention or projected linear) computes U, then the
SRU recurrence runs through this package's op and precision policy, as in :class:`SRUCell`.

Parameter names, shapes and the initialisation recipe are those of the ``sru`` 3.0.0-dev
``SRUppCell``, so its state dicts load unchanged.
"""

from __future__ import annotations

import math
import numbers

import torch
from torch import Tensor, nn

from .checks import check_positive_int, check_probability
from .common import (
    RecurrentCellMixin,
    non_default_settings,
    refuse_jit_trace,
    time_shared_dropout_mask,
    zero_padded_steps,
)
from .srupp_attention import SRUppAttention


def _check_real(owner: str, name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{owner}: `{name}` must be a float, got {type(value).__name__} {value!r}")
    return float(value)


class SRUppCell(RecurrentCellMixin, nn.Module):
    """One SRU++ layer: U from ``transform_module`` (attention or projected linear), then the
    SRU recurrence with the highway skip.

    ``transform_module`` maps the (optionally layer-normalised) input (L, B, input_size) to U
    (L, B, dirs*hidden_size*k), k = 3 when input_size equals the output size (the input is
    the skip term) and 4 otherwise (U carries its own skip column); it is called with the
    keywords ``mask_pad``, ``attn_mask``, ``memory`` and ``memory_mask_pad`` (and ``reset``,
    ``memory_reset`` when documents are packed).

    forward(input, c0=None, mask_pad=None, attn_mask=None, memory=None, memory_mask_pad=None,
    reset=None, memory_reset=None) -> (h, c) on time-major, already checked tensors
    (:class:`SRUpp` checks them); ``reset`` (L, B) restarts the recurrence at each document's
    first step and keeps the attention inside documents. The memory
    goes to the transform as given (not layer-normalised), as in the reference.
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        transform_module: nn.Module,
        dropout: float = 0.0,
        bidirectional: bool = False,
        layer_norm: bool = False,
        normalize_after: bool = True,
        highway_bias: float = 0.0,
        rescale: bool = False,
        weight_c_init: float = 1.0,
        *,
        recurrence_policy: str = "auto",
    ):
        super().__init__()
        owner = type(self).__name__
        self.input_size = check_positive_int(owner, "input_size", input_size)
        self.hidden_size = check_positive_int(owner, "hidden_size", hidden_size)
        if not isinstance(transform_module, nn.Module):
            raise TypeError(
                f"{owner}: `transform_module` must be an nn.Module (SRUppAttention or "
                f"SRUppProjectedLinear), got {type(transform_module).__name__}"
            )
        self.dropout = check_probability(owner, "dropout", dropout)
        self.bidirectional = bool(bidirectional)
        self.num_directions = 2 if self.bidirectional else 1
        self.output_size = self.hidden_size * self.num_directions
        self.num_matrices = 3 if self.input_size == self.output_size else 4
        self.normalize_after = bool(normalize_after)
        self.highway_bias = _check_real(owner, "highway_bias", highway_bias)
        self.rescale = bool(rescale)
        self.weight_c_init = _check_real(owner, "weight_c_init", weight_c_init)
        if self.weight_c_init <= 0:
            raise ValueError(f"{owner}: `weight_c_init` must be a positive float, got {weight_c_init!r}")
        self.recurrence_policy = recurrence_policy

        self.transform_module = transform_module
        self._add_recurrence_parameters(layer_norm)
        self.reset_parameters()

    @property
    def proj_size(self) -> int:
        return getattr(self.transform_module, "proj_features", 0)

    @property
    def num_heads(self) -> int:
        return getattr(self.transform_module, "num_heads", 0)

    @property
    def has_attention(self) -> bool:
        return isinstance(self.transform_module, SRUppAttention)

    def reset_parameters(self) -> None:
        """The reference recipe: highway bias on the reset gate, skip scale sqrt(1 + 2 e^b)
        when ``rescale``, the transform's own reset, weight_c ~ U(-weight_c_init, weight_c_init)."""
        with torch.no_grad():
            self.bias.zero_()
            self.bias[self.output_size :].fill_(self.highway_bias)
            self.scale_x.fill_((1 + 2 * math.exp(self.highway_bias)) ** 0.5 if self.rescale else 1.0)
            if hasattr(self.transform_module, "reset_parameters"):
                self.transform_module.reset_parameters()
            self.weight_c.uniform_(-self.weight_c_init, self.weight_c_init)

    def forward(
        self,
        input: Tensor,
        c0: Tensor | None = None,
        mask_pad: Tensor | None = None,
        attn_mask: Tensor | None = None,
        memory: Tensor | None = None,
        memory_mask_pad: Tensor | None = None,
        reset: Tensor | None = None,
        memory_reset: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        refuse_jit_trace(type(self).__name__)
        documents = {} if reset is None else {"reset": reset, "memory_reset": memory_reset}
        input = zero_padded_steps(input, mask_pad)
        if memory is not None:
            memory = zero_padded_steps(memory, memory_mask_pad)
        U = self.transform_module(
            self._normalized_input(input),
            mask_pad=mask_pad,
            attn_mask=attn_mask,
            memory=memory,
            memory_mask_pad=memory_mask_pad,
            **documents,
        )
        expected_width = self.output_size * self.num_matrices
        if U.shape[-1] != expected_width:
            raise ValueError(
                f"{type(self).__name__}: `transform_module` must return U with last dimension "
                f"output_size x num_matrices = {expected_width}, got shape {tuple(U.shape)}"
            )
        mask_c = None
        if self.training and self.dropout > 0:
            mask_c = time_shared_dropout_mask(self.bias, (input.shape[1], self.output_size), self.dropout)
        skip = input if self.num_matrices == 3 else None
        return self._recurrence(
            U, skip, self.weight_c, c0=c0, mask_c=mask_c, mask_pad=mask_pad, has_skip_term=True, reset=reset
        )

    def extra_repr(self) -> str:
        parts = [f"{self.input_size}, {self.hidden_size}"]
        parts += non_default_settings(
            self,
            (
                ("dropout", 0.0),
                ("bidirectional", False),
                ("normalize_after", True),
                ("highway_bias", 0.0),
                ("rescale", False),
                ("weight_c_init", 1.0),
                ("recurrence_policy", "auto"),
            ),
        )
        if self.layer_norm is not None:
            parts.append("layer_norm=True")
        return ", ".join(parts)
