"""Fabric's DeepSpeed, FSDP and FSDP2 strategies, able to run on CPU processes as the Trainer's are.

The Fabric counterparts of :mod:`sru_lightning.strategies`, for ``lightning.fabric.Fabric``
loops: on CUDA each is Fabric's class of the same name unchanged; with ``accelerator="cpu"``
it runs where Fabric's own checks refuse (DeepSpeed's CUDA-only ``setup_environment``,
FSDP's GPU-only accelerator check and CUDA device index). The SRU layers are sharded as the
Trainer's strategies shard them (one FSDP unit per recurrent layer), and the recurrence
storage dtype follows from the same precision rule (:class:`~sru_lightning.callbacks.SRUFabricPrecision`)::

    from sru_lightning.strategies.fabric import DeepSpeedStrategy

    fabric = Fabric(accelerator="cpu", devices=2, strategy=DeepSpeedStrategy(stage=2),
                    precision="bf16-mixed", callbacks=[SRUFabricPrecision()])
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.fabric.accelerators import CPUAccelerator
from lightning.fabric.plugins.precision import FSDPPrecision
from lightning.fabric.strategies import DeepSpeedStrategy as FabricDeepSpeedStrategy
from lightning.fabric.strategies import FSDPStrategy as FabricFSDPStrategy
from lightning.fabric.strategies import ModelParallelStrategy, Strategy
from lightning.fabric.utilities.seed import reset_seed
from torch import nn

from sru_lightning._lightning_compat import (
    fabric_deepspeed_setup_distributed_on_cpu,
    fabric_fsdp_kwargs,
    resolve_all_data_parallel,
)

from .deepspeed import cpu_device_rank, refuse_unsupported_fp16
from .fsdp import RecurrentLayerUnits, wrap_on_cpu
from .fsdp2 import fsdp2_mixed_precision, shard_recurrent_model

__all__ = ["DeepSpeedStrategy", "FSDPStrategy", "FSDP2Strategy", "DeviceAutocastFSDPPrecision"]


class DeepSpeedStrategy(FabricDeepSpeedStrategy):
    """``lightning.fabric.strategies.DeepSpeedStrategy`` that also runs on CPU processes.

    On CPU: no CUDA-only check in ``setup_environment`` (an fp16 request on a CPU without
    DeepSpeed fp16 kernels is refused there instead, in one sentence), no device-index check
    in the distributed setup, and the local rank as DeepSpeed's ``device_rank``."""

    @property
    def _on_cpu(self) -> bool:
        return isinstance(self.accelerator, CPUAccelerator)

    def setup_environment(self) -> None:
        if not self._on_cpu:
            return super().setup_environment()
        refuse_unsupported_fp16(self.precision.precision, self.config, setting="Fabric(precision=...)")
        # DeepSpeedStrategy's own checks accept CUDA only (the accelerator, the device index).
        Strategy.setup_environment(self)
        reset_seed()
        fabric_deepspeed_setup_distributed_on_cpu(self)

    def setup_module_and_optimizers(self, module: nn.Module, optimizers: list, scheduler: Any = None):
        with cpu_device_rank(self.local_rank if self._on_cpu else None):
            return super().setup_module_and_optimizers(module, optimizers, scheduler)

    def setup_module(self, module: nn.Module):
        with cpu_device_rank(self.local_rank if self._on_cpu else None):
            return super().setup_module(module)


class DeviceAutocastFSDPPrecision(FSDPPrecision):
    """Fabric's FSDPPrecision autocasting the device the model is on: Fabric's own plugin
    autocasts ``"cuda"`` in the mixed modes, which leaves a CPU model's matmuls in float32.
    The strategy sets ``device_type`` when it wraps the model."""

    device_type: str = "cuda"
    # Read by sru_lightning.precision: the forward context autocasts the model's own device.
    autocasts_on_model_device = True

    def forward_context(self):
        if "mixed" in self.precision:
            dtype = torch.bfloat16 if self.precision == "bf16-mixed" else torch.float16
            return torch.autocast(self.device_type, dtype=dtype)
        return super().forward_context()

    @classmethod
    def from_plugin(cls, plugin: FSDPPrecision) -> DeviceAutocastFSDPPrecision:
        converted = cls(plugin.precision)
        converted.scaler = plugin.scaler
        return converted


