"""The regime of APEX AMP: initialised by the user (``amp.initialize(..., opt_level=...)``) or
asked for by a DeepSpeed ``amp`` section."""

from __future__ import annotations

import torch

from sru_lightning.precision.apex_support import initialized_apex_properties

from .regime import Regime, regime_from_dtypes

__all__ = ["apex_regime", "initialized_apex_properties"]


def apex_regime(
    opt_level: str,
    cast_model_type,
    device_type: str,
    source: str,
    notes: tuple[str, ...] = (),
    name_prefix: str = "",
) -> Regime:
    if opt_level == "O0":
        weights, u_dtype = torch.float32, torch.float32
    elif opt_level == "O1":
        # O1 keeps fp32 weights and patches matmul-like functions to run in fp16.
        weights, u_dtype = torch.float32, torch.float16
    else:
        weights = cast_model_type if isinstance(cast_model_type, torch.dtype) else torch.float16
        u_dtype = weights
    return regime_from_dtypes(
        f"{name_prefix}apex-{opt_level}",
        param_dtype=weights,
        autocast_dtype=None,
        u_dtype=u_dtype,
        device_type=device_type,
        source=source,
        apex_opt_level=opt_level,
        notes=notes,
    )
