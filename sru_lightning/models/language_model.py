"""The training of a language network: truncated backpropagation through time, its metrics,
its carried state and its optimizer (the network itself is :mod:`sru_lightning.nn.language_net`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_warn
from torch import nn
from torchmetrics import MeanMetric

from sru_lightning._lightning_compat import loggers_write_this_step
from sru_lightning.nn.carried_state import CarriedState
from sru_lightning.nn.language_net import RNN_TYPES, LanguageNet, build_network, target_of

from .checkpoint_format import check_format, stamp_format
from .optimization import DEFAULT_OPTIMIZER, check_factory_setting, configure_optimizers, drop_filled_step_counts

__all__ = ["CARRIED_STATE_KEY", "DEFAULT_OPTIMIZER", "RNN_TYPES", "SRULanguageModel"]

STAGES = ("train", "val", "test")
# Metric names per token unit: bits per character / per word / per subword token, and the
# matching perplexity. Bits per byte (`{stage}_bpb`) compare across units and vocabularies.
BITS_NAMES = {"char": "bpc", "word": "bpw", "token": "bpt"}
PERPLEXITY_NAMES = {"char": "ppl", "word": "word_ppl", "token": "token_ppl"}
# Checkpoint entry holding every rank's carried training state: {"world_size": W, "per_rank": [...]}.
CARRIED_STATE_KEY = "carried_train_state"


def _plain(value: Any) -> Any:
    """OmegaConf containers (as Hydra passes them) -> builtin dicts/lists; others unchanged."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf
    except ImportError:  # pragma: no cover - hydra-core is a dependency
        return value
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    return value


def _network(net: Any) -> nn.Module:
    """`net` itself, or the network a mapping describes (a saved `_target_` config, or the
    arguments of :class:`sru_lightning.nn.LanguageNet`)."""
    if isinstance(net, nn.Module):
        return net
    if isinstance(net, Mapping):
        config = dict(_plain(net))
        config.setdefault("_target_", "sru_lightning.nn.LanguageNet")
        return build_network(config)
    raise ValueError(
        "SRULanguageModel: `net` must be a torch.nn.Module (e.g. sru_lightning.nn.LanguageNet) or a mapping of "
        f"its arguments, got {type(net).__name__}"
    )


def _saved_config(net: nn.Module) -> dict[str, Any] | None:
    """What the checkpoint records to rebuild `net`: its constructor arguments, and its `_target_`
    unless it is a LanguageNet (so the saved `net` is what LightningCLI reads as the arguments of
    its default `--model.net` class)."""
    config = getattr(net, "config", None)
    if not isinstance(config, Mapping):
        return None
    if type(net) is LanguageNet:
        return dict(config)
    return {"_target_": target_of(net), **config}


