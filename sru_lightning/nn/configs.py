"""What builds each architecture, as one config object per class: the constructor's arguments a
folder of weights records (:mod:`sru_lightning.nn.pretrained`) and rebuilds the module from.

A config is a frozen dataclass whose fields are the constructor's keyword arguments with the
same defaults (``tests/nn/test_configs.py`` compares them with the signatures), less the
arguments a JSON file cannot describe (``custom_m``, a module). ``Config(**fields)`` is cheap and
checks nothing; the module's constructor checks the values when it is built from one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

__all__ = [
    "ArchitectureConfig",
    "CONFIGS",
    "LanguageNetConfig",
    "SRUCellConfig",
    "SRUConfig",
    "SRUppConfig",
]


@dataclasses.dataclass(frozen=True)
class ArchitectureConfig:
    """The base of the configs: the class name it builds (:attr:`architecture`), and its
    conversions to and from the plain mapping written in ``config.json``."""

    #: The class this config builds (``config.json``'s `architecture`).
    architecture: ClassVar[str] = ""

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(field.name for field in dataclasses.fields(cls))

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> ArchitectureConfig:
        """The config of a mapping read from a file. Raises ValueError in one line naming the
        keys it does not know or misses (a config of another version or program)."""
        names = cls.field_names()
        unknown = sorted(set(values) - set(names))
        if unknown:
            raise ValueError(
                f"unknown key(s) {', '.join(map(repr, unknown))} for a {cls.architecture} "
                f"(its keys: {', '.join(names)})"
            )
        required = [field.name for field in dataclasses.fields(cls) if field.default is dataclasses.MISSING]
        missing = [name for name in required if name not in values]
        if missing:
            raise ValueError(f"key(s) {', '.join(map(repr, missing))} missing: a {cls.architecture} needs them")
        return cls(**values)

    @classmethod
    def from_arguments(cls, arguments: Mapping[str, Any]) -> ArchitectureConfig:
        """The config of a constructor call, from its arguments by name (the constructor's
        ``locals()`` before it does anything else); arguments that are no field are left out."""
        return cls(**{name: arguments[name] for name in cls.field_names()})

    def to_dict(self) -> dict[str, Any]:
        """The fields as a plain mapping (a deep copy)."""
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class SRUCellConfig(ArchitectureConfig):
    """The arguments of :class:`~sru_lightning.nn.SRUCell` (all but ``custom_m``)."""

    architecture: ClassVar[str] = "SRUCell"

    input_size: int
    hidden_size: int
    dropout: float = 0.0
    rnn_dropout: float = 0.0
    bidirectional: bool = False
    n_proj: int = 0
    use_tanh: bool = False
    highway_bias: float = 0.0
    has_skip_term: bool = True
    layer_norm: bool = False
    rescale: bool = True
    v1: bool = False
    amp_recurrence_fp16: bool = False
    normalize_after: bool = False
    weight_c_init: float | None = None
    recurrence_policy: str = "auto"
    batch_first: bool = False


@dataclasses.dataclass(frozen=True)
class SRUConfig(ArchitectureConfig):
    """The arguments of :class:`~sru_lightning.nn.SRU` (all but ``custom_m``)."""

    architecture: ClassVar[str] = "SRU"

    input_size: int
    hidden_size: int
    num_layers: int = 2
    dropout: float = 0.0
    rnn_dropout: float = 0.0
    bidirectional: bool = False
    projection_size: int = 0
    use_tanh: bool = False
    layer_norm: bool = False
    highway_bias: float = 0.0
    has_skip_term: bool = True
    rescale: bool = False
    v1: bool = False
    nn_rnn_compatible_return: bool = False
    proj_input_to_hidden_first: bool = False
    amp_recurrence_fp16: bool = False
    normalize_after: bool = False
    weight_c_init: float | None = None
    batch_first: bool = False
    recurrence_policy: str = "auto"


@dataclasses.dataclass(frozen=True)
class SRUppConfig(ArchitectureConfig):
    """The arguments of :class:`~sru_lightning.nn.SRUpp`."""

    architecture: ClassVar[str] = "SRUpp"

    input_size: int
    hidden_size: int
    proj_size: int
    num_layers: int = 2
    dropout: float = 0.0
    attn_dropout: float = 0.0
    num_heads: int = 1
    bidirectional: bool = False
    layer_norm: bool = False
    normalize_after: bool = False
    attn_layer_norm: bool = True
    highway_bias: float = -2.0
    attention_every_n_layers: int = 1
    attention_last_n_layers: int = -1
    rescale: bool = False
    nn_rnn_compatible_return: bool = False
    proj_input_to_hidden_first: bool = False
    weight_c_init: float = 1.0
    batch_first: bool = False
    recurrence_policy: str = "auto"


@dataclasses.dataclass(frozen=True)
class LanguageNetConfig(ArchitectureConfig):
    """The arguments of :class:`~sru_lightning.nn.LanguageNet`, the language network (SRU, SRU++
    or LSTM layers: `rnn`); :attr:`LanguageNet.config` is its :meth:`to_dict`."""

    architecture: ClassVar[str] = "LanguageNet"

    vocab_size: int
    rnn: str = "sru"
    embedding_dim: int = 128
    hidden_size: int = 256
    num_layers: int = 2
    dropout: float = 0.1
    rnn_dropout: float = 0.0
    tie_weights: bool = False
    sru_options: dict[str, Any] | None = None
    memory_length: int = 0
    time_shared_dropout: bool = False


#: The config of each architecture a folder can hold, by class name.
CONFIGS: dict[str, type[ArchitectureConfig]] = {
    config.architecture: config for config in (SRUCellConfig, SRUConfig, SRUppConfig, LanguageNetConfig)
}
