"""Drop-in SRU layers: ``SRUCell`` and ``SRU`` with the keyword names of the ``sru`` package
and the calling convention of ``nn.LSTM``; state dicts of ``sru.SRU``/``sru.SRUCell`` load
directly."""

from .cell import SRUCell
from .policy import iter_sru_cells, set_recurrence_policy
from .stack import SRU

__all__ = ["SRU", "SRUCell", "iter_sru_cells", "set_recurrence_policy"]
