"""What a DeepSpeed config means for the recurrence: the regime of its ``amp``, ``fp16``,
``bf16`` / ``bfloat16`` and ``torch_autocast`` sections (see :mod:`sru_lightning.precision`).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from sru_lightning.ops.storage_dtype import HALF_DTYPES

from .apex import apex_regime
from .regime import Regime, dtype_name, regime_from_dtypes

__all__ = ["AUTOCAST_NAMES", "amp_notes", "deepspeed_regime", "section_enabled"]


def section_enabled(config: Mapping, *keys: str) -> bool | None:
    """True/False when one of ``keys`` is a config section, None when none is present."""
    for key in keys:
        if key in config:
            section = config[key]
            if isinstance(section, Mapping):
                enabled = section.get("enabled", False)
            else:
                enabled = section
            if isinstance(enabled, str):
                return enabled.strip().lower() == "true"
            return bool(enabled)
    return None


# The spellings DeepSpeed's DtypeEnum accepts for torch_autocast.dtype.
AUTOCAST_NAMES = {
    **dict.fromkeys(("torch.float16", "fp16", "float16", "half"), torch.float16),
    **dict.fromkeys(("torch.bfloat16", "bf16", "bfloat16"), torch.bfloat16),
    **dict.fromkeys(("torch.float32", "fp32", "float32", "float"), torch.float32),
}


def deepspeed_regime(config, precision: str, device_type: str) -> Regime:
    """The regime of a DeepSpeed config: its ``amp`` section first, then ``fp16`` / ``bf16``
    (present, or added by Lightning for ``precision``), then ``torch_autocast``, else float32."""
    config = config if isinstance(config, Mapping) else {}
    if section_enabled(config, "amp"):
        return _amp_regime(config, device_type)
    regime = _half_section_regime(config, precision, device_type)
    if regime is not None:
        return regime
    if section_enabled(config, "torch_autocast"):
        return _torch_autocast_regime(config["torch_autocast"], device_type)
    return regime_from_dtypes(
        "deepspeed-fp32",
        param_dtype=torch.float32,
        autocast_dtype=None,
        device_type=device_type,
        source=f"DeepSpeed config without fp16/bf16/amp (precision={precision!r})",
    )


def _amp_regime(config: Mapping, device_type: str) -> Regime:
    """An ``amp`` section: APEX AMP at its ``opt_level`` (O1 by default), run by DeepSpeed."""
    section = config["amp"] if isinstance(config["amp"], Mapping) else {}
    opt_level = str(section.get("opt_level", "O1"))
    cast_model_type = torch.float16 if opt_level in ("O2", "O3") else torch.float32
    notes = amp_notes()
    return apex_regime(
        opt_level,
        cast_model_type,
        device_type,
        "DeepSpeed config section 'amp'",
        notes,
        name_prefix="deepspeed-",
    )


def _half_section_regime(config: Mapping, precision: str, device_type: str) -> Regime | None:
    """An enabled ``fp16`` or ``bf16`` section (weights in that dtype), else None."""
    # Lightning adds an "fp16" / "bf16" section at setup when the config has none and
    # precision= asks for it (lightning.fabric.strategies.deepspeed._format_precision_config).
    fp16 = section_enabled(config, "fp16")
    bf16 = section_enabled(config, "bf16", "bfloat16")
    from_precision = ""
    if fp16 is None and precision in ("16-mixed", "16-true"):
        fp16, from_precision = True, f" (added by Lightning for precision={precision!r})"
    elif bf16 is None and precision in ("bf16-mixed", "bf16-true") and not fp16:
        bf16, from_precision = True, f" (added by Lightning for precision={precision!r})"
    if not (fp16 or bf16):
        return None
    dtype = torch.float16 if fp16 else torch.bfloat16
    section = "fp16" if fp16 else "bf16"
    notes = ("DeepSpeed rejects fp16 and bf16 enabled together",) if fp16 and bf16 else ()
    return regime_from_dtypes(
        f"deepspeed-{section}",
        param_dtype=dtype,
        autocast_dtype=None,
        device_type=device_type,
        source=f"DeepSpeed config section {section!r}{from_precision}",
        notes=notes,
    )


def _torch_autocast_regime(section, device_type: str) -> Regime:
    """An enabled ``torch_autocast`` section: float32 weights under autocast to its ``dtype``."""
    # Without a dtype DeepSpeed calls torch.autocast(dtype=None): the device's default.
    default = "float16" if device_type == "cuda" else "bfloat16"
    raw = section.get("dtype", default) if isinstance(section, Mapping) else default
    autocast = raw if isinstance(raw, torch.dtype) else AUTOCAST_NAMES.get(str(raw).lower())
    if autocast is None:
        raise ValueError(
            "detect_regime: DeepSpeed config `torch_autocast.dtype` must be one of "
            f"{sorted(AUTOCAST_NAMES)}, got {raw!r}"
        )
    return regime_from_dtypes(
        "deepspeed-torch_autocast",
        param_dtype=torch.float32,
        autocast_dtype=autocast if autocast in HALF_DTYPES else None,
        device_type=device_type,
        source=f"DeepSpeed config section 'torch_autocast' (dtype={dtype_name(autocast)})",
    )


def amp_notes() -> tuple[str, ...]:
    """A note when the installed DeepSpeed no longer accepts the ``amp`` section."""
    try:
        from deepspeed.runtime import config as deepspeed_config
    except Exception:  # DeepSpeed not installed (or broken): nothing to say about it
        return ()
    removed = getattr(deepspeed_config, "_REMOVED_TOP_LEVEL_CONFIG_KEYS", {})
    if "amp" in removed:
        import deepspeed

        return (
            f"DeepSpeed {deepspeed.__version__} removed the 'amp' (APEX) config section and will "
            "reject this config; use 'fp16', 'bf16' or 'torch_autocast' instead",
        )
    return ()
