"""The transformers config of the language network: :class:`SRULightningConfig`.

Its fields are :class:`~sru_lightning.nn.configs.LanguageNetConfig`'s (one field each, same name,
same default; ``tests/hf/test_configuration.py`` compares them), so one object says what to build
for this package and for transformers. It reads the package's own ``config.json``
(:mod:`sru_lightning.nn.pretrained`: the network's arguments under `config`, beside the format's
header) as well as a flat transformers one, so ``AutoConfig.from_pretrained(folder)`` and
``sru_lightning.from_pretrained(folder)`` read the same file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import PreTrainedConfig

from sru_lightning.export.pretrained import MODEL_TYPE
from sru_lightning.nn.configs import LanguageNetConfig
from sru_lightning.nn.pretrained import CONFIG_FILE

__all__ = ["SRULightningConfig"]

#: The keys of the package's folder header that transformers has no use for (the format's own).
_FOLDER_HEADER_KEYS = ("format_name", "format_version", "architecture", "package_version", "manifest")


class SRULightningConfig(PreTrainedConfig):
    """The arguments of :class:`~sru_lightning.nn.LanguageNet` (SRU, SRU++ or LSTM layers: `rnn`)
    as a transformers config.

    Built from keywords (``SRULightningConfig(vocab_size=64, rnn="srupp", ...)``) or from a
    package folder's config.json, whose `config` object holds the same fields. `tokenizer` and
    `source` are what an export recorded (the token level; the checkpoint and step).
    """

    model_type = MODEL_TYPE

    vocab_size: int = 256
    rnn: str = "sru"
    embedding_dim: int = 128
    hidden_size: int = 256
    num_layers: int = 2
    dropout: float = 0.1
    rnn_dropout: float = 0.0
    tie_weights: bool = False
    sru_options: dict | None = None
    memory_length: int = 0
    time_shared_dropout: bool = False
    use_cache: bool = True
    tokenizer: dict | None = None
    source: dict | None = None

    def __post_init__(self, **kwargs: Any) -> None:
        # A package folder's config.json: the network's arguments are its `config` object (its
        # checked form: unknown or missing keys are refused by LanguageNetConfig.from_dict).
        network = kwargs.pop("config", kwargs.pop("network", None))  # `network`: the first format
        if isinstance(network, dict):
            try:
                fields = LanguageNetConfig.from_dict(network).to_dict()
            except ValueError as error:
                where = kwargs.get("name_or_path")
                if not where:
                    raise
                raise ValueError(f"cannot load {str(Path(where) / CONFIG_FILE)!r}: `config`: {error}") from None
            for name, value in fields.items():
                setattr(self, name, value)
        for key in _FOLDER_HEADER_KEYS:
            kwargs.pop(key, None)
        kwargs.pop("tie_word_embeddings", None)
        super().__post_init__(**kwargs)

    @property
    def tie_word_embeddings(self) -> bool:
        """transformers' name of `tie_weights` (the output layer shares the embedding matrix)."""
        return bool(self.tie_weights)

    @property
    def num_hidden_layers(self) -> int:
        return self.num_layers

    def network_config(self) -> LanguageNetConfig:
        """The :class:`LanguageNetConfig` of these fields (what builds the network)."""
        return LanguageNetConfig(**{name: getattr(self, name) for name in LanguageNetConfig.field_names()})
