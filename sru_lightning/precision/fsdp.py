"""The regime of FSDP: FSDP1 (``FSDPStrategy``: ``MixedPrecision(param_dtype=...)``, else its
precision plugin) and FSDP2 (``fully_shard`` with a ``MixedPrecisionPolicy``)."""

from __future__ import annotations

import torch

from .regime import PRECISION_STRINGS, Regime, dtype_name, plugin_class_name, regime_from_dtypes

__all__ = ["fsdp_regime", "fsdp2_param_dtype", "fsdp2_regime"]


def _autocast_that_runs(plugin, precision: str, device_type: str) -> torch.dtype | None:
    """The autocast dtype the plugin's forward context really enables on ``device_type``.

    Lightning's FSDPPrecision autocasts "cuda" in the mixed modes, which does nothing on a
    CPU; a plugin with ``autocasts_on_model_device`` autocasts the model's own device."""
    autocast = PRECISION_STRINGS.get(precision, (torch.float32, None))[1]
    if autocast is None:
        return None
    autocast_device = device_type if getattr(plugin, "autocasts_on_model_device", False) else "cuda"
    return autocast if autocast_device == device_type else None


def fsdp_regime(mixed_precision, plugin, device_type: str) -> Regime:
    precision = str(getattr(plugin, "precision", "32-true"))
    weights_from_plugin, plugin_autocast = PRECISION_STRINGS.get(precision, (torch.float32, None))
    if plugin_autocast is not None:
        # FSDPPrecision's mixed modes also have FSDP cast the parameters for compute.
        weights_from_plugin = plugin_autocast
    autocast = _autocast_that_runs(plugin, precision, device_type)
    notes: tuple[str, ...] = ()
    if plugin_autocast is not None and autocast is None:
        notes = (f"FSDPPrecision({precision!r}) autocasts 'cuda' only; on {device_type} no autocast runs",)
    if mixed_precision is not None:
        param_dtype = getattr(mixed_precision, "param_dtype", None)
        weights = param_dtype if param_dtype is not None else weights_from_plugin
        source = (
            f"FSDPStrategy(mixed_precision=MixedPrecision(param_dtype={dtype_name(param_dtype)})), "
            f"precision={precision!r}"
        )
    else:
        weights = weights_from_plugin
        source = f"{plugin_class_name(plugin)}(precision={precision!r}) under FSDP"
    return regime_from_dtypes(
        f"fsdp-{dtype_name(weights)}" if plugin_autocast is None else f"fsdp-{precision}",
        param_dtype=weights,
        autocast_dtype=autocast,
        device_type=device_type,
        source=source,
        notes=notes,
    )


def fsdp2_param_dtype(model) -> torch.dtype | None:
    """The compute dtype FSDP2 gathers the SRU layers' weights in: the ``param_dtype`` of the
    ``MixedPrecisionPolicy`` of the first recurrent layer's FSDP2 group (the layer's own, or
    the nearest sharded ancestor's); None when no policy sets one (or nothing is sharded)."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        return None
    if model is None:
        return None
    from sru_lightning.nn import iter_sru_cells

    owners = [module for module in model.modules() if isinstance(module, FSDPModule)]
    if not owners:
        return None
    cells = [cell for _, cell in iter_sru_cells(model)]
    chosen = None
    if cells:
        first = cells[0]
        for module in owners:
            if module is first or any(sub is first for sub in module.modules()):
                chosen = module  # the innermost owner wins: owners are listed outermost first
    chosen = chosen or owners[0]
    state = chosen._get_fsdp_state()
    policy = getattr(state, "_mp_policy", None)
    return getattr(policy, "param_dtype", None)


def fsdp2_regime(plugin_regime: Regime, model) -> Regime:
    """The plugin's regime with the weights FSDP2 really computes with."""
    param_dtype = fsdp2_param_dtype(model)
    if param_dtype is None or param_dtype == plugin_regime.param_dtype:
        return plugin_regime
    return regime_from_dtypes(
        f"fsdp2-{plugin_regime.name}",
        param_dtype=param_dtype,
        autocast_dtype=plugin_regime.autocast_dtype,
        device_type=plugin_regime.device_type,
        source=f"fully_shard(mp_policy=MixedPrecisionPolicy(param_dtype={dtype_name(param_dtype)})), "
        f"{plugin_regime.source}",
        notes=plugin_regime.notes,
    )
