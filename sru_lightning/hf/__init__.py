"""The language network in the Hugging Face ecosystem: transformers classes for the folders that
``python -m sru_lightning export format=hf`` writes.

* :class:`SRULightningConfig` (``model_type`` "sru_lightning"), the network's arguments;
* :class:`SRULightningForCausalLM`, the causal LM (``generate``, ``pipeline("text-generation")``,
  the evaluation harness, PEFT) over the package's own layers;
* :class:`RecurrentStateCache`, its generation cache: the recurrent state of every layer, of the
  same size after any number of tokens.

Importing this module registers them with ``AutoConfig``, ``AutoModelForCausalLM`` and
``AutoTokenizer`` (:func:`register`); ``import sru_lightning`` does so too, as soon as
transformers is imported (before or after it), without importing transformers itself. The
layers (``sru_lightning.nn``) never import transformers.
"""

from __future__ import annotations

from .cache_sru_lightning import RecurrentStateCache
from .configuration_sru_lightning import SRULightningConfig
from .modeling_sru_lightning import SRULightningForCausalLM, SRULightningPreTrainedModel

__all__ = [
    "RecurrentStateCache",
    "SRULightningConfig",
    "SRULightningForCausalLM",
    "SRULightningPreTrainedModel",
    "register",
]


def register() -> None:
    """Register the classes with transformers' Auto classes (once; a second call does nothing)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

    AutoConfig.register(SRULightningConfig.model_type, SRULightningConfig, exist_ok=True)
    AutoModelForCausalLM.register(SRULightningConfig, SRULightningForCausalLM, exist_ok=True)
    AutoTokenizer.register(SRULightningConfig, fast_tokenizer_class=PreTrainedTokenizerFast, exist_ok=True)


register()
