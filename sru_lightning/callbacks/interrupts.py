"""The earlier import path of the interruption callbacks, each of which now has its own module
(:mod:`.graceful_interrupt`, :mod:`.interruption_checkpoint`).

Kept because run configs name their classes by this path in `_target_`: the configs saved inside
the checkpoints of earlier runs, which a resumed run instantiates again, and scripts written
against it.
"""

from .graceful_interrupt import GracefulInterrupt, interruption_cause, is_interruption
from .interruption_checkpoint import InterruptionCheckpoint

__all__ = ["GracefulInterrupt", "InterruptionCheckpoint", "interruption_cause", "is_interruption"]