class SRULanguageModel(pl.LightningModule):
    """Next-token training of a language network with truncated backpropagation through time.

    The module holds the training only: the step, its metrics, the state carried between
    batches and the optimizer wiring. The network is handed in (as Hydra builds it from
    ``model.net``) and runs without Lightning.

    Args:
        net: the network, ``forward(tokens (B, L), state=None, reset=None) -> (logits (B, L, vocab),
            state)``: a :class:`sru_lightning.nn.LanguageNet`, or a mapping of its arguments (or a
            saved config with ``_target_``), from which it is built. (Annotated as a module only, so
            LightningCLI offers `--model.net` as a class and reports a refused value in one line.)
        carry_hidden: keep the (detached) final state of each batch as the initial state
            of the next one; the data streams are contiguous. For SRU++ the state also holds
            each layer's last `memory_length` inputs, which the next batch attends to. Reset at
            every epoch start and whenever the batch shape changes.
        token_unit: what one token is, "char" (characters or bytes), "word" or "token" (a BPE
            subword); it names the metrics: `{stage}_bpc` / `{stage}_ppl` for characters,
            `{stage}_bpw` / `{stage}_word_ppl` for words, `{stage}_bpt` / `{stage}_token_ppl`
            for subwords (the data module's `token_unit`). With a datamodule that has
            `token_byte_lengths()`, `{stage}_bpb` (bits per UTF-8 byte) is logged too.
        optimizer: a `_target_` mapping (e.g. {"_target_": "torch.optim.AdamW", "lr": 3e-3})
            or a callable taking `params` (or `named_params`, the network's named parameters);
            see :mod:`sru_lightning.models.optimization`.
        lr_scheduler: None, or a `_target_` mapping / callable taking `optimizer`; Lightning
            keys (interval, frequency, monitor) may sit in the mapping. `total_steps` or
            `T_max` set to null are filled with the trainer's estimated number of steps.
        compile: run the model compiled with `torch.compile` in `fit`, `validate` and `test`:
            false (eager), true (torch.compile's default mode) or a mode name ("max-autotune",
            "reduce-overhead", ...). It changes how the model runs, not what it computes, so
            its weights load into a model with any other setting; `for_trainer()` applies it.

    The checkpoint's hyperparameters hold the network's constructor arguments under `net` (with
    its ``_target_`` when it is not a LanguageNet), so ``SRULanguageModel(**hyper_parameters)``
    rebuilds the model.
    """

    #: tokens (B, L) and logits (B, L, vocab): time is the second axis (as read by
    #: :func:`sru_lightning.nn.streaming.stream_chunks`).
    batch_first = True

    def __init__(
        self,
        net: nn.Module,
        carry_hidden: bool = True,
        optimizer: Mapping[str, Any] | Callable | None = None,
        lr_scheduler: Mapping[str, Any] | Callable | None = None,
        token_unit: str = "char",
        compile: bool | str = False,
    ) -> None:
        super().__init__()
        if not isinstance(carry_hidden, bool):
            raise ValueError(f"SRULanguageModel: `model.carry_hidden` must be true or false, got {carry_hidden!r}")
        _check_compile_setting(compile)
        for name, value in (("optimizer", optimizer), ("lr_scheduler", lr_scheduler)):
            check_factory_setting("SRULanguageModel", name, _plain(value))
        if token_unit not in BITS_NAMES:
            raise ValueError(f"SRULanguageModel: `token_unit` must be one of {tuple(BITS_NAMES)}, got {token_unit!r}")
        net = _network(net)
        # Plain containers in the hyperparameters keep checkpoints loadable with weights_only=True.
        optimizer, lr_scheduler = (_plain(value) for value in (optimizer, lr_scheduler))
        self.save_hyperparameters(ignore=["net"])
        self.hparams["net"] = _saved_config(net)
        self.net = net
        self.carry_hidden = carry_hidden
        self.token_unit = token_unit
        self.optimizer_config = optimizer if optimizer is not None else dict(DEFAULT_OPTIMIZER)
        self.lr_scheduler_config = lr_scheduler

        # Token-weighted mean cross-entropy (nats); bpc and perplexity derive from it.
        self.mean_nats = nn.ModuleDict({f"{stage}_nats": MeanMetric() for stage in STAGES})
        # Byte-weighted: the summed cross-entropy over the summed UTF-8 bytes of the targets.
        self.nats_per_byte = nn.ModuleDict({f"{stage}_nats": MeanMetric() for stage in STAGES})
        # (vocab,) UTF-8 bytes per token id, from the datamodule's `token_byte_lengths()` at
        # setup; None (no bits per byte) without one. Not saved: the data gives it.
        self.register_buffer("token_bytes", None, persistent=False)
        self.carried = CarriedState(enabled=carry_hidden)
        # The training step's values logged only where they are read (on_train_batch_end).
        self._unlogged_step_values: dict[str, torch.Tensor] = {}

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
        """Whether batches of packed documents (a `reset` flag per token) can be read: the network's
        own answer (:attr:`sru_lightning.nn.LanguageNet.accepts_document_boundaries`)."""
        return bool(getattr(self.net, "accepts_document_boundaries", False))

    def forward(
        self, tokens: torch.Tensor, state: Any = None, reset: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, Any]:
        """The network's forward: tokens (B, L) -> logits (B, L, vocab), final recurrent state;
        `reset` (B, L) marks the first token of each packed document."""
        if reset is None:
            return self.net(tokens, state)
        return self.net(tokens, state, reset)

    # -- metric names -----------------------------------------------------------------------
    def bits_name(self, stage: str) -> str:
        """Name of the bits-per-token metric of `stage`: e.g. `val_bpc`, or `val_bpw` for words."""
        return f"{stage}_{BITS_NAMES[self.token_unit]}"

    def perplexity_name(self, stage: str) -> str:
        """Name of the perplexity metric of `stage`: e.g. `val_ppl`, or `val_word_ppl` for words."""
        return f"{stage}_{PERPLEXITY_NAMES[self.token_unit]}"

    # -- state carry ------------------------------------------------------------------------
    def reset_state(self, stage: str | None = None) -> None:
        """Forget the carried state of one stage (or all)."""
        self.carried.reset(stage)

    def _metrics_in_float32(self) -> None:
        # `16-true`/`bf16-true` cast the whole module, metric states included; a running sum
        # of thousands of losses in bf16 would be off in the second digit.
        for metric in [*self.mean_nats.values(), *self.nats_per_byte.values()]:
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
        lengths = getattr(datamodule, "token_byte_lengths", None)
        lengths = torch.as_tensor(lengths(), dtype=torch.long) if callable(lengths) else None
        vocab_size = getattr(self.net, "vocab_size", None)
        usable = lengths is not None and lengths.dim() == 1 and vocab_size in (None, lengths.numel())
        self.token_bytes = lengths.to(self.device) if usable else None

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
        logits, state = self(inputs, self.carried.initial(stage, inputs.size(0), self.device), reset)
        self.carried.keep(stage, state)
        # Softmax in float32 whatever the compute dtype: the loss is a sum of many logs.
        flat_logits, flat_targets = logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1)
        if reset is None:
            loss = F.cross_entropy(flat_logits, flat_targets)
            tokens = targets.numel()
        else:
            # The mean over the predicted tokens; a window predicting none (a row of padding) adds 0.
            tokens = int((flat_targets != -100).sum())
            loss = F.cross_entropy(flat_logits, flat_targets, reduction="sum") / max(tokens, 1)
        target_bytes = None
        if self.token_bytes is not None:  # ignored targets (-100) count no bytes
            target_bytes = torch.where(flat_targets >= 0, self.token_bytes[flat_targets.clamp(min=0)], 0).sum()
        self._record_step(stage, loss.detach(), inputs.size(0), tokens, target_bytes)
        return loss

    # Bookkeeping, not computation: under `compile` (which Lightning applies to the step methods
    # too) it runs eagerly, since Dynamo cannot trace Lightning's logging (it inspects the
    # compiled step method's signature).
    @torch.compiler.disable
    def _record_step(
        self, stage: str, loss: torch.Tensor, batch_size: int, tokens: int, target_bytes: torch.Tensor | None = None
    ) -> None:
        metric = self.mean_nats[f"{stage}_nats"]
        metric.update(loss.float(), weight=tokens)
        on_step = stage == "train"
        bits_per_byte = None
        if target_bytes is not None:  # a window predicting no byte (padding) weighs 0
            nats_per_byte = loss.float() * tokens / target_bytes.float().clamp(min=1)
            self.nats_per_byte[f"{stage}_nats"].update(nats_per_byte, weight=target_bytes.float())
            bits_per_byte = nats_per_byte / math.log(2)
        # Every value is the mean over the processes (sync_dist), so a curve does not depend on
        # how many processes share the global batch: each process sees as many tokens, and the
        # mean of their losses is the loss whose gradient DDP averages. The training values are
        # per step (the epoch's mean is `train_bpc_epoch`, from the metric above), logged in
        # on_train_batch_end, only at the steps whose values are read (see there).
        if on_step:
            self._unlogged_step_values = {"train_loss": loss, self.bits_name("train"): loss / math.log(2)}
            if bits_per_byte is not None:
                self._unlogged_step_values["train_bpb"] = bits_per_byte
        else:
            self.log(f"{stage}_loss", loss, on_step=False, on_epoch=True, batch_size=batch_size, sync_dist=True)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        """Log the step's loss and bits per token (and per byte) where something reads them: at
        the steps the loggers write, at a stop, and at the steps a fit may end on (the epoch's
        last batch, `max_steps`), so the loggers and the fit's final metrics get the same values
        as from logging every step. Each `self.log` costs Lightning a fraction of a millisecond
        (and a collective under DDP); between those steps the progress bar shows the last logged
        values.
        """
        values, self._unlogged_step_values = self._unlogged_step_values, {}
        trainer = self.trainer
        ends_here = (
            trainer.fit_loop.epoch_loop.batch_progress.is_last_batch
            or 0 < (trainer.max_steps or 0) <= trainer.global_step
            or trainer.should_stop
        )
        if not values or not (ends_here or loggers_write_this_step(trainer)):
            return
        for name, value in values.items():
            self.log(name, value, on_step=True, on_epoch=False, prog_bar=name != "train_bpb", sync_dist=True)

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
        per_byte = self.nats_per_byte[f"{stage}_nats"]
        if per_byte.update_count > 0:
            self.log(f"{stage}_bpb{suffix}", per_byte.compute() / math.log(2), sync_dist=True)
            per_byte.reset()

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

    # -- checkpoints and optimisation -------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # A mid-epoch resume continues the carried state, so its losses are the uninterrupted
        # run's. Under DDP each rank carries its own streams and only rank 0 writes the file,
        # so every rank's state is gathered into it. Lightning dumps a checkpoint on every
        # rank at the same point, which makes these collectives safe.
        stamp_format(checkpoint)
        world_size = self.trainer.world_size
        if world_size > 1:
            if not self.trainer.strategy.reduce_boolean_decision("train" in self.carried, all=True):
                return
        entry = self.carried.checkpoint_entry("train", world_size)
        if entry is not None:
            checkpoint[CARRIED_STATE_KEY] = entry

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        trainer = self._trainer
        check_format(checkpoint, str(getattr(trainer, "ckpt_path", None) or "the checkpoint"))
        saved = checkpoint.get(CARRIED_STATE_KEY)
        # Only a resumed fit continues the training stream; evaluation starts its own.
        if saved is not None and (trainer is None or trainer.state.fn == TrainerFn.FITTING):
            world_size, rank = (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)
            if not self.carried.restore(saved, "train", world_size, rank):
                rank_zero_warn(
                    f"The checkpoint carries the recurrent state of {saved['world_size']} process(es), this fit "
                    f"runs {world_size}: the rest of the interrupted epoch starts from a zero state, so its losses "
                    "differ from those of an uninterrupted run"
                )
        drop_filled_step_counts(self.lr_scheduler_config, checkpoint)

    def configure_optimizers(self):
        trainer = self._trainer
        return configure_optimizers(
            self.net,
            self.optimizer_config,
            self.lr_scheduler_config,
            step_estimate=lambda: trainer.estimated_stepping_batches if trainer is not None else math.inf,
            strategy=getattr(trainer, "strategy", None),
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
