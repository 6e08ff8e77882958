"""FSDP2 (``torch.distributed.fsdp.fully_shard``) through Lightning's ModelParallelStrategy."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from lightning.pytorch.strategies import ModelParallelStrategy
from torch import nn

from sru_lightning._lightning_compat import resolve_all_data_parallel

__all__ = ["FSDP2Strategy", "fsdp2_mixed_precision", "shard_recurrent_model"]

# Lightning precision -> FSDP2 parameter dtype for compute. Gradients are reduced in float32.
_PARAM_DTYPES = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}


def fsdp2_mixed_precision(precision: str):
    """The ``MixedPrecisionPolicy`` that matches ``Trainer(precision=...)``, None when the
    precision needs none (``32-true``; the ``*-true`` modes convert the weights themselves).

    In the mixed modes FSDP2 gathers the weights in the half dtype for forward and backward
    and reduces gradients in float32; Lightning's autocast runs as well, as under FSDP1.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy

    param_dtype = _PARAM_DTYPES.get(str(precision))
    if param_dtype is None:
        return None
    return MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)


def _recurrent_layers(model: nn.Module) -> list[nn.Module]:
    from sru_lightning.nn import SRUCell, SRUppCell

    return [module for module in model.modules() if isinstance(module, (SRUCell, SRUppCell))]


def shard_recurrent_model(
    model: nn.Module,
    mesh,
    mp_policy=None,
    layer_classes: Iterable[type[nn.Module]] | None = None,
    reshard_after_forward: bool = True,
) -> list[nn.Module]:
    """``fully_shard`` every SRU / SRU++ layer (or every module of ``layer_classes``) of
    ``model``, then ``model`` itself. Returns the layers sharded on their own.

    Each layer's weights are gathered just for its forward and backward; the root holds the
    rest (embedding, decoder, norms). The layers must be called as modules (``layer(x)``),
    which the SRU and SRU++ stacks do, so FSDP2's hooks run.
    """
    from torch.distributed.fsdp import fully_shard

    kwargs: dict[str, Any] = {"mesh": mesh, "reshard_after_forward": reshard_after_forward}
    if mp_policy is not None:
        kwargs["mp_policy"] = mp_policy
    if layer_classes is None:
        layers = _recurrent_layers(model)
    else:
        classes = tuple(layer_classes)
        layers = [module for module in model.modules() if isinstance(module, classes) and module is not model]
    for layer in layers:
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    return layers


class FSDP2Strategy(ModelParallelStrategy):
    """Fully sharded data parallel with FSDP2, on CUDA or on CPU processes (gloo).

    Lightning's ``ModelParallelStrategy`` with the mesh set for pure data parallelism (every
    process in one shard group) and a :meth:`shard` for ``LightningModule.configure_model``
    that applies ``fully_shard`` per recurrent layer and to the root, with the
    ``MixedPrecisionPolicy`` that ``Trainer(precision=...)`` asks for::

        def configure_model(self):
            strategy = self.trainer.strategy
            if isinstance(strategy, FSDP2Strategy):
                strategy.shard(self)

    (:class:`sru_lightning.models.SRULanguageModel` does this.) Checkpoints are single files
    assembled on rank 0 unless ``save_distributed_checkpoint=True``.
    """

    def __init__(
        self,
        data_parallel_size: str | int = "all",
        tensor_parallel_size: str | int = 1,
        save_distributed_checkpoint: bool = False,
        reshard_after_forward: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            data_parallel_size=data_parallel_size,
            tensor_parallel_size=tensor_parallel_size,
            save_distributed_checkpoint=save_distributed_checkpoint,
            **kwargs,
        )
        self.reshard_after_forward = bool(reshard_after_forward)
        self.sharded_layers: list[nn.Module] = []

    def setup_environment(self) -> None:
        resolve_all_data_parallel(self)
        super().setup_environment()

    @property
    def mixed_precision_policy(self):
        return fsdp2_mixed_precision(self.precision_plugin.precision)

    def shard(self, model: nn.Module) -> list[nn.Module]:
        """Apply FSDP2 to ``model`` once (its recurrent layers, then the root)."""
        from torch.distributed.fsdp import FSDPModule

        if isinstance(model, FSDPModule):
            return self.sharded_layers
        self.sharded_layers = shard_recurrent_model(
            model,
            self.device_mesh["data_parallel"],
            self.mixed_precision_policy,
            reshard_after_forward=self.reshard_after_forward,
        )
        return self.sharded_layers
