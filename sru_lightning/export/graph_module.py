"""The language model as one graph for export: token ids and carried state in, logits and the
new state out.

One graph serves a whole sequence (a prompt, an evaluation batch) and one decoding step (L = 1):
batch and length are dynamic. The state is a flat list of tensors, so every runtime (ONNX Runtime,
a torch.export program, an AOTInductor package) passes it in and out the same way:

* ``model=sru``: ``c`` (num_layers, B, dirs*hidden);
* ``model=lstm``: ``h`` and ``c`` (num_layers, B, hidden);
* ``model=srupp``: ``c``, then each attention layer's memory (M, B, width) -- the inputs of its
  last M = ``memory_length`` tokens -- and ``memory_pad`` (M, B), True where a memory slot holds
  no token yet. A fixed-size memory with a padding mask keeps every shape of the graph
  independent of how many tokens came before; the attention never looks at padded slots, so
  the outputs are those of the eager model, which starts with no memory at all.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import Tensor, nn

#: Dynamic dimensions of the graph's inputs and outputs, as the manifest names them.
BATCH, LENGTH = "batch", "length"


class ExportError(ValueError):
    """A model or setting that cannot be exported; the message names it and what is accepted."""


@dataclass(frozen=True)
class TensorSpec:
    """One input or output of the graph: its name, shape (ints, or "batch"/"length") and dtype.

    ``initial`` is the value a state input starts from (the whole tensor filled with it)."""

    name: str
    shape: tuple
    dtype: str
    initial: float | bool | None = None

    def as_dict(self) -> dict:
        return {key: (list(value) if key == "shape" else value) for key, value in asdict(self).items()}

    def initial_tensor(self, batch: int) -> Tensor:
        """The initial state tensor for a batch of `batch` sequences."""
        shape = [batch if size == BATCH else size for size in self.shape]
        return torch.full(shape, self.initial, dtype=getattr(torch, self.dtype))


def _refuse_training_options(model) -> None:
    """Dropout masks and per-step gate weights exist only in training or with `custom_m`."""
    if model.training:
        raise ExportError(
            "the model is in training mode (dropout masks are not part of an exported "
            "graph); call model.eval() before exporting"
        )
    from sru_lightning.nn import SRUCell

    for name, module in model.named_modules():
        if isinstance(module, SRUCell) and module.custom_m is not None:
            raise ExportError(
                f"layer {name!r} has custom_m (per-step weight_c, a training-time option of the recurrence); "
                "expected an SRU layer without custom_m"
            )
        if isinstance(module, SRUCell) and module.rnn_dropout > 0 and module.training:
            raise ExportError(f"layer {name!r} is in training mode (rnn_dropout masks); call model.eval() first")


class ExportableLanguageModel(nn.Module):
    """``forward(tokens (B, L) int64, *state) -> (logits (B, L, V), *new_state)`` of a trained
    language network (:class:`~sru_lightning.nn.LanguageNet`, or the
    :class:`~sru_lightning.models.SRULanguageModel` that trained it) in eval mode, for export."""

    def __init__(self, model) -> None:
        super().__init__()
        from sru_lightning.nn.language_net import RNN_TYPES

        net = getattr(model, "net", model)
        rnn_type = getattr(net, "rnn_type", None)
        if rnn_type not in RNN_TYPES:
            raise ExportError(f"`model.net.rnn` must be one of {RNN_TYPES}, got {rnn_type!r}")
        _refuse_training_options(model)
        self.net = net
        self.rnn_type = rnn_type
        rnn = net.rnn
        if self.rnn_type == "srupp":
            self.memory_length = int(net.memory_length)
            self.attention_layers = [i for i in range(rnn.num_layers) if rnn.layer_has_attention(i)]
            widths = rnn.layer_input_sizes()
            self.memory_widths = [widths[i] for i in self.attention_layers]
        else:
            self.memory_length = 0
            self.attention_layers, self.memory_widths = [], []

    # -- the graph's signature ----------------------------------------------------------
    def state_specs(self) -> list[TensorSpec]:
        rnn, dtype = self.net.rnn, "float32"
        if self.rnn_type == "lstm":
            shape = (rnn.num_layers, BATCH, rnn.hidden_size)
            return [TensorSpec("h", shape, dtype, 0.0), TensorSpec("c", shape, dtype, 0.0)]
        specs = [TensorSpec("c", (rnn.num_layers, BATCH, rnn.output_size), dtype, 0.0)]
        if self.memory_length:
            for layer, width in zip(self.attention_layers, self.memory_widths):
                specs.append(TensorSpec(f"memory_{layer}", (self.memory_length, BATCH, width), dtype, 0.0))
            specs.append(TensorSpec("memory_pad", (self.memory_length, BATCH), "bool", True))
        return specs

    def input_specs(self) -> list[TensorSpec]:
        return [TensorSpec("tokens", (BATCH, LENGTH), "int64"), *self.state_specs()]

    def output_specs(self) -> list[TensorSpec]:
        logits = TensorSpec("logits", (BATCH, LENGTH, self.net.vocab_size), "float32")
        return [logits, *(TensorSpec(f"{spec.name}_out", spec.shape, spec.dtype) for spec in self.state_specs())]

    def example_inputs(self, batch: int = 2, length: int = 5) -> tuple[Tensor, ...]:
        tokens = torch.randint(0, self.net.vocab_size, (batch, length))
        return (tokens, *(spec.initial_tensor(batch) for spec in self.state_specs()))

    def dynamic_shapes(self) -> tuple:
        batch, length = torch.export.Dim("batch", min=1, max=1 << 16), torch.export.Dim("length", min=1, max=1 << 20)
        dims = {BATCH: batch, LENGTH: length}
        tokens, *state = (
            {axis: dims[size] for axis, size in enumerate(spec.shape) if isinstance(size, str)}
            for spec in self.input_specs()
        )
        return (tokens, tuple(state))  # forward(tokens, *state)

    # -- the computation ----------------------------------------------------------------
    def forward(self, tokens: Tensor, *state: Tensor) -> tuple[Tensor, ...]:
        model = self.net
        embedded = model.embedding(tokens.t())  # (L, B, E); dropout is the identity in eval mode
        if self.rnn_type == "lstm":
            output, (h, c) = model.rnn(embedded, (state[0], state[1]))
            new_state = (h, c)
        elif self.rnn_type == "sru":
            output, c = model.rnn(embedded, state[0])
            new_state = (c,)
        else:
            output, new_state = self._srupp(embedded, state)
        if model.projection is not None:
            output = model.projection(output)
        return (model.decoder(output).transpose(0, 1), *new_state)

    def _srupp(self, embedded: Tensor, state: tuple[Tensor, ...]) -> tuple[Tensor, tuple[Tensor, ...]]:
        rnn, c0, length = self.net.rnn, state[0], embedded.shape[0]
        steps = self.memory_length
        memory = memory_pad = None
        if steps:
            memory = [None] * rnn.num_layers
            for layer, tensor in zip(self.attention_layers, state[1:-1]):
                memory[layer] = tensor
            memory_pad = state[-1]
        # Causal over memory + segment: token t sees every memory slot and tokens 0..t.
        positions = torch.arange(length, device=embedded.device)
        keys = torch.arange(steps + length, device=embedded.device)
        causal = torch.zeros(length, steps + length, device=embedded.device)
        causal = causal.masked_fill(keys.unsqueeze(0) > positions.unsqueeze(1) + steps, float("-inf"))
        output, c, bank = rnn(embedded, c0, attn_mask=causal, memory=memory, memory_mask_pad=memory_pad)
        if not steps:
            return output, (c,)
        kept = []
        for layer in self.attention_layers:
            merged = torch.cat([memory[layer], bank["saved_inputs"][layer]], dim=0)
            kept.append(merged.narrow(0, length, steps))
        filled = torch.zeros(length, memory_pad.shape[1], dtype=torch.bool, device=embedded.device)
        kept_pad = torch.cat([memory_pad, filled], dim=0).narrow(0, length, steps)
        return output, (c, *kept, kept_pad)
