"""The transformers causal LM over the package's language network: :class:`SRULightningForCausalLM`.

The layers are the package's own (:class:`~sru_lightning.nn.LanguageNet`: embedding, SRU / SRU++
/ LSTM layers, output layer); this module gives them transformers' shape at the edge:
``forward(input_ids, attention_mask, cache, labels) -> logits, loss, cache``, ``generate``
through ``GenerationMixin``, ``from_pretrained`` / ``save_pretrained`` of the package's folder.

* Parameter names are the network's (``embedding.weight``, ``rnn.rnn_lst.0.weight``, ...): the
  network's modules are the model's own children, so ``model.safetensors`` of an export loads
  as it is, and a module another library swaps in (PEFT's LoRA layers) is the one the network
  calls.
* The cache is :class:`~sru_lightning.hf.cache_sru_lightning.RecurrentStateCache`, the
  recurrent state of every layer: its size does not grow with the text.
* Padding: a row's state restarts at its first unmasked token, with the rules packed documents
  already follow (``reset``: SRU restarts its recurrence there, SRU++ also keeps its attention and
  memory inside each document); nn.LSTM has no per-step restart, so its rows are read from
  their first token, grouped by where that is. Left padding (what ``generate`` needs) thus gives
  each row what the prompt alone gives; positions before a row's first token have no meaning.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from sru_lightning.export.pretrained import transformers_keys
from sru_lightning.nn.carried_state import map_state
from sru_lightning.nn.language_net import LanguageNet
from sru_lightning.nn.pretrained import write_pretrained

from .cache_sru_lightning import BATCH_DIM, RecurrentStateCache
from .configuration_sru_lightning import SRULightningConfig

__all__ = ["SRULightningForCausalLM", "SRULightningPreTrainedModel"]


class SRULightningPreTrainedModel(PreTrainedModel):
    config_class = SRULightningConfig
    config: SRULightningConfig
    base_model_prefix = ""
    main_input_name = "input_ids"
    supports_gradient_checkpointing = False
    _no_split_modules = ["SRU", "SRUpp", "LSTM"]
    # Stateful: assisted and contrastive decoding would need a state that can be cut back.
    _is_stateful = True

    def _init_weights(self, module: torch.nn.Module) -> None:
        """Nothing: the network's constructor initialises its own parameters (the init it trains with)."""

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the cache is the recurrent state the forward returns, not a key/value cache

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | os.PathLike, *args: Any, **kwargs: Any):
        """transformers' ``from_pretrained``; a local folder is first read by the package's own
        reader, so a foreign, damaged or mismatched file (config.json of another model type or
        with an unknown key, a missing or truncated model.safetensors, a tokenizer.json that does
        not fit the network) is refused in one line naming it (a ValueError)."""
        folder = Path(pretrained_model_name_or_path).expanduser()
        if folder.is_dir():
            from sru_lightning.export import ExportError
            from sru_lightning.export.pretrained import from_pretrained

            try:
                from_pretrained(folder)
            except ExportError as error:
                raise ValueError(f"{cls.__name__}.from_pretrained: {error}") from None
        return super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)


