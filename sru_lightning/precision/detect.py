"""detect_regime: which precision regime a Trainer (or a Fabric) trains in, from the most
specific reader that applies (DeepSpeed, FSDP, the precision plugin, then APEX AMP on top)."""

from __future__ import annotations

import dataclasses

from .apex import apex_regime, initialized_apex_properties
from .deepspeed import deepspeed_regime
from .fsdp import fsdp2_regime, fsdp_regime
from .lightning import device_type_of, lightning_classes, plugin_regime, unpack_trainer
from .regime import Regime

__all__ = ["detect_regime"]


def detect_regime(trainer, model=None) -> Regime:
    """The precision regime ``trainer`` trains in (the sources, most specific
    first, are listed in the ``sru_lightning.precision`` package docstring).

    ``trainer`` may be a ``lightning.pytorch`` Trainer or a ``lightning.fabric`` Fabric, or a
    Strategy or a precision plugin of either. ``model`` is the module being trained, for a
    Fabric, whose strategy does not hold it (FSDP2 groups are read from it); a Trainer's
    strategy knows its LightningModule. APEX AMP counts once ``amp.initialize`` has run, so
    call this again after it (the callback does, at fit start).
    """
    strategy, plugin = unpack_trainer(trainer)
    device_type = device_type_of(strategy, plugin)

    if isinstance(strategy, lightning_classes("strategies", "DeepSpeedStrategy")):
        return deepspeed_regime(strategy.config, plugin.precision, device_type)
    if strategy is None and isinstance(plugin, lightning_classes("precision", "DeepSpeedPrecision")):
        # The plugin alone: a DeepSpeed strategy with a config Lightning fills in from it.
        return deepspeed_regime({}, plugin.precision, device_type)
    if strategy is None and isinstance(plugin, lightning_classes("precision", "FSDPPrecision")):
        # The plugin alone is read as an FSDP strategy not attached to devices yet (below).
        return fsdp_regime(None, plugin, "cuda")
    if isinstance(strategy, lightning_classes("strategies", "FSDPStrategy")):
        # Not attached to devices yet: FSDP's home is CUDA (Lightning's own class runs only
        # there); once attached, the devices it really runs on (CPU processes included).
        attached = bool(getattr(strategy, "parallel_devices", None))
        return fsdp_regime(strategy.mixed_precision, plugin, device_type if attached else "cuda")

    regime = plugin_regime(plugin, device_type)
    # FSDP2 (fully_shard, under ModelParallelStrategy or applied by the user) computes in
    # its MixedPrecisionPolicy's param_dtype whatever the plugin says about the weights.
    if model is None and strategy is not None:
        model = getattr(strategy, "lightning_module", None)
    regime = fsdp2_regime(regime, model)
    apex = initialized_apex_properties()
    if apex is None:
        return regime
    if regime.name != "32-true":
        note = (
            f"APEX AMP {apex.opt_level} is initialised on top of Lightning precision "
            f"{regime.name!r}; use one of the two (Lightning's AMP is the supported path)"
        )
        return dataclasses.replace(regime, notes=regime.notes + (note,))
    return apex_regime(apex.opt_level, apex.cast_model_type, device_type, "apex.amp.initialize by the user")
