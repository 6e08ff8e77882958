"""Character/word language model: embedding -> SRU or SRU++ stack (or LSTM baseline) -> softmax."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch import nn
from torchmetrics import MeanMetric

from .checkpoint_format import check_format, stamp_format

RNN_TYPES = ("sru", "srupp", "lstm")
#: The optimizer of a model given none.
DEFAULT_OPTIMIZER = {"_target_": "torch.optim.Adam", "lr": 1e-3}
#: What each `_target_` setting builds, for the message that asks for one.
_TARGET_EXAMPLES = {
    "optimizer": {"_target_": "torch.optim.AdamW", "lr": 3e-3},
    "lr_scheduler": {"_target_": "torch.optim.lr_scheduler.StepLR", "step_size": 1000},
}
STAGES = ("train", "val", "test")
# Metric names per token unit: bits per character / per word, and the matching perplexity.
BITS_NAMES = {"char": "bpc", "word": "bpw"}
PERPLEXITY_NAMES = {"char": "ppl", "word": "word_ppl"}
_SCHEDULER_KEYS = ("interval", "frequency", "monitor", "strict", "name")
_TOTAL_STEP_KEYS = ("total_steps", "T_max")
_DERIVED_FROM_TOTAL_STEPS = ("_schedule_phases",)  # OneCycleLR's phase boundaries
# Checkpoint entry holding every rank's carried training state: {"world_size": W, "per_rank": [...]}.
CARRIED_STATE_KEY = "carried_train_state"


def _map_state(state: Any, function: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """Apply `function` to a recurrent state: a tensor (SRU's c) or a tuple of them (LSTM, SRU++)."""
    if isinstance(state, torch.Tensor):
        return function(state)
    return tuple(function(tensor) for tensor in state)


def _all_gather(tensor: torch.Tensor, world_size: int) -> list[torch.Tensor]:
    """Every rank's `tensor` (same shape on all ranks), on the CPU, indexed by rank."""
    import torch.distributed as dist

    tensor = tensor.contiguous()
    pieces = [torch.empty_like(tensor) for _ in range(world_size)]
    dist.all_gather(pieces, tensor)
    return [piece.cpu() for piece in pieces]


def _build_from_config(config: Any, **bound) -> Any:
    """Instantiate a `_target_` mapping (Hydra style) or call a factory such as a partial."""
    if callable(config):
        return config(**bound)
    from hydra.utils import instantiate

    return instantiate(config, **bound)


def _plain(value: Any) -> Any:
    """OmegaConf containers (as Hydra passes them) -> builtin dicts/lists; others unchanged."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf
    except ImportError:  # pragma: no cover - hydra-core is a dependency
        return value
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    return value


class SRULanguageModel(pl.LightningModule):
    """Next-token language model trained with truncated backpropagation through time.

    Args:
        vocab_size: number of token ids (the data module's `vocab_size`).
        rnn: "sru" (sru_lightning.nn.SRU), "srupp" (sru_lightning.nn.SRUpp: attention inside
            the recurrence's input projection, causal, attending to the previous tokens kept as
            memory) or "lstm" (torch.nn.LSTM baseline, same harness).
        embedding_dim, hidden_size, num_layers: model size.
        dropout: on the embeddings, between layers and before the output layer.
        rnn_dropout: SRU's variational dropout on the hidden state (ignored by the LSTM).
        tie_weights: share the embedding matrix with the output layer; when hidden_size
            differs from embedding_dim a linear projection maps the RNN output down first.
        carry_hidden: keep the (detached) final state of each batch as the initial state
            of the next one; the data streams are contiguous. For "srupp" the state also holds
            each layer's last `memory_length` inputs, which the next batch attends to. Reset at every epoch start
            and whenever the batch shape changes.
        sru_options: extra keyword arguments for `sru_lightning.nn.SRU` (highway_bias,
            layer_norm, projection_size, recurrence_policy, ...), or for
            `sru_lightning.nn.SRUpp` with rnn="srupp" (proj_size is required; num_heads,
            attention_every_n_layers, ...).
        memory_length: with rnn="srupp", how many earlier tokens each attention layer keeps
            as memory across batches and generation steps (0: none).
        token_unit: what one token is, "char" (characters or bytes) or "word"; it names the
            metrics: `{stage}_bpc` / `{stage}_ppl` for characters, `{stage}_bpw` /
            `{stage}_word_ppl` for words (the data module's `token_unit`).
        optimizer: a `_target_` mapping (e.g. {"_target_": "torch.optim.AdamW", "lr": 3e-3})
            or a callable taking `params`.
        lr_scheduler: None, or a `_target_` mapping / callable taking `optimizer`; Lightning
            keys (interval, frequency, monitor) may sit in the mapping. `total_steps` or
            `T_max` set to null are filled with the trainer's estimated number of steps.
        compile: run the model compiled with `torch.compile` in `fit`, `validate` and `test`:
            false (eager), true (torch.compile's default mode) or a mode name ("max-autotune",
            "reduce-overhead", ...). It changes how the model runs, not what it computes, so
            its weights load into a model with any other setting; `for_trainer()` applies it.
    """

    #: tokens (B, L) and logits (B, L, vocab): time is the second axis (as read by
    #: :func:`sru_lightning.nn.streaming.stream_chunks`).
    batch_first = True

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
        carry_hidden: bool = True,
        sru_options: Mapping[str, Any] | None = None,
        optimizer: Mapping[str, Any] | Callable | None = None,
        lr_scheduler: Mapping[str, Any] | Callable | None = None,
        memory_length: int = 0,
        token_unit: str = "char",
        compile: bool | str = False,
    ) -> None:
        super().__init__()
        if not isinstance(vocab_size, int) or vocab_size < 2:
            raise ValueError(f"SRULanguageModel: `vocab_size` must be an integer >= 2, got {vocab_size!r}")
        if rnn not in RNN_TYPES:
            raise ValueError(f"SRULanguageModel: `model.rnn` must be one of {RNN_TYPES}, got {rnn!r}")
        for name, value in (("embedding_dim", embedding_dim), ("hidden_size", hidden_size), ("num_layers", num_layers)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"SRULanguageModel: `model.{name}` must be a positive integer, got {value!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"SRULanguageModel: `model.dropout` must be in [0, 1), got {dropout!r}")
        if isinstance(memory_length, bool) or not isinstance(memory_length, int) or memory_length < 0:
            raise ValueError(f"SRULanguageModel: `model.memory_length` must be an integer >= 0, got {memory_length!r}")
        if rnn == "srupp" and "proj_size" not in (sru_options or {}):
            raise ValueError(
                "SRULanguageModel: `model.sru_options.proj_size` (the attention width) is required "
                f"with model.rnn='srupp', got sru_options={_plain(sru_options)!r}"
            )
        for name, value in (("tie_weights", tie_weights), ("carry_hidden", carry_hidden)):
            if not isinstance(value, bool):
                raise ValueError(f"SRULanguageModel: `model.{name}` must be true or false, got {value!r}")
        if (sru_options or {}).get("bidirectional"):
            raise ValueError(
                "SRULanguageModel: `model.sru_options.bidirectional` must be false (a language model predicts "
                "the next token, and a bidirectional layer reads it), got true"
            )
        _check_compile_setting(compile)
        for name, value in (("optimizer", optimizer), ("lr_scheduler", lr_scheduler)):
            if value is not None and not callable(value) and not (isinstance(value, Mapping) and "_target_" in value):
                raise ValueError(
                    f"SRULanguageModel: `model.{name}` must be a mapping whose `_target_` names the class to "
                    f"build (e.g. {_TARGET_EXAMPLES[name]}) or a callable, got {_plain(value)!r}"
                )
        if token_unit not in BITS_NAMES:
            raise ValueError(f"SRULanguageModel: `token_unit` must be one of {tuple(BITS_NAMES)}, got {token_unit!r}")
        # Plain containers in the hyperparameters keep checkpoints loadable with weights_only=True.
        sru_options, optimizer, lr_scheduler = (_plain(value) for value in (sru_options, optimizer, lr_scheduler))
        self.save_hyperparameters()
        self.rnn_type = rnn
        self.carry_hidden = carry_hidden
        self.memory_length = memory_length
        self.token_unit = token_unit
        self.optimizer_config = optimizer if optimizer is not None else dict(DEFAULT_OPTIMIZER)
        self.lr_scheduler_config = lr_scheduler

        self.embedding = nn.Embedding(vocab_size, embedding_dim)
        self.dropout = nn.Dropout(dropout)
        if rnn == "sru":
            from sru_lightning.nn import SRU

            self.rnn = SRU(
                embedding_dim,
                hidden_size,
                num_layers=num_layers,
                dropout=dropout,
                rnn_dropout=rnn_dropout,
                **dict(sru_options or {}),
            )
        elif rnn == "srupp":
            from sru_lightning.nn import SRUpp

            self.rnn = SRUpp(embedding_dim, hidden_size, num_layers=num_layers, dropout=dropout, **dict(sru_options))
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

        # Token-weighted mean cross-entropy (nats); bpc and perplexity derive from it.
        self.mean_nats = nn.ModuleDict({f"{stage}_nats": MeanMetric() for stage in STAGES})
        self._carried: dict[str, Any] = {}

    def configure_model(self) -> None:
        """A strategy that shards the module it is handed (`shard(module)`, as
        :class:`sru_lightning.strategies.FSDP2Strategy` does: each recurrent layer and the root)
        shards this model; other strategies wrap the model themselves. The model asks the
        strategy, and knows no strategy class."""
        trainer = self._trainer
        shard = getattr(trainer.strategy, "shard", None) if trainer is not None else None
        if callable(shard):
            shard(self)

    def for_trainer(self) -> nn.Module:
        """What to hand the Trainer: this model, or `torch.compile(self)` when `compile` asks for it.

        Lightning unwraps a compiled LightningModule and trains the module itself with its
        forward and step methods compiled, so checkpoints hold this model's own parameter names
        (no `_orig_mod.` prefix) and callbacks find its SRU layers.
        """
        setting = self.hparams.get("compile", False)
        if setting is False:
            return self
        return torch.compile(self, mode=None if setting is True else setting)

    @property
    def accepts_document_boundaries(self) -> bool:
        """Whether batches of packed documents (a `reset` flag per token) can be read: the SRU
        stack restarts its state at each flag, and SRU++ also keeps its attention (and memory)
        inside each document; nn.LSTM has no per-step state reset."""
        return self.rnn_type in ("sru", "srupp")

    # -- model ------------------------------------------------------------------------------
    def forward(
        self, tokens: torch.Tensor, state: Any = None, reset: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, Any]:
        """tokens (B, L) -> logits (B, L, vocab), final recurrent state.

        Feeding the returned state back with the next tokens continues the sequence, one token
        at a time for generation as well as segment by segment in training. `reset` (B, L) bool
        marks the first token of each document packed into the rows (rnn "sru" or "srupp"): the
        recurrence restarts from zero there (and SRU++ attends within each document only), so no
        document reads another.
        """
        embedded = self.dropout(self.embedding(tokens.t()))  # time-major (L, B, E)
        if reset is not None and not self.accepts_document_boundaries:
            raise ValueError(
                f"SRULanguageModel: packed documents (`reset`) need model.rnn='sru' or 'srupp', got "
                f"model.rnn={self.rnn_type!r} (nn.LSTM has no per-step state reset); use model=sru, or data "
                "whose batches carry no document boundaries"
            )
        if self.rnn_type == "srupp":
            output, state = self._srupp_forward(embedded, state, None if reset is None else reset.t())
        elif reset is not None:
            output, state = self.rnn(embedded, state, reset=reset.t())
        else:
            output, state = self.rnn(embedded, state)
        output = self.dropout(output)
        if self.projection is not None:
            output = self.projection(output)
        return self.decoder(output).transpose(0, 1), state

    def _srupp_forward(
        self, embedded: torch.Tensor, state: tuple | None, reset: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, tuple]:
        """SRU++ over (L, B, E) with a causal mask over memory + segment.

        The state is the flat tuple (c, memory_0, ..., memory_{n-1}): c (num_layers, B, H) and
        each layer's last `memory_length` inputs (M, B, width), detached; (c,) alone when
        `memory_length` is 0. A flat tuple of tensors detaches, moves and checkpoints like the
        LSTM's (h, c). The layers' streaming step (:func:`sru_lightning.nn.streaming.srupp_stream_step`)
        carries it.
        """
        from sru_lightning.nn.streaming import srupp_stream_step

        layers = self.rnn.num_layers
        if reset is None and (state is None or len(state) <= 1 + layers):
            return srupp_stream_step(self.rnn, embedded, state, self.memory_length)
        return self._srupp_documents_forward(embedded, state, reset)

    def _srupp_documents_forward(
        self, embedded: torch.Tensor, state: tuple | None, reset: torch.Tensor | None
    ) -> tuple[torch.Tensor, tuple]:
        """SRU++ over packed documents: `reset` (L, B) restarts the recurrence and keeps attention
        inside each document. The carried state ends with one more entry, the memory's own
        document starts (M, B) (as 0/1 in the memory's dtype, so it moves and checkpoints like the
        rest), so memory from a document that ended inside it is never attended to."""
        from sru_lightning.nn.streaming import causal_attention_mask

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

    def step(self, tokens: torch.Tensor, state: Any = None) -> tuple[torch.Tensor, Any]:
        """Read `tokens` on from `state`; return the logits of the token after the last one.

        tokens: (B,) one step, or (B, L) (a prompt, read in one pass); state: None (zeros) or
        what the previous call returned. Returns (logits (B, vocab), state). Decoding calls
        it once per token, carrying the state, instead of re-reading the whole context.
        """
        from sru_lightning.nn.streaming import stream_step

        if tokens.dim() == 1:
            tokens = tokens.unsqueeze(1)
        logits, state = stream_step(self, tokens, state)
        return logits[:, -1], state

    # -- metric names -----------------------------------------------------------------------
    def bits_name(self, stage: str) -> str:
        """Name of the bits-per-token metric of `stage`: e.g. `val_bpc`, or `val_bpw` for words."""
        return f"{stage}_{BITS_NAMES[self.token_unit]}"

    def perplexity_name(self, stage: str) -> str:
        """Name of the perplexity metric of `stage`: e.g. `val_ppl`, or `val_word_ppl` for words."""
        return f"{stage}_{PERPLEXITY_NAMES[self.token_unit]}"

    # -- state carry ------------------------------------------------------------------------
    def _initial_state(self, stage: str, batch_size: int) -> Any:
        state = self._carried.get(stage) if self.carry_hidden else None
        if state is None:
            return None
        first = state[0] if isinstance(state, tuple) else state
        if first.size(1) != batch_size:  # a new stream layout: start from zeros
            return None
        if first.device != self.device:  # restored from a checkpoint, which loads on CPU
            state = tuple(s.to(self.device) for s in state) if isinstance(state, tuple) else state.to(self.device)
        return state

    def _keep_state(self, stage: str, state: Any) -> None:
        if not self.carry_hidden:
            return
        self._carried[stage] = tuple(s.detach() for s in state) if isinstance(state, tuple) else state.detach()

    def reset_state(self, stage: str | None = None) -> None:
        """Forget the carried state of one stage (or all)."""
        if stage is None:
            self._carried.clear()
        else:
            self._carried.pop(stage, None)

    def _own_carried_state(self, saved: Any) -> Any:
        """This rank's carried training state from a checkpoint's, or None (start from zeros)."""
        saved_world_size, per_rank = int(saved["world_size"]), list(saved["per_rank"])
        trainer = self._trainer
        if trainer is not None and trainer.state.fn != TrainerFn.FITTING:
            return None  # only a resumed fit continues the training stream; evaluation starts its own
        world_size, rank = (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)
        if saved_world_size != world_size:
            rank_zero_warn(
                f"The checkpoint carries the recurrent state of {saved_world_size} process(es), this fit runs "
                f"{world_size}: the rest of the interrupted epoch starts from a zero state, so its losses "
                "differ from those of an uninterrupted run"
            )
            return None
        return per_rank[rank]

    def _metrics_in_float32(self) -> None:
        # `16-true`/`bf16-true` cast the whole module, metric states included; a running sum
        # of thousands of losses in bf16 would be off in the second digit.
        for metric in self.mean_nats.values():
            metric.set_dtype(torch.float32)

    def setup(self, stage: str) -> None:
        # An example batch of the datamodule's size lets the model summary printed at the start
        # of a fit count a forward's FLOPs and show each layer's input and output shapes. Not
        # under FSDP (its root flattens the embedding's weight, so a forward outside the wrapper
        # fails) nor with `compile` set (the summary's forward would compile the model once more).
        trainer = self._trainer
        datamodule = getattr(trainer, "datamodule", None) if trainer is not None else None
        batch, length = getattr(datamodule, "batch_size", None), getattr(datamodule, "seq_len", None)
        if (
            self.example_input_array is None
            and isinstance(batch, int)
            and isinstance(length, int)
            and not isinstance(trainer.strategy, pl.strategies.FSDPStrategy)
            and self.hparams.get("compile", False) is False
        ):
            self.example_input_array = torch.zeros(batch, length, dtype=torch.long)

    def on_fit_start(self) -> None:
        self._metrics_in_float32()

    def on_validation_start(self) -> None:
        self._metrics_in_float32()

    def on_test_start(self) -> None:
        self._metrics_in_float32()

    def on_train_epoch_start(self) -> None:
        self.reset_state("train")

    def on_validation_epoch_start(self) -> None:
        self.reset_state("val")

    def on_test_epoch_start(self) -> None:
        self.reset_state("test")

    # -- steps ------------------------------------------------------------------------------
    def _step(self, batch: tuple[torch.Tensor, ...], stage: str) -> torch.Tensor:
        """A batch is (inputs, targets), or (inputs, targets, reset) for packed documents, whose
        targets are -100 where nothing is predicted (a document's first token, padding)."""
        inputs, targets, *rest = batch
        reset = rest[0] if rest else None
        logits, state = self(inputs, self._initial_state(stage, inputs.size(0)), reset)
        self._keep_state(stage, state)
        # Softmax in float32 whatever the compute dtype: the loss is a sum of many logs.
        flat_logits, flat_targets = logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1)
        if reset is None:
            loss = F.cross_entropy(flat_logits, flat_targets)
            tokens = targets.numel()
        else:
            # The mean over the predicted tokens; a window predicting none (a row of padding) adds 0.
            tokens = int((flat_targets != -100).sum())
            loss = F.cross_entropy(flat_logits, flat_targets, reduction="sum") / max(tokens, 1)
        self._record_step(stage, loss.detach(), inputs.size(0), tokens)
        return loss

    # Bookkeeping, not computation: under `compile` (which Lightning applies to the step methods
    # too) it runs eagerly, since Dynamo cannot trace Lightning's logging (it inspects the
    # compiled step method's signature).
    @torch.compiler.disable
    def _record_step(self, stage: str, loss: torch.Tensor, batch_size: int, tokens: int) -> None:
        metric = self.mean_nats[f"{stage}_nats"]
        metric.update(loss.float(), weight=tokens)
        on_step = stage == "train"
        # Every value is the mean over the processes (sync_dist), so a curve does not depend on
        # how many processes share the global batch: each process sees as many tokens, and the
        # mean of their losses is the loss whose gradient DDP averages. The training values are
        # per step (the epoch's mean is `train_bpc_epoch`, from the metric above).
        self.log(
            f"{stage}_loss",
            loss,
            on_step=on_step,
            on_epoch=not on_step,
            prog_bar=on_step,
            batch_size=batch_size,
            sync_dist=True,
        )
        if on_step:
            self.log(
                self.bits_name("train"),
                loss / math.log(2),
                on_step=True,
                on_epoch=False,
                prog_bar=True,
                sync_dist=True,
            )

    def _log_epoch_metrics(self, stage: str) -> None:
        metric = self.mean_nats[f"{stage}_nats"]
        if metric.update_count == 0:
            return
        nats = metric.compute()
        metric.reset()
        suffix = "_epoch" if stage == "train" else ""
        # compute() already reduced over processes; sync_dist only averages equal values.
        self.log(f"{self.bits_name(stage)}{suffix}", nats / math.log(2), prog_bar=stage != "train", sync_dist=True)
        self.log(f"{self.perplexity_name(stage)}{suffix}", torch.exp(nats), sync_dist=True)

    def training_step(self, batch, batch_idx):
        return self._step(batch, "train")

    def validation_step(self, batch, batch_idx):
        self._step(batch, "val")

    def test_step(self, batch, batch_idx):
        self._step(batch, "test")

    def predict_step(self, batch, batch_idx: int, dataloader_idx: int = 0) -> torch.Tensor:
        """Next-token log-probabilities for `trainer.predict`.

        A batch is token ids (B, L), or an `(inputs, targets)` pair as the data modules'
        loaders yield (the targets are not used). Returns float32 log-probabilities
        (B, L, vocab): entry [b, t] is the distribution of the token after `inputs[b, t]`.
        Every batch is read from a zero state (nothing is carried between batches).
        """
        tokens = batch[0] if isinstance(batch, (tuple, list)) else batch
        if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2 or tokens.is_floating_point():
            shape = tuple(tokens.shape) if isinstance(tokens, torch.Tensor) else type(tokens).__name__
            raise ValueError(
                f"SRULanguageModel.predict_step: a batch must be integer token ids of shape (B, L), got {shape}"
            )
        logits, _ = self(tokens)
        return torch.log_softmax(logits.float(), dim=-1)

    def on_train_epoch_end(self) -> None:
        self._log_epoch_metrics("train")

    def on_validation_epoch_end(self) -> None:
        self._log_epoch_metrics("val")

    def on_test_epoch_end(self) -> None:
        self._log_epoch_metrics("test")

    # -- optimisation -----------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # A mid-epoch resume continues the carried state, so its losses are the uninterrupted
        # run's. Under DDP each rank carries its own streams and only rank 0 writes the file,
        # so every rank's state is gathered into it. Lightning dumps a checkpoint on every
        # rank at the same point, which makes these collectives safe.
        stamp_format(checkpoint)
        state = self._carried.get("train")
        world_size = self.trainer.world_size
        if world_size > 1:
            if not self.trainer.strategy.reduce_boolean_decision(state is not None, all=True):
                return
            tensors = [state] if isinstance(state, torch.Tensor) else list(state)
            gathered = [_all_gather(tensor, world_size) for tensor in tensors]  # [tensor][rank]
            per_rank = [
                gathered[0][rank] if isinstance(state, torch.Tensor) else tuple(pieces[rank] for pieces in gathered)
                for rank in range(world_size)
            ]
        elif state is not None:
            per_rank = [_map_state(state, lambda tensor: tensor.cpu())]
        else:
            return
        checkpoint[CARRIED_STATE_KEY] = {"world_size": world_size, "per_rank": per_rank}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        trainer = self._trainer
        check_format(checkpoint, str(getattr(trainer, "ckpt_path", None) or "the checkpoint"))
        saved = checkpoint.get(CARRIED_STATE_KEY)
        if saved is not None:
            own = self._own_carried_state(saved)
            if own is not None:
                self._carried["train"] = own
        # A step budget filled in from the trainer belongs to this run (a resumed fit may run
        # more epochs): keep the freshly computed one instead of the checkpoint's.
        config = self.lr_scheduler_config
        if not isinstance(config, Mapping):
            return
        filled = [key for key in _TOTAL_STEP_KEYS if key in config and config[key] is None]
        if not filled:
            return
        for state in checkpoint.get("lr_schedulers", []):
            for key in (*filled, *_DERIVED_FROM_TOTAL_STEPS):
                state.pop(key, None)

    def configure_optimizers(self):
        optimizer = _build_from_config(self.optimizer_config, params=self.parameters())
        _make_eps_safe_for_float16(optimizer)
        if self.lr_scheduler_config is None:
            return optimizer
        if callable(self.lr_scheduler_config):
            return {"optimizer": optimizer, "lr_scheduler": self.lr_scheduler_config(optimizer=optimizer)}
        settings = dict(self.lr_scheduler_config)
        lightning_keys = {key: settings.pop(key) for key in _SCHEDULER_KEYS if key in settings}
        for key in _TOTAL_STEP_KEYS:
            if key in settings and settings[key] is None:
                settings[key] = self._total_optimizer_steps(settings.get("_target_"), key)
        scheduler = _build_from_config(settings, optimizer=optimizer)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, **lightning_keys}}

    def _total_optimizer_steps(self, target: Any, key: str) -> int | None:
        """The trainer's estimate of this run's optimizer steps; None (announced) when unbounded."""
        estimate = self.trainer.estimated_stepping_batches
        if math.isfinite(estimate):
            return max(1, int(estimate))
        if str(target).endswith("WarmupCosineLR"):
            from .schedules import FALLBACK_WARMUP_STEPS

            warmup = (self.lr_scheduler_config or {}).get("fallback_warmup_steps", FALLBACK_WARMUP_STEPS)
            rank_zero_info(
                "The number of optimizer steps is unknown (max_time or max_epochs=-1): the learning "
                f"rate warms up over {warmup} steps, then stays at its peak (set trainer.max_steps "
                "or trainer.max_epochs for the warm-up + cosine schedule)"
            )
            return None
        raise ValueError(
            f"SRULanguageModel: `model.lr_scheduler.{key}` is null (fill in the run's step count), but "
            "the run has no step limit (max_time or max_epochs=-1); set trainer.max_steps, or set "
            f"model.lr_scheduler.{key} to a number, or use the default WarmupCosineLR schedule"
        )


def _check_compile_setting(value: Any) -> None:
    if isinstance(value, bool):
        return
    # torch.compile's own list of modes (the names it accepts for `mode`).
    from torch._inductor import list_mode_options

    modes = tuple(list_mode_options())
    if not isinstance(value, str) or value not in modes:
        raise ValueError(
            f"SRULanguageModel: `model.compile` must be true, false or a torch.compile mode {modes}, got {value!r}"
        )


#: Adam-style `eps` below this is zero (or subnormal) in float16, where `sqrt(v) + eps` of a
#: parameter whose squared gradient underflowed then divides by zero.
FLOAT16_SAFE_EPS = 1e-4


def _make_eps_safe_for_float16(optimizer: torch.optim.Optimizer) -> None:
    """Raise `eps` of float16 parameter groups (`16-true`) to a value float16 represents."""
    for group in optimizer.param_groups:
        eps = group.get("eps")
        if not isinstance(eps, float) or eps >= FLOAT16_SAFE_EPS:
            continue
        if any(param.dtype == torch.float16 for param in group["params"]):
            group["eps"] = FLOAT16_SAFE_EPS
            rank_zero_info(
                f"{type(optimizer).__name__}: eps raised from {eps:g} to {FLOAT16_SAFE_EPS:g} for float16 "
                f"parameters ({eps:g} rounds to {float(torch.tensor(eps, dtype=torch.float16)):g} in float16, "
                "which turns the update of a parameter with a tiny gradient into inf/NaN)"
            )
