"""Lightning's FSDPStrategy (FSDP1 wrapping), able to run on CPU processes and to clip by norm."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from lightning.pytorch.plugins.precision import FSDPPrecision
from lightning.pytorch.strategies import FSDPStrategy as LightningFSDPStrategy
from lightning.pytorch.utilities import rank_zero_warn
from torch import nn

from sru_lightning._lightning_compat import FSDPModelSetupHook, fsdp_state_dict_type, full_state_dict_context_replaced

__all__ = ["FSDPStrategy", "ShardedClippingFSDPPrecision", "recurrent_layer_wrap_policy"]


def recurrent_layer_wrap_policy() -> set[type[nn.Module]]:
    """The module classes FSDP shards as units of their own: each SRU and SRU++ layer, so a
    layer's weights are gathered just for its own forward and backward."""
    from sru_lightning.nn import SRUCell, SRUppCell

    return {SRUCell, SRUppCell}


def wrap_on_cpu(module: nn.Module, cpu_offload, mixed_precision, sharding_strategy, kwargs: dict) -> nn.Module:
    """``module`` wrapped by FSDP for CPU processes, as Lightning would wrap it on a GPU but with
    ``device_id=torch.device("cpu")`` (Lightning passes the device index, which a CPU device does
    not have); a module holding FSDP units already is left as it is. The wrap policy is taken out
    of ``kwargs``, so Lightning's own setup afterwards only finishes (and does not warn that the
    policy is ignored). The Trainer's and Fabric's FSDPStrategy both wrap through it."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    if any(isinstance(submodule, FullyShardedDataParallel) for submodule in module.modules()):
        return module
    wrapped = FullyShardedDataParallel(
        module=module,
        cpu_offload=cpu_offload,
        mixed_precision=mixed_precision,
        sharding_strategy=sharding_strategy,
        device_id=torch.device("cpu"),
        **kwargs,
    )
    kwargs.pop("auto_wrap_policy", None)
    return wrapped


class ShardedClippingFSDPPrecision(FSDPPrecision):
    """FSDPPrecision that clips gradients by norm through the root FSDP module's
    ``clip_grad_norm_``, which reduces the norm over every rank's shard (Lightning's plugin
    refuses norm clipping because it holds no reference to that module). In the mixed modes
    autocast runs on the device the model is on, so CPU runs autocast as CUDA runs do."""

    root_module: nn.Module | None = None
    device_type: str = "cuda"
    # Read by sru_lightning.precision: the forward context autocasts the model's own device.
    autocasts_on_model_device = True

    def clip_grad_by_norm(self, optimizer, clip_val, norm_type: float = 2.0) -> None:
        if self.root_module is None:
            raise RuntimeError("FSDP gradient clipping by norm needs the wrapped root module; the strategy sets it up")
        self.root_module.clip_grad_norm_(clip_val, norm_type=norm_type)

    def forward_context(self):
        if "mixed" in self.precision:
            dtype = torch.bfloat16 if self.precision == "bf16-mixed" else torch.float16
            return torch.autocast(self.device_type, dtype=dtype)
        return super().forward_context()

    @classmethod
    def from_plugin(cls, plugin: FSDPPrecision) -> ShardedClippingFSDPPrecision:
        # Lightning's constructor refuses a given scaler for '16-mixed' (it checks the class's
        # default precision before setting its own), so the plugin's scaler is carried over after.
        converted = cls(plugin.precision)
        converted.scaler = plugin.scaler
        return converted


class RecurrentLayerUnits:
    """What the Trainer's and Fabric's FSDP strategies of this package share (a mixin before
    Lightning's class): ``auto_wrap_policy="recurrent_layers"`` (the default) makes one FSDP
    unit per SRU / SRU++ layer, and ``_on_cpu`` says whether the processes run on CPU."""

    def __init__(self, *args: Any, auto_wrap_policy: Any = "recurrent_layers", **kwargs: Any) -> None:
        if auto_wrap_policy == "recurrent_layers":
            auto_wrap_policy = recurrent_layer_wrap_policy()
        super().__init__(*args, auto_wrap_policy=auto_wrap_policy, **kwargs)

    @property
    def _on_cpu(self) -> bool:
        return self.parallel_devices is not None and self.root_device.type == "cpu"


class FSDPStrategy(RecurrentLayerUnits, FSDPModelSetupHook, LightningFSDPStrategy):
    """``lightning.pytorch.strategies.FSDPStrategy`` that also runs on CPU and clips by norm.

    * On CPU (gloo) the model is wrapped with ``device_id=torch.device("cpu")`` (Lightning
      passes the device index, which a CPU device does not have, and refuses its own class on
      CPU before that).
    * ``gradient_clip_val`` with the default ``gradient_clip_algorithm="norm"`` clips through
      FSDP's own ``clip_grad_norm_``.
    * ``state_dict_type="full"`` gathers the full state dict on rank 0; on CPU without the
      CPU offload that crashes there (the tensors are on the CPU already).
    * ``auto_wrap_policy`` defaults to one FSDP unit per SRU / SRU++ layer.
    """

    @property
    def precision_plugin(self) -> FSDPPrecision:
        return LightningFSDPStrategy.precision_plugin.fget(self)

    @precision_plugin.setter
    def precision_plugin(self, plugin: FSDPPrecision | None) -> None:
        if plugin is not None and type(plugin) is FSDPPrecision:
            plugin = ShardedClippingFSDPPrecision.from_plugin(plugin)
        LightningFSDPStrategy.precision_plugin.fset(self, plugin)

    def before_fsdp_wrap(self, model: nn.Module) -> nn.Module:
        if self._on_cpu:
            model = wrap_on_cpu(
                model, self.cpu_offload, self.mixed_precision_config, self.sharding_strategy, self.kwargs
            )
        return model

    def after_fsdp_wrap(self, model: nn.Module) -> nn.Module:
        plugin = self.precision_plugin
        if isinstance(plugin, ShardedClippingFSDPPrecision):
            plugin.root_module = model
            plugin.device_type = self.root_device.type
        return model

    def _full_state_dict_without_offload(self):
        from torch.distributed.fsdp import FullStateDictConfig, StateDictType
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.api import FullOptimStateDictConfig

        return FSDP.state_dict_type(
            module=self.model,
            state_dict_type=StateDictType.FULL_STATE_DICT,
            state_dict_config=FullStateDictConfig(offload_to_cpu=False, rank0_only=True),
            optim_state_dict_config=FullOptimStateDictConfig(offload_to_cpu=False, rank0_only=True),
        )

    @contextlib.contextmanager
    def _cpu_full_state_dict(self):
        """Lightning's full state-dict context offloads to the CPU; on CPU processes that
        crashes rank 0, and there is nothing to offload. Replace it there, only while saving."""
        if not (self._on_cpu and fsdp_state_dict_type(self) == "full"):
            yield
            return
        with full_state_dict_context_replaced(lambda *args, **kwargs: self._full_state_dict_without_offload()):
            yield

    def lightning_module_state_dict(self) -> dict[str, Any]:
        with self._cpu_full_state_dict():
            return super().lightning_module_state_dict()

    def optimizer_state(self, optimizer) -> dict[str, Any]:
        with self._cpu_full_state_dict():
            return super().optimizer_state(optimizer)

    def setup_environment(self) -> None:
        super().setup_environment()
        if self._on_cpu and self.precision_plugin.precision == "16-mixed":
            rank_zero_warn("FSDP 16-mixed on CPU: float16 matmuls on CPU are slow; bf16-mixed is the CPU choice")
