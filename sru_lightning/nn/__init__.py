"""Drop-in SRU layers: ``SRUCell`` and ``SRU`` with the keyword names of the ``sru`` package
and the calling convention of ``nn.LSTM``; state dicts of ``sru.SRU``/``sru.SRUCell`` load
directly. ``SRUpp`` (SRU++, attention inside the input projection) loads the state dicts of
the ``sru`` 3.0.0-dev ``SRUpp``. ``stream_step`` / ``stream_chunks`` read a sequence chunk by
chunk with the state carried (equal to one pass over it). ``LanguageNet`` is the language
network (embedding, SRU / SRU++ / LSTM layers, output layer) the language model trains, and
``CarriedState`` the state it carries from batch to batch. ``SRUConfig``, ``SRUCellConfig``,
``SRUppConfig`` and ``LanguageNetConfig`` are what builds each (``pretrained_config``; what a
folder of weights records)."""

from .carried_state import CarriedState
from .cell import SRUCell
from .configs import LanguageNetConfig, SRUCellConfig, SRUConfig, SRUppConfig
from .language_net import LanguageNet, build_network
from .policy import iter_sru_cells, set_recurrence_policy
from .srupp import SRUpp
from .srupp_attention import SRUppAttention, SRUppProjectedLinear
from .srupp_cell import SRUppCell
from .stack import SRU
from .streaming import stream_chunks, stream_step

__all__ = [
    "CarriedState",
    "LanguageNet",
    "LanguageNetConfig",
    "SRU",
    "SRUCell",
    "SRUCellConfig",
    "SRUConfig",
    "SRUpp",
    "SRUppConfig",
    "SRUppAttention",
    "SRUppCell",
    "SRUppProjectedLinear",
    "build_network",
    "iter_sru_cells",
    "set_recurrence_policy",
    "stream_chunks",
    "stream_step",
]
