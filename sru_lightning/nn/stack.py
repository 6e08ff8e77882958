"""A stack of SRU layers with the calling convention of ``nn.LSTM`` and ``sru.SRU``."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Sequence

from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence

from .cell import SRUCell, resolve_amp_flag
from .checks import (
    check_input_dtype,
    check_non_negative_int,
    check_positive_int,
    check_probability,
    time_major_padding_mask,
    to_time_major,
)
from .common import (
    StackMixin,
    casts_own_inputs,
    checked_policy,
    non_default_settings,
    refuse_jit_trace,
    store_settings,
    unpack_sequence,
    warn_rnn_dropout,
    wrapped_layer,
    zero_padded_steps,
)
from .configs import SRUConfig
from .pretrained import PretrainedLayer


def _layer_custom_m(custom_m, index: int) -> nn.Module | None:
    """Layer `index`'s own ``custom_m``: its entry of a list, else a copy of the one module given."""
    if isinstance(custom_m, (list, tuple)):
        return custom_m[index]
    if custom_m is not None:
        return copy.deepcopy(custom_m)
    return None


class SRU(PretrainedLayer, StackMixin, nn.Module):
    """Stacked SRU layers.

    ``SRU(input_size, hidden_size, num_layers=2, ...)`` takes the keyword names of
    ``sru.SRU`` 2.6 (so existing calls work after swapping the import) plus ``batch_first``
    as in ``nn.LSTM`` and the keyword-only ``recurrence_policy``.

    forward(input, c0=None, mask_pad=None, reset=None) -> (output, c_last)

    * ``input``: (L, B, input_size) -- (B, L, input_size) with ``batch_first=True`` -- a
      ``PackedSequence`` (padding is then masked automatically and the output is packed),
      or (B, input_size) for a single time step (the output is then (B, dirs*hidden_size));
    * ``c0``: (num_layers, B, dirs*hidden_size), zeros when omitted (never batch-first,
      as ``h0`` in ``nn.LSTM``);
    * ``reset``: the layout of ``mask_pad``, True at each document's first step: documents
      packed into one row run as if each were alone, in every layer;
    * ``mask_pad``: (L, B) -- (B, L) with ``batch_first=True`` -- non-zero/True marks padding;
    * ``output``: (L, B, dirs*hidden_size) in the input's layout;
    * ``c_last``: (num_layers, B, dirs*hidden_size), or (num_layers*dirs, B, hidden_size)
      with ``nn_rnn_compatible_return=True``.

    ``dropout`` is applied to the hidden states of every layer but the last (one mask per
    sequence and column). Deprecated ``sru`` options behave as documented on
    :class:`SRUCell`. The state dict of an ``sru.SRU`` with the same options loads directly.
    """

    config_class = SRUConfig

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 2,
        dropout: float = 0.0,
        rnn_dropout: float = 0.0,
        bidirectional: bool = False,
        projection_size: int = 0,
        use_tanh: bool = False,
        layer_norm: bool = False,
        highway_bias: float = 0.0,
        has_skip_term: bool = True,
        rescale: bool = False,
        v1: bool = False,
        nn_rnn_compatible_return: bool = False,
        custom_m: nn.Module | Sequence[nn.Module] | None = None,
        proj_input_to_hidden_first: bool = False,
        amp_recurrence_fp16: bool = False,
        normalize_after: bool = False,
        weight_c_init: float | None = None,
        batch_first: bool = False,
        *,
        recurrence_policy: str = "auto",
    ):
        super().__init__()
        self._keep_config(locals())
        owner = type(self).__name__
        self.input_size = check_positive_int(owner, "input_size", input_size)
        self.hidden_size = check_positive_int(owner, "hidden_size", hidden_size)
        self.num_layers = check_positive_int(owner, "num_layers", num_layers)
        policy = resolve_amp_flag(owner, bool(amp_recurrence_fp16), checked_policy(owner, recurrence_policy))
        if isinstance(custom_m, (list, tuple)) and len(custom_m) != self.num_layers:
            raise ValueError(
                f"{owner}: `custom_m` as a list must hold one module per layer ({self.num_layers}), got {len(custom_m)}"
            )
        self.dropout = check_probability(owner, "dropout", dropout)
        self.rnn_dropout = check_probability(owner, "rnn_dropout", rnn_dropout)
        self.projection_size = check_non_negative_int(owner, "projection_size", projection_size)
        # Kept for `extra_repr` and handed to the layers, which check them.
        store_settings(
            self,
            bidirectional=bidirectional,
            layer_norm=layer_norm,
            has_skip_term=has_skip_term,
            rescale=rescale,
            v1=v1,
            normalize_after=normalize_after,
            weight_c_init=weight_c_init,
            highway_bias=highway_bias,
            amp_recurrence_fp16=amp_recurrence_fp16,
            nn_rnn_compatible_return=nn_rnn_compatible_return,
            batch_first=batch_first,
        )
        # Same construction order as sru.SRU, so a seed gives the same initial weights.
        first_input_size = self._add_input_to_hidden(proj_input_to_hidden_first)
        layer_options = dict(
            rnn_dropout=rnn_dropout,
            bidirectional=self.bidirectional,
            n_proj=projection_size,
            use_tanh=use_tanh,
            highway_bias=highway_bias,
            has_skip_term=self.has_skip_term,
            layer_norm=self.use_layer_norm,
            rescale=self.rescale,
            v1=self.v1,
            normalize_after=self.normalize_after,
            weight_c_init=weight_c_init,
            recurrence_policy=policy,
        )
        self.rnn_lst = nn.ModuleList(self._build_layers(first_input_size, dropout, custom_m, layer_options))
        if self.rnn_dropout > 0:
            warn_rnn_dropout(owner)

    def _add_input_to_hidden(self, proj_input_to_hidden_first: bool) -> int:
        """The optional first projection to the output size; returns the first layer's input size."""
        if proj_input_to_hidden_first and self.input_size != self.output_size:
            self.input_to_hidden = nn.Linear(self.input_size, self.output_size, bias=False)
            return self.output_size
        self.input_to_hidden = None
        return self.input_size

    def _build_layers(self, first_input_size: int, dropout: float, custom_m, layer_options: dict) -> list:
        """One SRUCell per layer, built (and so initialised) in order; no dropout after the last."""
        with warnings.catch_warnings():
            # One deprecation warning for the stack, not one per layer.
            warnings.simplefilter("ignore", FutureWarning)
            layers = []
            for index in range(self.num_layers):
                layers.append(
                    SRUCell(
                        first_input_size if index == 0 else self.output_size,
                        self.hidden_size,
                        dropout=dropout if index + 1 < self.num_layers else 0.0,
                        custom_m=_layer_custom_m(custom_m, index),
                        **layer_options,
                    )
                )
                # Keep the deprecated flag visible on the layers without re-resolving the policy.
                layers[-1].amp_recurrence_fp16 = self.amp_recurrence_fp16
        return layers

    def reset_parameters(self) -> None:
        for layer in self.rnn_lst:
            wrapped_layer(layer).reset_parameters()
        if self.input_to_hidden is not None:
            self.input_to_hidden.reset_parameters()

    # ------------------------------------------------------------------ forward
    def forward(
        self,
        input: Tensor | PackedSequence,
        c0: Tensor | None = None,
        mask_pad: Tensor | None = None,
        reset: Tensor | None = None,
    ) -> tuple[Tensor | PackedSequence, Tensor]:
        owner = type(self).__name__
        refuse_jit_trace(owner)
        first = wrapped_layer(self.rnn_lst[0])  # a LoRA wrapper's layer: its settings and weights
        device = first.bias.device
        lengths = None
        if isinstance(input, PackedSequence):
            if reset is not None:
                raise ValueError(
                    f"{owner}: `reset` must be None for a PackedSequence input (its sequences are separate "
                    f"already), got a tensor of shape {tuple(reset.shape)}"
                )
            padded, lengths, mask_pad = unpack_sequence(owner, input, mask_pad, device)
            x, one_step = to_time_major(owner, padded, self.input_size, False, device)
        else:
            x, one_step = to_time_major(owner, input, self.input_size, self.batch_first, device)
        length, batch = x.shape[0], x.shape[1]
        sharded = casts_own_inputs(self.rnn_lst[0]) or casts_own_inputs(first)  # the wrapper or its layer
        if self.input_to_hidden is None and first.custom_m is None and not sharded:
            check_input_dtype(owner, x, first.weight.dtype)
        if mask_pad is not None and lengths is None:
            mask_pad = time_major_padding_mask(owner, mask_pad, length, batch, one_step, self.batch_first, device)
        if reset is not None:
            reset = time_major_padding_mask(owner, reset, length, batch, one_step, self.batch_first, device, "reset")

        layer_c0 = self._layer_initial_states(owner, c0, batch, device)

        # Each layer zeroes its padded steps; the first projection needs the same care.
        h = x if self.input_to_hidden is None else self.input_to_hidden(zero_padded_steps(x, mask_pad))
        last_states = []
        for layer, c_init in zip(self.rnn_lst, layer_c0):
            # Through nn.Module.__call__, so sharding hooks (FSDP2, DeepSpeed ZeRO-3) gather
            # the layer's weights and cast its inputs before it runs. The layers are
            # time-major, so the call checks what it was already handed, cheaply.
            h, c_last = layer(h, c_init, mask_pad, reset)
            last_states.append(c_last)
        c_stack = self._stacked_last_states(last_states, batch)

        if lengths is not None:
            return pack_padded_sequence(h, lengths, enforce_sorted=False), c_stack
        if one_step:
            return h.squeeze(0), c_stack
        return (h.transpose(0, 1) if self.batch_first else h), c_stack

    # ------------------------------------------------------------------ repr
    def extra_repr(self) -> str:
        parts = [f"{self.input_size}, {self.hidden_size}"]
        parts += non_default_settings(
            self,
            (
                ("num_layers", 2),
                ("dropout", 0.0),
                ("rnn_dropout", 0.0),
                ("bidirectional", False),
                ("projection_size", 0),
                ("layer_norm", False),
                ("highway_bias", 0.0),
                ("has_skip_term", True),
                ("rescale", False),
                ("v1", False),
                ("nn_rnn_compatible_return", False),
                ("normalize_after", False),
                ("weight_c_init", None),
                ("batch_first", False),
                ("recurrence_policy", "auto"),
            ),
            attributes={"layer_norm": "use_layer_norm"},
        )
        return ", ".join(parts)
