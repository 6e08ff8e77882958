"""Reading a Lightning Trainer: its strategy, its precision plugin and the device it runs on,
and the regime of the plugin alone (32-true, 64-true, 16/bf16-mixed, 16/bf16-true,
Transformer Engine, bitsandbytes)."""

from __future__ import annotations

import torch

from sru_lightning.ops.storage_dtype import HALF_DTYPES

from .regime import PRECISION_STRINGS, Regime, dtype_name, regime_from_dtypes

__all__ = ["device_type_of", "plugin_regime", "unpack_trainer"]


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
    """(strategy, precision plugin) from a Trainer, a Strategy or a precision plugin."""
    from lightning.pytorch import Trainer
    from lightning.pytorch.plugins.precision import Precision
    from lightning.pytorch.strategies import Strategy

    if isinstance(obj, Trainer):
        return obj.strategy, obj.strategy.precision_plugin
    if isinstance(obj, Strategy):
        return obj, obj.precision_plugin
    if isinstance(obj, Precision):
        return None, obj
    raise TypeError(
        "detect_regime: `trainer` must be a lightning.pytorch Trainer, Strategy or precision "
        f"plugin (Precision), got {type(obj).__name__}"
    )


def plugin_regime(plugin, device_type: str) -> Regime:
    from lightning.pytorch.plugins.precision import (
        BitsandbytesPrecision,
        DoublePrecision,
        HalfPrecision,
        MixedPrecision,
        TransformerEnginePrecision,
    )

    plugin_name = type(plugin).__name__
    precision = str(getattr(plugin, "precision", "32-true"))

    if isinstance(plugin, TransformerEnginePrecision):
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
    if isinstance(plugin, BitsandbytesPrecision):
        compute = plugin.dtype
        return regime_from_dtypes(
            f"bitsandbytes-{getattr(plugin, 'mode', 'quantized')}",
            param_dtype=compute,
            autocast_dtype=None,
            device_type=device_type,
            source=f"{plugin_name}(dtype={dtype_name(compute)})",
        )
    if isinstance(plugin, DoublePrecision):
        precision = "64-true"
    elif isinstance(plugin, MixedPrecision):
        device_type = torch.device(plugin.device).type
    elif isinstance(plugin, HalfPrecision):
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
