"""An exponential moving average of the weights, validated, checkpointed and kept at the end of
a fit: Lightning's ``EMAWeightAveraging``, with its average built when the fit starts.

Lightning's callback copies the module in its ``setup`` hook, which runs before the module's
own: a module that adds a buffer there (``SRULanguageModel`` keeps each token's byte length,
known only once the data module is set up) leaves the copy with fewer buffers than the model,
and the first validation fails to swap the two ("output with shape [1] doesn't match the
broadcast shape [...]"). Here the copy is made in ``on_fit_start``, once the module is set up and
on its device. A checkpoint read before that (``Trainer.fit(ckpt_path=...)`` under every strategy
that restores before it sets up) keeps its average until the copy exists.

What the callback does through a fit (as Lightning's): after every ``update_every_n_steps``
optimizer steps, ``average = decay * average + (1 - decay) * weights``; each validation runs on
the average; a checkpoint's ``state_dict`` holds the average (so exports, ``serve`` and a new fit
from it start from the averaged model) and ``current_model_state`` the trained weights, which a
resume with this callback trains on; the end of the fit leaves the average in the module. The
buffers follow the model (``use_buffers=False``): the networks here hold no running statistics.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import EMAWeightAveraging
from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy
from lightning.pytorch.trainer.states import TrainerFn
from torch.optim.swa_utils import AveragedModel, get_ema_avg_fn

from sru_lightning.nn.checks import check_non_negative_int, check_positive_int, check_probability


class ExponentialWeightAverage(EMAWeightAveraging):
    """Validate and keep an exponential moving average of the weights.

    Args:
        decay: the weight of the average so far at each update, in [0, 1): ``1 / (1 - decay)``
            updates make its horizon (100 at 0.99).
        update_every_n_steps: optimizer steps between updates.
        update_starting_at_step: the first optimizer step (0-based) that updates the average;
            ``None`` updates from the first.
        device: where the average lives (``None``: the module's device).
    """

    def __init__(
        self,
        decay: float = 0.99,
        update_every_n_steps: int = 1,
        update_starting_at_step: int | None = None,
        device: Any = None,
    ) -> None:
        owner = "ExponentialWeightAverage"
        decay = check_probability(owner, "decay", decay)
        update_every_n_steps = check_positive_int(owner, "update_every_n_steps", update_every_n_steps)
        if update_starting_at_step is not None:
            update_starting_at_step = check_non_negative_int(owner, "update_starting_at_step", update_starting_at_step)
        super().__init__(
            device=device,
            use_buffers=False,
            decay=decay,
            update_every_n_steps=update_every_n_steps,
            update_starting_at_step=update_starting_at_step,
        )
        self.decay = decay
        self.average_device = device
        # The average read from a checkpoint before the copy exists (AveragedModel's state_dict).
        self._restored_average: dict[str, Any] | None = None

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        # The copy waits for on_fit_start: the module's own setup has not run yet.
        if stage == TrainerFn.FITTING:
            self._average_model = None

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        strategy = trainer.strategy
        if (
            isinstance(strategy, (FSDPStrategy, ModelParallelStrategy))
            or callable(getattr(strategy, "shard", None))
            or getattr(strategy, "zero_stage_3", False)
        ):
            raise ValueError(
                "ExponentialWeightAverage keeps a whole copy of the model on every rank: it needs a strategy "
                f"that does not shard the parameters (ddp, deepspeed stages 1-2), got {type(strategy).__name__}"
            )
        if self._average_model is None:
            # The module is set up (configure_model included) and on its device: copy it as it
            # is, without the trainer it points to (a deep copy would copy the trainer, its data
            # module and the data held in memory with it).
            pl_module.trainer = None
            try:
                self._average_model = AveragedModel(
                    pl_module,
                    device=self.average_device if self.average_device is not None else pl_module.device,
                    use_buffers=False,
                    avg_fn=get_ema_avg_fn(self.decay),
                )
            finally:
                pl_module.trainer = trainer
        if self._restored_average is not None:
            self._average_model.load_state_dict(self._restored_average)
            self._restored_average = None

    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        if self._average_model is not None or trainer.state.fn != TrainerFn.FITTING:
            super().on_load_checkpoint(trainer, pl_module, checkpoint)
            return
        if "current_model_state" in checkpoint and "averaging_state" in checkpoint:
            # The module was loaded with the checkpoint's state_dict, the average: it goes on
            # training from the weights it had, and the average waits for its copy.
            average = {"module." + name: value for name, value in checkpoint["state_dict"].items()}
            self._restored_average = average | checkpoint["averaging_state"]
            pl_module.load_state_dict(checkpoint["current_model_state"])
        # A checkpoint written without the callback: the average starts from its weights.
