"""The earlier import path of the exact-resume callbacks, each of which now has its own module
(:mod:`.restore_data_position`, :mod:`.seed_every_batch`).

Kept because run configs name their classes by this path in `_target_`: the configs saved inside
the checkpoints of earlier runs, which a resumed run instantiates again, and scripts written
against it.
"""

from .restore_data_position import RestoreDataPosition
from .seed_every_batch import SeedEveryBatch

__all__ = ["RestoreDataPosition", "SeedEveryBatch"]
