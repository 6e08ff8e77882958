"""Reading a Lightning Trainer or Fabric: its strategy, its precision plugin and the device it
runs on, and the regime of the plugin alone (32-true, 64-true, 16/bf16-mixed, 16/bf16-true,
Transformer Engine, bitsandbytes).

Lightning 2.x keeps two class trees: the Trainer's plugins and strategies
(``lightning.pytorch``) and Fabric's (``lightning.fabric``). Only the base ``Precision`` and a
few plugins of the Trainer subclass Fabric's; ``MixedPrecision``, ``HalfPrecision``,
``DoublePrecision``, ``FSDPPrecision``, ``DeepSpeedPrecision`` and every strategy exist twice,
unrelated. :func:`lightning_classes` names both, so one rule reads either tree.
"""

from __future__ import annotations

import torch

from sru_lightning.ops.storage_dtype import HALF_DTYPES

from .regime import PRECISION_STRINGS, Regime, dtype_name, plugin_class_name, regime_from_dtypes

__all__ = ["device_type_of", "lightning_classes", "plugin_regime", "unpack_trainer"]


def lightning_classes(kind: str, name: str) -> tuple[type, ...]:
    """The Trainer's and Fabric's class ``name``; ``kind`` is ``"precision"`` (a precision
    plugin) or ``"strategies"``. For ``isinstance`` checks that accept both trees."""
    import importlib

    modules = {
        "precision": ("lightning.pytorch.plugins.precision", "lightning.fabric.plugins.precision"),
        "strategies": ("lightning.pytorch.strategies", "lightning.fabric.strategies"),
    }
    if kind not in modules:
        raise ValueError(f"lightning_classes: `kind` must be one of {sorted(modules)}, got {kind!r}")
    return tuple(getattr(importlib.import_module(module), name) for module in modules[kind])


def device_type_of(strategy, plugin) -> str:
    plugin_device = getattr(plugin, "device", None)
    if isinstance(plugin_device, str):
        return torch.device(plugin_device).type
    if strategy is not None:
        try:
            return strategy.root_device.type
        except Exception:  # a strategy not attached to an accelerator yet has no root device
            pass
    return "cuda" if torch.cuda.is_available() else "cpu"


def unpack_trainer(obj):
    """(strategy, precision plugin) from a Trainer or a Fabric, a Strategy or a precision plugin
    of either."""
    from lightning.fabric import Fabric
    from lightning.fabric.plugins.precision import Precision as FabricPrecision
    from lightning.fabric.strategies import Strategy as FabricStrategy
    from lightning.pytorch import Trainer
    from lightning.pytorch.strategies import Strategy

    if isinstance(obj, Trainer):
        return obj.strategy, obj.strategy.precision_plugin
    if isinstance(obj, Fabric):
        return obj.strategy, obj.strategy.precision
    if isinstance(obj, Strategy):
        return obj, obj.precision_plugin
    if isinstance(obj, FabricStrategy):
        return obj, obj.precision
    if isinstance(obj, FabricPrecision):  # the Trainer's Precision subclasses Fabric's
        return None, obj
    raise TypeError(
        "detect_regime: `trainer` must be a lightning.pytorch Trainer or a lightning.fabric Fabric, "
        f"or a Strategy or a precision plugin (Precision) of either, got {type(obj).__name__}"
    )


def plugin_regime(plugin, device_type: str) -> Regime:
    """The regime of a precision plugin alone, the Trainer's or Fabric's."""

    def of(name: str) -> bool:
        return isinstance(plugin, lightning_classes("precision", name))

    plugin_name = plugin_class_name(plugin)
    precision = str(getattr(plugin, "precision", "32-true"))

    if of("TransformerEnginePrecision"):
        device_type = "cuda"  # Transformer Engine is CUDA-only
        weights = plugin.weights_dtype
        fallback = getattr(plugin, "fallback_compute_dtype", None) or weights
        # TE's forward context adds torch.autocast("cuda", fallback_compute_dtype) around the
        # weights' dtype context: plain matmuls (ours) run in the fallback compute dtype.
        autocast = fallback if fallback in HALF_DTYPES else None
        return regime_from_dtypes(
            "transformer-engine",
            param_dtype=weights,
            autocast_dtype=autocast,
            device_type=device_type,
            source=f"{plugin_name}(weights_dtype={dtype_name(weights)}, fallback_compute_dtype={dtype_name(fallback)})",
        )
    if of("BitsandbytesPrecision"):
        compute = plugin.dtype
        return regime_from_dtypes(
            f"bitsandbytes-{getattr(plugin, 'mode', 'quantized')}",
            param_dtype=compute,
            autocast_dtype=None,
            device_type=device_type,
            source=f"{plugin_name}(dtype={dtype_name(compute)})",
        )
    if of("DoublePrecision"):
        precision = "64-true"
    elif of("MixedPrecision"):
        device_type = torch.device(plugin.device).type
    elif of("HalfPrecision"):
        pass  # precision is "16-true" or "bf16-true"

    name, notes = precision, ()
    dtypes = PRECISION_STRINGS.get(precision)
    if dtypes is None:
        name, dtypes = "32-true", (torch.float32, None)
        notes = (f"unknown precision {precision!r} of {plugin_name}; assuming 32-true",)
    weights, autocast = dtypes
    return regime_from_dtypes(
        name,
        param_dtype=weights,
        autocast_dtype=autocast,
        device_type=device_type,
        source=f"{plugin_name}(precision={precision!r})",
        notes=notes,
    )