class FSDPStrategy(RecurrentLayerUnits, FabricFSDPStrategy):
    """``lightning.fabric.strategies.FSDPStrategy`` that also runs on CPU processes (gloo).

    * ``auto_wrap_policy`` defaults to one FSDP unit per SRU / SRU++ layer, as the Trainer's
      :class:`sru_lightning.strategies.FSDPStrategy`;
    * on CPU the model is wrapped with ``device_id=torch.device("cpu")`` (Fabric passes the
      device index, which a CPU device does not have), and the mixed modes autocast the CPU.
    """

    @property
    def precision(self) -> FSDPPrecision:
        return FabricFSDPStrategy.precision.fget(self)

    @precision.setter
    def precision(self, plugin: FSDPPrecision | None) -> None:
        if plugin is not None and type(plugin) is FSDPPrecision:
            plugin = DeviceAutocastFSDPPrecision.from_plugin(plugin)
        FabricFSDPStrategy.precision.fset(self, plugin)

    def setup_module(self, module: nn.Module) -> nn.Module:
        if self._on_cpu:
            module = wrap_on_cpu(
                module, self.cpu_offload, self.mixed_precision_config, self.sharding_strategy, fabric_fsdp_kwargs(self)
            )
        if isinstance(self.precision, DeviceAutocastFSDPPrecision):
            self.precision.device_type = self.root_device.type
        return super().setup_module(module)


class FSDP2Strategy(ModelParallelStrategy):
    """FSDP2 (``fully_shard``) for Fabric, on CUDA or CPU processes: Fabric's
    ``ModelParallelStrategy`` with every process in one data-parallel group and, unless a
    ``parallelize_fn`` is given, one shard group per SRU / SRU++ layer and one for the root,
    with the ``MixedPrecisionPolicy`` of ``Fabric(precision=...)`` (as the Trainer's
    :class:`sru_lightning.strategies.FSDP2Strategy`). Checkpoints are single files assembled on
    rank 0 unless ``save_distributed_checkpoint=True``."""

    def __init__(
        self,
        parallelize_fn: Any = None,
        data_parallel_size: str | int = "all",
        tensor_parallel_size: str | int = 1,
        save_distributed_checkpoint: bool = False,
        reshard_after_forward: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            parallelize_fn=parallelize_fn if parallelize_fn is not None else self._shard_recurrent_layers,
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

    def setup_module_and_optimizers(self, module: nn.Module, optimizers: list, scheduler: Any = None):
        """``fabric.setup(model, optimizer)``: ``fully_shard`` replaces every parameter by a
        sharded one, so the optimizer, built on the originals, is pointed at their replacements
        (by parameter name). An optimizer that has stepped already is refused: its state
        belongs to the unsharded parameters."""
        names = {id(parameter): name for name, parameter in module.named_parameters()}
        for optimizer in optimizers:
            if optimizer.state:
                raise ValueError(
                    f"{type(self).__name__}: set up the optimizer before its first step: `optimizers` must have "
                    f"no state yet, got {type(optimizer).__name__} with state for {len(optimizer.state)} parameters"
                )
        module = self.setup_module(module)
        sharded = dict(module.named_parameters())
        for optimizer in optimizers:
            for group in optimizer.param_groups:
                group["params"] = [sharded[names[id(parameter)]] for parameter in group["params"]]
        return module, [self.setup_optimizer(optimizer) for optimizer in optimizers], scheduler

    def _shard_recurrent_layers(self, module: nn.Module, device_mesh) -> nn.Module:
        self.sharded_layers = shard_recurrent_model(
            module,
            device_mesh["data_parallel"],
            fsdp2_mixed_precision(self.precision.precision),
            reshard_after_forward=self.reshard_after_forward,
        )
        return module
