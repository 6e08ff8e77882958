"""The language network: token embedding -> recurrent backbone -> next-token logits.

Plain PyTorch, usable without Lightning or Hydra: :class:`LanguageNet` is what
:class:`sru_lightning.models.SRULanguageModel` trains, and what a generation loop, an export or
a folder of weights loads on its own. Its constructor takes plain values only, and
:attr:`LanguageNet.config` gives them back (JSON-able), so ``LanguageNet(**net.config)``
rebuilds it and :func:`build_network` rebuilds it from a saved mapping.
"""

from __future__ import annotations

import copy
import numbers
import sys
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from .common import time_shared_dropout_mask
from .configs import LanguageNetConfig
from .srupp import SRUpp
from .stack import SRU
from .streaming import causal_attention_mask, srupp_stream_step, stream_step

__all__ = ["NETWORKS", "RNN_TYPES", "LanguageNet", "build_network"]

#: The recurrent backbones a :class:`LanguageNet` is built with.
RNN_TYPES = ("sru", "srupp", "lstm")


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"LanguageNet: `{name}` must be a positive integer, got {value!r}")
    return int(value)


def _plain_options(value: Any) -> dict[str, Any] | None:
    """`sru_options` as a builtin dict (a Hydra DictConfig, or any mapping, is copied)."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ValueError(f"LanguageNet: `sru_options` must be a mapping of layer arguments or null, got {value!r}")
    # A Hydra DictConfig (omegaconf is then loaded already): resolved into builtin containers.
    omegaconf = sys.modules.get("omegaconf")
    if omegaconf is not None and omegaconf.OmegaConf.is_config(value):
        return omegaconf.OmegaConf.to_container(value, resolve=True)
    return copy.deepcopy(dict(value))


class LanguageNet(nn.Module):
    """Next-token network over SRU, SRU++ or LSTM layers.

    One class with a `rnn` argument rather than one class per backbone: the three share the
    embedding, dropout, weight tying, output layer and parameter names (so a checkpoint's keys
    say the same thing for each), the configs of the other backbones build on the SRU one
    (``conf/model/srupp.yaml`` and ``lstm.yaml`` change `rnn` and a few sizes), and a saved
    network is rebuilt from one class and its :attr:`config`.

    Args:
        vocab_size: number of token ids.
        rnn: "sru" (:class:`sru_lightning.nn.SRU`), "srupp" (:class:`sru_lightning.nn.SRUpp`:
            attention inside the recurrence's input projection, causal, attending to the previous
            tokens kept as memory) or "lstm" (:class:`torch.nn.LSTM` baseline).
        embedding_dim, hidden_size, num_layers: sizes.
        dropout: on the embeddings, between layers and before the output layer.
        rnn_dropout: SRU's variational dropout on the hidden state (rnn "sru" only).
        tie_weights: share the embedding matrix with the output layer; when hidden_size differs
            from embedding_dim a linear projection maps the recurrent output down first.
        sru_options: extra keyword arguments of :class:`SRU` (highway_bias, layer_norm,
            projection_size, recurrence_policy, ...), or of :class:`SRUpp` with rnn "srupp"
            (proj_size is required; num_heads, attention_every_n_layers, ...); unused by "lstm".
        memory_length: with rnn "srupp", how many earlier tokens each attention layer keeps as
            memory across calls (0: none).
        time_shared_dropout: the dropout on the embeddings and before the output layer draws one
            mask per sequence and feature, shared over time (as the SRU layers' dropout between
            layers does), instead of one per element: 1/L of the random numbers (per-element
            masks cost about a tenth of a training step on the CPU; docs/benchmarks.md measures
            both on the 5-minute recipe).

    ``forward(tokens (B, L), state=None, reset=None) -> (logits (B, L, vocab), state)``; feeding
    the state back continues the sequence. ``step`` reads on from a state and returns the logits
    of the next token (generation).
    """

    #: tokens (B, L) and logits (B, L, vocab): time is the second axis (as read by
    #: :func:`sru_lightning.nn.streaming.stream_chunks`).
    batch_first = True
    config_class = LanguageNetConfig

    def __init__(
        self,
        vocab_size: int,
        rnn: str = "sru",
        embedding_dim: int = 128,
        hidden_size: int = 256,
        num_layers: int = 2,
        dropout: float = 0.1,
        rnn_dropout: float = 0.0,
        tie_weights: bool = False,
        sru_options: Mapping[str, Any] | None = None,
        memory_length: int = 0,
        time_shared_dropout: bool = False,
    ) -> None:
        super().__init__()
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, numbers.Integral) or vocab_size < 2:
            raise ValueError(f"LanguageNet: `vocab_size` must be an integer >= 2, got {vocab_size!r}")
        if rnn not in RNN_TYPES:
            raise ValueError(f"LanguageNet: `rnn` must be one of {RNN_TYPES}, got {rnn!r}")
        embedding_dim = _positive_int("embedding_dim", embedding_dim)
        hidden_size = _positive_int("hidden_size", hidden_size)
        num_layers = _positive_int("num_layers", num_layers)
        for name, value in (("dropout", dropout), ("rnn_dropout", rnn_dropout)):
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= value < 1.0:
                raise ValueError(f"LanguageNet: `{name}` must be in [0, 1), got {value!r}")
        if isinstance(memory_length, bool) or not isinstance(memory_length, numbers.Integral) or memory_length < 0:
            raise ValueError(f"LanguageNet: `memory_length` must be an integer >= 0, got {memory_length!r}")
        for name, value in (("tie_weights", tie_weights), ("time_shared_dropout", time_shared_dropout)):
            if not isinstance(value, bool):
                raise ValueError(f"LanguageNet: `{name}` must be true or false, got {value!r}")
        options = _plain_options(sru_options)
        if rnn == "srupp" and "proj_size" not in (options or {}):
            raise ValueError(
                "LanguageNet: `sru_options.proj_size` (the attention width) is required with rnn='srupp', "
                f"got sru_options={options!r}"
            )
        if (options or {}).get("bidirectional"):
            raise ValueError(
                "LanguageNet: `sru_options.bidirectional` must be false (a language model predicts the next "
                "token, and a bidirectional layer reads it), got true"
            )
        self._config = LanguageNetConfig(
            vocab_size=int(vocab_size),
            rnn=rnn,
            embedding_dim=embedding_dim,
            hidden_size=hidden_size,
            num_layers=num_layers,
            dropout=float(dropout),
            rnn_dropout=float(rnn_dropout),
            tie_weights=tie_weights,
            sru_options=options,
            memory_length=int(memory_length),
            time_shared_dropout=time_shared_dropout,
        )
        self.rnn_type = rnn
        self.time_shared_dropout = time_shared_dropout
        self.vocab_size = int(vocab_size)
        self.embedding_dim = embedding_dim
        self.memory_length = int(memory_length)

        # Built in this order so a seeded run draws the same initial weights as it always did.
        self.embedding = nn.Embedding(vocab_size, embedding_dim)
        self.dropout = nn.Dropout(dropout)
        if rnn == "sru":
            self.rnn = SRU(
                embedding_dim,
                hidden_size,
                num_layers=num_layers,
                dropout=dropout,
                rnn_dropout=rnn_dropout,
                **(options or {}),
            )
        elif rnn == "srupp":
            self.rnn = SRUpp(embedding_dim, hidden_size, num_layers=num_layers, dropout=dropout, **options)
        else:
            self.rnn = nn.LSTM(
                embedding_dim, hidden_size, num_layers=num_layers, dropout=dropout if num_layers > 1 else 0.0
            )
        self.projection = (
            nn.Linear(hidden_size, embedding_dim, bias=False) if tie_weights and hidden_size != embedding_dim else None
        )
        self.decoder = nn.Linear(embedding_dim if tie_weights else hidden_size, vocab_size)
        if tie_weights:
            self.decoder.weight = self.embedding.weight
        nn.init.uniform_(self.embedding.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)

    @property
    def config(self) -> dict[str, Any]:
        """The constructor's keyword arguments (builtin values only): ``LanguageNet(**config)``
        builds a network of the same shape (:attr:`pretrained_config` as a mapping)."""
        return self._config.to_dict()

    @property
    def pretrained_config(self) -> LanguageNetConfig:
        """The config object this network was built from (what a folder of its weights records)."""
        return self._config

    @property
    def accepts_document_boundaries(self) -> bool:
        """Whether packed documents (a `reset` flag per token) can be read: the SRU stack restarts
        its state at each flag, and SRU++ also keeps its attention (and memory) inside each
        document; nn.LSTM has no per-step state reset."""
        return self.rnn_type in ("sru", "srupp")

    def forward(self, tokens: Tensor, state: Any = None, reset: Tensor | None = None) -> tuple[Tensor, Any]:
        """tokens (B, L) -> logits (B, L, vocab), final recurrent state.

        `reset` (B, L) bool marks the first token of each document packed into the rows (rnn
        "sru" or "srupp"): the recurrence restarts from zero there (and SRU++ attends within each
        document only), so no document reads another.
        """
        embedded = self._drop(self.embedding(tokens.t()))  # time-major (L, B, E)
        if reset is not None and not self.accepts_document_boundaries:
            raise ValueError(
                f"LanguageNet: packed documents (`reset`) need rnn='sru' or 'srupp', got "
                f"rnn={self.rnn_type!r} (nn.LSTM has no per-step state reset); use model=sru, or data "
                "whose batches carry no document boundaries"
            )
        output, state = self.backbone_forward(embedded, state, None if reset is None else reset.t())
        output = self._drop(output)
        if self.projection is not None:
            output = self.projection(output)
        return self.decoder(output).transpose(0, 1), state

    def _drop(self, values: Tensor) -> Tensor:
        """The dropout on time-major values (L, B, F): per element, or one mask per sequence and
        feature with `time_shared_dropout`."""
        p = self.dropout.p
        if not self.time_shared_dropout or not self.training or p == 0:
            return self.dropout(values)
        # Drawn and scaled in the weights' precision, then stored as the values are (bfloat16 under
        # autocast would scale by 1.4296875 instead of 1 / 0.7).
        mask = time_shared_dropout_mask(self.decoder.weight, tuple(values.shape[1:]), p)
        return values * mask.to(values.dtype)

    def backbone_forward(self, embedded: Tensor, state: Any = None, reset: Tensor | None = None) -> tuple[Tensor, Any]:
        """The recurrent layers alone over time-major inputs (L, B, embedding_dim), from `state`
        (None: zeros); returns (output (L, B, hidden), the state to carry). `reset` (L, B) marks
        document starts.

        The state is SRU's ``c``, the LSTM's ``(h, c)``, or for SRU++ the flat tuple
        ``(c, memory_0, ..., memory_{n-1})`` -- each layer's last `memory_length` inputs, detached;
        ``(c,)`` alone when `memory_length` is 0 -- with one more entry after packed documents,
        the memory's own document starts (see :meth:`_srupp_documents_forward`).
        """
        if self.rnn_type == "srupp":
            layers = self.rnn.num_layers
            if reset is None and (state is None or len(state) <= 1 + layers):
                return srupp_stream_step(self.rnn, embedded, state, self.memory_length)
            return self._srupp_documents_forward(embedded, state, reset)
        if reset is not None:
            return self.rnn(embedded, state, reset=reset)
        return self.rnn(embedded, state)

    def _srupp_documents_forward(
        self, embedded: Tensor, state: tuple | None, reset: Tensor | None
    ) -> tuple[Tensor, tuple]:
        """SRU++ over packed documents: `reset` (L, B) restarts the recurrence and keeps attention
        inside each document. The carried state ends with one more entry, the memory's own
        document starts (M, B) (as 0/1 in the memory's dtype, so it moves and checkpoints like the
        rest), so memory from a document that ended inside it is never attended to."""
        layers = self.rnn.num_layers
        length, batch = embedded.shape[0], embedded.shape[1]
        if reset is None:  # a window without flags after packed ones
            reset = torch.zeros(length, batch, dtype=torch.bool, device=embedded.device)
        c0, memory, memory_starts = None, None, None
        if state is not None:
            c0, memory = state[0], list(state[1 : 1 + layers]) or None
            memory_starts = state[1 + layers].to(torch.bool) if len(state) > 1 + layers else None
        memory_steps = 0 if memory is None else memory[0].shape[0]
        mask = causal_attention_mask(memory_steps, length, embedded.device)
        output, c, bank = self.rnn(
            embedded,
            c0,
            attn_mask=mask,
            memory=memory,
            reset=reset,
            memory_reset=memory_starts if memory is not None else None,
        )
        if self.memory_length == 0:
            return output, (c,)
        kept = self.rnn.extend_memory(memory, bank["saved_inputs"], max_length=self.memory_length)
        earlier = memory_starts if memory_starts is not None else reset.new_zeros(memory_steps, batch)
        starts = torch.cat([earlier, reset], dim=0)[-kept[0].shape[0] :]
        return output, (c, *kept, starts.to(kept[0].dtype))

    def step(self, tokens: Tensor, state: Any = None) -> tuple[Tensor, Any]:
        """Read `tokens` on from `state`; return the logits of the token after the last one.

        tokens: (B,) one step, or (B, L) (a prompt, read in one pass); state: None (zeros) or
        what the previous call returned. Returns (logits (B, vocab), state). Decoding calls it
        once per token, carrying the state, instead of re-reading the whole context.
        """
        if tokens.dim() == 1:
            tokens = tokens.unsqueeze(1)
        logits, state = stream_step(self, tokens, state)
        return logits[:, -1], state


#: The networks :func:`build_network` builds, by the `_target_` a saved config names.
NETWORKS: dict[str, type[nn.Module]] = {
    "sru_lightning.nn.LanguageNet": LanguageNet,
    "sru_lightning.nn.language_net.LanguageNet": LanguageNet,
}


def target_of(net: nn.Module) -> str:
    """The `_target_` that names `net`'s class in a saved config (its public import path)."""
    for target, cls in NETWORKS.items():
        if type(net) is cls:
            return target
    return f"{type(net).__module__}.{type(net).__qualname__}"


def build_network(config: Mapping[str, Any], **overrides: Any) -> nn.Module:
    """The network a saved config describes: ``{"_target_": <a name in NETWORKS>, **arguments}``.

    Only the networks listed in :data:`NETWORKS` are built (a config read from a checkpoint is
    untrusted, so its `_target_` never names an arbitrary callable)."""
    if not isinstance(config, Mapping):
        raise ValueError(f"build_network: `config` must be a mapping with `_target_`, got {type(config).__name__}")
    arguments = dict(_plain_options(config) or {})
    target = arguments.pop("_target_", None)
    if target not in NETWORKS:
        raise ValueError(f"build_network: `_target_` must be one of {sorted(NETWORKS)}, got {target!r}")
    arguments.update(overrides)
    return NETWORKS[target](**arguments)
