"""The regime of an FSDP strategy: ``MixedPrecision(param_dtype=...)``, else its precision plugin."""

from __future__ import annotations

import torch

from .regime import PRECISION_STRINGS, Regime, dtype_name, regime_from_dtypes

__all__ = ["fsdp_regime"]


def fsdp_regime(mixed_precision, plugin, device_type: str) -> Regime:
    precision = str(getattr(plugin, "precision", "32-true"))
    weights_from_plugin, autocast = PRECISION_STRINGS.get(precision, (torch.float32, None))
    if autocast is not None:
        # FSDPPrecision's forward context in the mixed modes: torch.autocast("cuda", ...).
        # FSDP also casts parameters to the same dtype for compute.
        weights_from_plugin = autocast
    if mixed_precision is not None:
        param_dtype = getattr(mixed_precision, "param_dtype", None)
        weights = param_dtype if param_dtype is not None else weights_from_plugin
        source = (
            f"FSDPStrategy(mixed_precision=MixedPrecision(param_dtype={dtype_name(param_dtype)})), "
            f"precision={precision!r}"
        )
    else:
        weights = weights_from_plugin
        source = f"FSDPPrecision(precision={precision!r})"
    return regime_from_dtypes(
        f"fsdp-{dtype_name(weights)}" if autocast is None else f"fsdp-{precision}",
        param_dtype=weights,
        autocast_dtype=autocast,
        device_type=device_type,
        source=source,
    )