class SRULightningForCausalLM(SRULightningPreTrainedModel, GenerationMixin):
    """Next-token prediction with the package's :class:`~sru_lightning.nn.LanguageNet`.

    ``forward(input_ids (B, L), attention_mask (B, past + L) or (B, L), cache, labels (B, L))``
    returns ``CausalLMOutputWithPast(loss, logits (B, L, vocab), cache)``; `labels` are shifted
    inside (position t predicts label t + 1; -100 is ignored). :attr:`network` is the
    LanguageNet itself, sharing every module with the model.
    """

    _tied_weights_keys = {"decoder.weight": "embedding.weight"}

    def __init__(self, config: SRULightningConfig) -> None:
        super().__init__(config)
        network = LanguageNet(**config.network_config().to_dict())
        for name, module in network.named_children():
            self.add_module(name, module)
        # One dict of children for both: a module set on the model is the one the network calls.
        network._modules = self._modules
        self.__dict__["_network"] = network  # not a child: its modules are the model's own
        self.post_init()

    @property
    def network(self) -> LanguageNet:
        return self.__dict__["_network"]

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.embedding

    def set_input_embeddings(self, value: torch.nn.Module) -> None:
        self.embedding = value

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.decoder

    def set_output_embeddings(self, value: torch.nn.Module) -> None:
        self.decoder = value

    # -- forward ------------------------------------------------------------------------------
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: Tensor | None = None,
        cache: RecurrentStateCache | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        return_dict: bool | None = None,
        inputs_embeds: Tensor | None = None,
        logits_to_keep: int = 0,
        **kwargs: Any,
    ) -> CausalLMOutputWithPast | tuple:
        if inputs_embeds is not None or input_ids is None:
            raise ValueError(
                f"{type(self).__name__}: `input_ids` (B, L) token ids are required and `inputs_embeds` is not "
                f"supported, got input_ids={None if input_ids is None else tuple(input_ids.shape)} and "
                f"inputs_embeds={None if inputs_embeds is None else tuple(inputs_embeds.shape)}"
            )
        if input_ids.dim() != 2:
            raise ValueError(
                f"{type(self).__name__}: `input_ids` must be (batch, length), got {tuple(input_ids.shape)}"
            )
        if cache is not None and not isinstance(cache, RecurrentStateCache):
            raise ValueError(
                f"{type(self).__name__}: `cache` must be a RecurrentStateCache (the recurrent state this model "
                f"returned), got {type(cache).__name__}"
            )
        use_cache = use_cache if use_cache is not None else (self.config.use_cache and not self.training)
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        state = None if cache is None else cache.state
        starts, window = _restarts(attention_mask, input_ids.shape[1])
        tokens = input_ids if window is None else input_ids.masked_fill(window == 0, 0)  # padding ids never read
        self._check_ids(tokens)
        if starts is None:
            logits, state = self.network(tokens, state)
        elif self.network.accepts_document_boundaries:
            logits, state = self.network(tokens, state, reset=starts)
        else:
            logits, state = self._rows_from_their_starts(tokens, state, starts)
        if use_cache:
            cache = (cache if cache is not None else RecurrentStateCache()).update(state, input_ids.shape[1])
        else:
            cache = None
        if logits_to_keep:
            logits = logits[:, -logits_to_keep:]
        loss = None
        if labels is not None:
            loss = self.loss_function(
                logits=logits.contiguous(),  # the network's logits are a transposed view
                labels=labels,
                vocab_size=self.config.vocab_size,
                num_items_in_batch=kwargs.get("num_items_in_batch"),
            )
        if not return_dict:
            output = (logits, cache)
            return (loss, *output) if loss is not None else output
        return CausalLMOutputWithPast(loss=loss, logits=logits, cache=cache)

    def _check_ids(self, tokens: Tensor) -> None:
        # One reduction of the whole batch (a generation step pays for it every token: aminmax is
        # about a quarter of the cost of comparing and reducing twice), which also words the refusal.
        if tokens.numel() == 0:
            return
        low, high = (int(value) for value in torch.aminmax(tokens))
        if low < 0 or high >= self.config.vocab_size:
            raise ValueError(
                f"{type(self).__name__}: `input_ids` must be in [0, {self.config.vocab_size}) where the attention "
                f"mask is 1, got ids from {low} to {high}"
            )

    def _rows_from_their_starts(self, tokens: Tensor, state: Any, starts: Tensor) -> tuple[Tensor, Any]:
        """The network over each row from its last start in `starts` (from zeros there), rows that
        start at the same position read together; a row without a start reads on from `state`.
        Logits before a row's start are zeros."""
        batch, length = tokens.shape
        positions = torch.arange(length, device=tokens.device).expand(batch, length)
        offsets = torch.where(starts, positions, torch.zeros_like(positions)).amax(dim=1).tolist()
        restarted = starts.any(dim=1).tolist()
        groups: dict[tuple[int, bool], list[int]] = {}
        for row, key in enumerate(zip(offsets, restarted)):
            groups.setdefault(key, []).append(row)
        logits, final = None, None
        for (offset, restart), rows in groups.items():
            index = torch.tensor(rows, device=tokens.device)
            rows_state = None
            if state is not None and not restart:
                rows_state = map_state(state, lambda tensor, index=index: tensor.index_select(BATCH_DIM, index))
            rows_logits, rows_final = self.network(tokens.index_select(0, index)[:, offset:], rows_state)
            if logits is None:
                logits = rows_logits.new_zeros(batch, length, rows_logits.shape[-1])
                final = map_state(rows_final, lambda tensor: tensor.new_zeros(*_with_batch(tensor.shape, batch)))
            logits[index, offset:] = rows_logits
            final = _put_rows(final, rows_final, index)
        return logits, final

    # -- generation ---------------------------------------------------------------------------
    def generate(self, *args: Any, **kwargs: Any):
        """transformers' ``generate``, run under ``torch.inference_mode`` (as the package's own
        decoding is) rather than ``no_grad`` alone: a step of a small recurrent model is short
        enough that autograd's bookkeeping of every tensor is a fifth of it on a CPU (``bench hf``).
        The ids it returns are inference tensors, like everything decoding makes."""
        with torch.inference_mode():
            return super().generate(*args, **kwargs)

    def prepare_inputs_for_generation(
        self,
        input_ids: torch.LongTensor,
        cache: RecurrentStateCache | None = None,
        attention_mask: Tensor | None = None,
        is_first_iteration: bool | None = False,
        next_sequence_length: int | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """The inputs of the next forward: transformers' own for the prompt; for each later step
        the new token(s) alone, the cache and no attention mask (the padding was read with the
        prompt, and each step reads on from the state). The later steps skip transformers' general
        preparation (position ids, 4-D masks, copies of the ids), which this model does not read:
        about 50 microseconds a token against 5 (a step of the default model at batch 1 is about 1 ms
        on a CPU core, ``bench hf``)."""
        if cache is not None and not is_first_iteration and next_sequence_length is not None:
            model_inputs = {key: value for key, value in kwargs.items() if key not in _NOT_FORWARDED}
            # A row that has ended (an `eos_token_id` was drawn) is fed the padding id, which lies
            # past the vocabulary; its logits are discarded, so any id in range serves.
            new_ids = input_ids[:, -next_sequence_length:].clamp(max=self.config.vocab_size - 1)
            model_inputs.update(input_ids=new_ids, cache=cache, attention_mask=None)
            return model_inputs
        model_inputs = super().prepare_inputs_for_generation(
            input_ids,
            next_sequence_length=next_sequence_length,
            cache=cache,
            attention_mask=attention_mask,
            is_first_iteration=is_first_iteration,
            **kwargs,
        )
        if cache is not None and not is_first_iteration:
            model_inputs["attention_mask"] = None
        return model_inputs

    # -- the package's folder -----------------------------------------------------------------
    def save_pretrained(self, save_directory: str | os.PathLike, *args: Any, **kwargs: Any) -> None:
        """Write the package's folder format (:mod:`sru_lightning.nn.pretrained`: config.json and
        model.safetensors) into `save_directory`, readable by ``AutoModelForCausalLM.from_pretrained``
        and ``sru_lightning.from_pretrained``. The tokenizer is saved by its own ``save_pretrained``
        into the same folder. transformers' other saving options (sharding, push_to_hub) are not
        supported and are refused by name."""
        # Options that ask for nothing but what this writes (safetensors, from the main process).
        harmless = {"is_main_process": True, "safe_serialization": True}
        options = sorted(
            name for name, value in kwargs.items() if value not in (None, False) and harmless.get(name) is not value
        )
        if args or options:
            raise ValueError(
                f"{type(self).__name__}.save_pretrained: only `save_directory` is supported, got "
                f"{len(args)} more positional argument(s) and {options}"
            )
        extra = {"tokenizer": self.config.tokenizer, "source": dict(self.config.source or {}), **transformers_keys()}
        write_pretrained(self.network, Path(save_directory), extra=extra)


#: ``generate``'s model kwargs a decoding step leaves out: the labels and the prompt's embeddings
#: (transformers' preparation drops them after the prompt too), positions (this model reads none).
_NOT_FORWARDED = frozenset({"labels", "position_ids", "token_type_ids", "inputs_embeds"})


def _restarts(attention_mask: Tensor | None, length: int) -> tuple[Tensor | None, Tensor | None]:
    """(starts, window) of an attention mask (B, past + length) or (B, length): `window` the mask
    of the `length` new positions, `starts` (B, length) True where a row's tokens begin after
    padding (None when no row has one); (None, None) without a mask or one of all ones."""
    if attention_mask is None:
        return None, None
    if attention_mask.dim() != 2 or attention_mask.shape[1] < length:
        raise ValueError(
            f"SRULightningForCausalLM: `attention_mask` must be (batch, past + length) with 1 on tokens and 0 on "
            f"padding, got shape {tuple(attention_mask.shape)} for {length} new position(s)"
        )
    mask = attention_mask != 0
    if bool(mask.all()):
        return None, None
    previous = torch.cat([mask.new_ones(mask.shape[0], 1), mask[:, :-1]], dim=1)
    starts = (mask & ~previous)[:, -length:]
    return (starts if bool(starts.any()) else None), mask[:, -length:]


def _with_batch(shape: torch.Size, batch: int) -> tuple[int, ...]:
    return (*shape[:BATCH_DIM], batch, *shape[BATCH_DIM + 1 :])


def _put_rows(into: Any, rows_state: Any, index: Tensor) -> Any:
    if isinstance(into, Tensor):
        return into.index_copy(BATCH_DIM, index, rows_state)
    return tuple(whole.index_copy(BATCH_DIM, index, part) for whole, part in zip(into, rows_state))
