"""Callbacks a user's own Trainer takes, one per module as Lightning's own are: the recurrence
precision policy (:mod:`.precision`, with the shape advice of :mod:`.tensor_cores`, and its
counterpart for a Fabric loop, ``SRUFabricPrecision`` / ``apply_precision``), a stop on
SIGTERM / Ctrl+C at a batch boundary (:mod:`.graceful_interrupt`, with the signals and the
supervisor protocol of :mod:`.stop_signals`) and its checkpoint (:mod:`.interruption_checkpoint`),
Lightning's ``ModelCheckpoint`` with a record that follows a moved run folder (:mod:`.folder_checkpoint`),
an exact resume (:mod:`.restore_data_position`, :mod:`.seed_every_batch`), a stop on a non-finite
loss (:mod:`.nonfinite_loss`), validation of the final weights of a `max_steps` fit
(:mod:`.validate_before_stop`), Lightning's Rich progress bar updated as often as it is drawn
(:mod:`.paced_progress_bar`), a `max_time` budget that the learning-rate schedule and a final
validation fit in (:mod:`.time_budget`), an exponential moving average of the weights
(:mod:`.weight_average`), training throughput (:mod:`.throughput`) and a search
trial's reports and pruning (:mod:`.trial_pruning`)."""

from .folder_checkpoint import FolderModelCheckpoint
from .graceful_interrupt import GracefulInterrupt
from .interruption_checkpoint import InterruptionCheckpoint
from .nonfinite_loss import StopOnNonFiniteLoss
from .paced_progress_bar import PacedRichProgressBar
from .precision import SRUFabricPrecision, SRUPrecisionCallback, apply_precision
from .restore_data_position import RestoreDataPosition
from .seed_every_batch import SeedEveryBatch
from .tensor_cores import ShapeAdvice, TensorCoreShapeWarning, tensor_core_advice
from .throughput import TrainingThroughput
from .time_budget import TimeBudget
from .trial_pruning import TrialPruning
from .validate_before_stop import ValidateBeforeStop
from .weight_average import ExponentialWeightAverage

__all__ = [
    "ExponentialWeightAverage",
    "FolderModelCheckpoint",
    "GracefulInterrupt",
    "InterruptionCheckpoint",
    "PacedRichProgressBar",
    "RestoreDataPosition",
    "SRUFabricPrecision",
    "SRUPrecisionCallback",
    "SeedEveryBatch",
    "ShapeAdvice",
    "StopOnNonFiniteLoss",
    "TensorCoreShapeWarning",
    "TimeBudget",
    "TrainingThroughput",
    "TrialPruning",
    "ValidateBeforeStop",
    "apply_precision",
    "tensor_core_advice",
]
