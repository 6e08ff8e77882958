"""SRU++ (Lei, 2021): stacked SRU layers whose input projection holds a small attention
sub-layer.

``SRUpp`` takes the constructor arguments and defaults of the ``sru`` 3.0.0-dev ``SRUpp``
and uses its parameter names and layouts, so its state dicts load unchanged. The recurrence
runs through this package's op and precision policy (as in :class:`SRUCell`); the attention
runs through ``torch.nn.functional.scaled_dot_product_attention``.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence

from .checks import (
    check_floating_tensor,
    check_positive_int,
    check_probability,
    check_same_device,
    check_shape,
    time_major_padding_mask,
    to_time_major,
)
from .common import (
    StackMixin,
    checked_policy,
    non_default_settings,
    refuse_jit_trace,
    store_settings,
    unpack_sequence,
    zero_padded_steps,
)
from .configs import SRUppConfig
from .pretrained import PretrainedLayer
from .srupp_attention import SRUppAttention, SRUppProjectedLinear
from .srupp_cell import SRUppCell

MemoryBank = dict[str, list[Tensor]]


def _checked_attention_placement(owner: str, every, last) -> tuple[int, int]:
    """``(attention_every_n_layers, attention_last_n_layers)`` checked: at most one of them set."""
    every = check_positive_int(owner, "attention_every_n_layers", every)
    if isinstance(last, bool) or not isinstance(last, numbers.Integral):
        raise TypeError(f"{owner}: `attention_last_n_layers` must be an int, got {type(last).__name__}")
    last = int(last)
    if last != -1 and last < 0:
        raise ValueError(f"{owner}: `attention_last_n_layers` must be -1 (unset) or >= 0, got {last}")
    if every != 1 and last != -1:
        raise ValueError(
            f"{owner}: give at most one of `attention_every_n_layers` and `attention_last_n_layers`, "
            f"got attention_every_n_layers={every} and attention_last_n_layers={last}"
        )
    return every, last


class SRUpp(PretrainedLayer, StackMixin, nn.Module):
    """Stacked SRU++ layers, state-dict compatible with the ``sru`` 3.0.0-dev ``SRUpp``.

    Layer i has attention when ``(i + 1) % attention_every_n_layers == 0`` or, with
    ``attention_last_n_layers`` set, when it is among the last that many layers (setting
    both is an error); the other layers use :class:`SRUppProjectedLinear`.

    forward(input, c0=None, mask_pad=None, attn_mask=None, memory=None,
    memory_mask_pad=None, reset=None, memory_reset=None) -> (output, c, memory_bank)

    * ``input``: (L, B, input_size), (B, L, input_size) with ``batch_first=True``, or a
      ``PackedSequence`` (padding is then masked and the output is packed);
    * ``c0``: (num_layers, B, dirs*hidden_size), zeros when omitted;
    * ``mask_pad``: (L, B) ((B, L) with ``batch_first``), True/non-zero on padding: padded
      steps keep c, emit h = 0 and are never attended to;
    * ``attn_mask``: additive float (L, M + L) added to the attention scores (e.g. a causal
      mask with -inf above the diagonal), M the memory length (0 without memory);
    * ``memory``: a list with one entry per layer, None or that layer's earlier inputs
      (M, B, layer input width) ((B, M, width) with ``batch_first``), attended to before
      the current input -- typically the previous call's ``memory_bank["saved_inputs"]``;
    * ``memory_mask_pad``: (M, B) ((B, M) with ``batch_first``), padding in the memory;
    * ``reset``: the layout of ``mask_pad``, True at each document's first step: documents
      packed into one row run as if each were alone -- the recurrence restarts from a zero
      state there, and attention reaches only positions of the same document (document id =
      running count of starts; memory positions belong to the document in progress at the
      end of the memory, so a query stops seeing the memory once its row starts a document);
    * ``memory_reset``: (M, B) ((B, M) with ``batch_first``), the memory's own document
      starts (with ``reset``): memory before the memory's last start is never attended to;
    * ``output``: (L, B, dirs*hidden_size) in the input's layout;
    * ``c``: (num_layers, B, dirs*hidden_size), or (num_layers*dirs, B, hidden_size) with
      ``nn_rnn_compatible_return=True``;
    * ``memory_bank["saved_inputs"]``: each layer's input for this call, in the input's layout.

    Step-by-step decoding: call with one step (L = 1), ``c0`` the previous ``c`` and
    ``memory`` the concatenation of earlier ``saved_inputs`` (see :meth:`extend_memory`).
    """

    config_class = SRUppConfig

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        proj_size: int,
        num_layers: int = 2,
        dropout: float = 0.0,
        attn_dropout: float = 0.0,
        num_heads: int = 1,
        bidirectional: bool = False,
        layer_norm: bool = False,
        normalize_after: bool = False,
        attn_layer_norm: bool = True,
        highway_bias: float = -2.0,
        attention_every_n_layers: int = 1,
        attention_last_n_layers: int = -1,
        rescale: bool = False,
        nn_rnn_compatible_return: bool = False,
        proj_input_to_hidden_first: bool = False,
        weight_c_init: float = 1.0,
        batch_first: bool = False,
        *,
        recurrence_policy: str = "auto",
    ):
        super().__init__()
        self._keep_config(locals())
        owner = type(self).__name__
        self.input_size = check_positive_int(owner, "input_size", input_size)
        self.hidden_size = check_positive_int(owner, "hidden_size", hidden_size)
        self.proj_size = check_positive_int(owner, "proj_size", proj_size)
        self.num_layers = check_positive_int(owner, "num_layers", num_layers)
        self.num_heads = check_positive_int(owner, "num_heads", num_heads)
        if self.proj_size % self.num_heads:
            raise ValueError(
                f"{owner}: `num_heads` must divide proj_size={self.proj_size}, got num_heads={self.num_heads}"
            )
        self.dropout = check_probability(owner, "dropout", dropout)
        self.attn_dropout = check_probability(owner, "attn_dropout", attn_dropout)
        self.attention_every_n_layers, self.attention_last_n_layers = _checked_attention_placement(
            owner, attention_every_n_layers, attention_last_n_layers
        )
        # Kept for `extra_repr` and handed to the layers, which check them.
        store_settings(
            self,
            bidirectional=bidirectional,
            layer_norm=layer_norm,
            normalize_after=normalize_after,
            attn_layer_norm=attn_layer_norm,
            highway_bias=highway_bias,
            rescale=rescale,
            nn_rnn_compatible_return=nn_rnn_compatible_return,
            weight_c_init=weight_c_init,
            batch_first=batch_first,
        )
        policy = checked_policy(owner, recurrence_policy)
        # Construction order follows the reference, so one seed gives the same initial weights.
        first_input_size = self._add_input_to_hidden(proj_input_to_hidden_first)
        self.rnn_lst = nn.ModuleList(
            [self._build_layer(index, first_input_size, policy) for index in range(self.num_layers)]
        )

    def _add_input_to_hidden(self, proj_input_to_hidden_first: bool) -> int:
        """The optional first projection to the output size (initialised here, as the reference
        does); returns the first layer's input size."""
        if proj_input_to_hidden_first and self.input_size != self.output_size:
            self.input_to_hidden = nn.Linear(self.input_size, self.output_size, bias=False)
            nn.init.xavier_uniform_(self.input_to_hidden.weight)
            return self.output_size
        self.input_to_hidden = None
        return self.input_size

    def _build_layer(self, index: int, first_input_size: int, policy: str) -> SRUppCell:
        """Layer `index`: its input transform (attention or a projected linear), then the cell."""
        in_features = first_input_size if index == 0 else self.output_size
        out_features = self.output_size * (3 if in_features == self.output_size else 4)
        return SRUppCell(
            in_features,
            self.hidden_size,
            self._build_transform(index, in_features, out_features),
            dropout=self.dropout if index + 1 < self.num_layers else 0.0,
            bidirectional=self.bidirectional,
            layer_norm=self.use_layer_norm,
            normalize_after=self.normalize_after,
            highway_bias=self.highway_bias,
            rescale=self.rescale,
            weight_c_init=self.weight_c_init,
            recurrence_policy=policy,
        )

    def _build_transform(self, index: int, in_features: int, out_features: int) -> nn.Module:
        if self.layer_has_attention(index):
            return SRUppAttention(
                in_features,
                out_features,
                self.proj_size,
                num_heads=self.num_heads,
                dropout=self.dropout,
                attn_dropout=self.attn_dropout,
                layer_norm=self.attn_layer_norm,
            )
        return SRUppProjectedLinear(
            in_features,
            out_features,
            self.proj_size,
            dropout=self.dropout,
            layer_norm=self.attn_layer_norm,
        )

    def layer_has_attention(self, index: int) -> bool:
        if self.attention_last_n_layers != -1:
            return self.num_layers - index <= self.attention_last_n_layers
        return (index + 1) % self.attention_every_n_layers == 0

    def __getitem__(self, index: int) -> SRUppCell:
        return self.rnn_lst[index]

    def reset_parameters(self) -> None:
        for layer in self.rnn_lst:
            layer.reset_parameters()
        if self.input_to_hidden is not None:
            nn.init.xavier_uniform_(self.input_to_hidden.weight)

    def layer_input_sizes(self) -> list[int]:
        first = self.output_size if self.input_to_hidden is not None else self.input_size
        return [first] + [self.output_size] * (self.num_layers - 1)

    # ------------------------------------------------------------------ forward
    def forward(
        self,
        input: Tensor | PackedSequence,
        c0: Tensor | None = None,
        mask_pad: Tensor | None = None,
        attn_mask: Tensor | None = None,
        memory: Sequence[Tensor | None] | None = None,
        memory_mask_pad: Tensor | None = None,
        reset: Tensor | None = None,
        memory_reset: Tensor | None = None,
    ) -> tuple[Tensor | PackedSequence, Tensor, MemoryBank]:
        owner = type(self).__name__
        refuse_jit_trace(owner)
        device = self.rnn_lst[0].bias.device
        batch_first = self.batch_first
        lengths = None
        if isinstance(input, PackedSequence):
            if reset is not None:
                raise ValueError(
                    f"{owner}: `reset` must be None for a PackedSequence input (its sequences are separate "
                    f"already), got a tensor of shape {tuple(reset.shape)}"
                )
            input, lengths, mask_pad = unpack_sequence(owner, input, mask_pad, device)
            batch_first = False
        x, _ = to_time_major(owner, input, self.input_size, batch_first, device, one_step_allowed=False)
        length, batch = x.shape[0], x.shape[1]
        if mask_pad is not None and lengths is None:
            mask_pad = time_major_padding_mask(owner, mask_pad, length, batch, False, batch_first, device)

        layer_c0 = self._layer_initial_states(owner, c0, batch, device)

        layer_memory = self._time_major_memory(owner, memory, batch, batch_first, device)
        memory_length = self._memory_length(owner, layer_memory)
        if memory_mask_pad is not None:
            if memory_length is None:
                raise ValueError(
                    f"{owner}: `memory_mask_pad` must be None when no `memory` is given, "
                    f"got a tensor of shape {tuple(memory_mask_pad.shape)}"
                )
            memory_mask_pad = time_major_padding_mask(
                owner, memory_mask_pad, memory_length, batch, False, batch_first, device, "memory_mask_pad"
            )
        if reset is not None:
            reset = time_major_padding_mask(owner, reset, length, batch, False, batch_first, device, "reset")
        if memory_reset is not None:
            if reset is None or memory_length is None:
                raise ValueError(
                    f"{owner}: `memory_reset` must be None unless both `reset` and `memory` are given, "
                    f"got a tensor of shape {tuple(memory_reset.shape)}"
                )
            memory_reset = time_major_padding_mask(
                owner, memory_reset, memory_length, batch, False, batch_first, device, "memory_reset"
            )
        if attn_mask is not None:
            check_floating_tensor(owner, "attn_mask", attn_mask)
            context = (memory_length or 0) + length
            check_shape(owner, "attn_mask", attn_mask, (length, context), "(length, memory length + length), additive")
            check_same_device(owner, "attn_mask", attn_mask, device, "the input's")

        # Each layer zeroes its padded steps; the first projection needs the same care.
        h = x if self.input_to_hidden is None else self.input_to_hidden(zero_padded_steps(x, mask_pad))
        saved_inputs = []
        last_states = []
        for layer, c_init, layer_mem in zip(self.rnn_lst, layer_c0, layer_memory):
            saved_inputs.append(h)
            h, c_last = layer(
                h,
                c_init,
                mask_pad=mask_pad,
                attn_mask=attn_mask,
                memory=layer_mem,
                memory_mask_pad=memory_mask_pad if layer_mem is not None else None,
                reset=reset,
                memory_reset=memory_reset if layer_mem is not None else None,
            )
            last_states.append(c_last)
        c_stack = self._stacked_last_states(last_states, batch)

        if lengths is not None:
            return pack_padded_sequence(h, lengths, enforce_sorted=False), c_stack, {"saved_inputs": saved_inputs}
        if batch_first:
            h = h.transpose(0, 1)
            saved_inputs = [saved.transpose(0, 1) for saved in saved_inputs]
        return h, c_stack, {"saved_inputs": saved_inputs}

    def extend_memory(
        self,
        memory: Sequence[Tensor | None] | None,
        saved_inputs: Sequence[Tensor],
        max_length: int | None = None,
    ) -> list[Tensor]:
        """The memory for the next call: ``memory`` followed by ``saved_inputs`` along time,
        keeping the last ``max_length`` steps (all when None). Detached: the next call does
        not backpropagate into this one (Transformer-XL style)."""
        time_dim = 1 if self.batch_first else 0
        result = []
        for index, saved in enumerate(saved_inputs):
            earlier = None if memory is None else memory[index]
            merged = saved.detach() if earlier is None else torch.cat([earlier.detach(), saved.detach()], time_dim)
            steps = merged.shape[time_dim]
            if max_length is not None and steps > max_length:
                merged = merged.narrow(time_dim, steps - max_length, max_length)
            result.append(merged)
        return result

    # ------------------------------------------------------------------ checks
    def _time_major_memory(
        self, owner: str, memory, batch: int, batch_first: bool, device: torch.device
    ) -> list[Tensor | None]:
        if memory is None:
            return [None] * self.num_layers
        if not isinstance(memory, (list, tuple)):
            raise TypeError(
                f"{owner}: `memory` must be a list of tensors (one per layer, None allowed), "
                f"got {type(memory).__name__}"
            )
        if len(memory) != self.num_layers:
            raise ValueError(f"{owner}: `memory` must hold num_layers={self.num_layers} entries, got {len(memory)}")
        layout = "(batch, memory length, width)" if batch_first else "(memory length, batch, width)"
        result: list[Tensor | None] = []
        for index, (entry, width) in enumerate(zip(memory, self.layer_input_sizes())):
            name = f"memory[{index}]"
            if entry is None:
                result.append(None)
                continue
            check_floating_tensor(owner, name, entry)
            batch_dim = 0 if batch_first else 1
            if entry.dim() != 3 or entry.shape[batch_dim] != batch or entry.shape[2] != width:
                raise ValueError(
                    f"{owner}: `{name}` must be 3-D {layout} with batch={batch} and width={width} "
                    f"(that layer's input size), got shape {tuple(entry.shape)}"
                )
            check_same_device(owner, name, entry, device, "the input's")
            result.append(entry.transpose(0, 1) if batch_first else entry)
        return result

    def _memory_length(self, owner: str, layer_memory: list[Tensor | None]) -> int | None:
        """The memory length M shared by the attention layers' memories (None without memory)."""
        given = {index: entry.shape[0] for index, entry in enumerate(layer_memory) if entry is not None}
        lengths = {index: length for index, length in given.items() if self.layer_has_attention(index)}
        if not lengths:
            # No attention layer reads the memory, but its length still sets the mask's width
            # (L, M + L), so a mask built for the attention configuration fits here too.
            lengths = given
        if not lengths:
            return None
        if len(set(lengths.values())) > 1:
            raise ValueError(
                f"{owner}: the attention layers' `memory` entries must have one length (the "
                f"attn_mask covers memory length + length), got lengths {lengths}"
            )
        return next(iter(lengths.values()))

    def extra_repr(self) -> str:
        parts = [f"{self.input_size}, {self.hidden_size}, {self.proj_size}"]
        parts += non_default_settings(
            self,
            (
                ("num_layers", 2),
                ("dropout", 0.0),
                ("attn_dropout", 0.0),
                ("num_heads", 1),
                ("bidirectional", False),
                ("normalize_after", False),
                ("attn_layer_norm", True),
                ("highway_bias", -2.0),
                ("attention_every_n_layers", 1),
                ("attention_last_n_layers", -1),
                ("rescale", False),
                ("nn_rnn_compatible_return", False),
                ("weight_c_init", 1.0),
                ("batch_first", False),
                ("recurrence_policy", "auto"),
            ),
        )
        if self.use_layer_norm:
            parts.append("layer_norm=True")
        return ", ".join(parts)
