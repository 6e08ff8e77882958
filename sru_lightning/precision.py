"""Which precision regime a Lightning Trainer trains in, and what that means for the recurrence.

An SRU layer is a matmul (``U = x @ W``) followed by a custom recurrence kernel. The matmul's
output dtype -- A, "the U dtype" -- follows the weights' dtype and the active autocast (or
APEX's function patching); the kernel then stores its tensors in a dtype picked by the
recurrence policy (``sru_lightning.ops.resolve_storage_dtype``) and accumulates in float32.

:func:`detect_regime` reads a Trainer (or a strategy, or a precision plugin) and returns a
:class:`Regime`: the weights' dtype, the autocast dtype, the expected U dtype and, for every
policy, the storage and accumulation dtypes the kernel will run in. Sources, most specific
first:

* DeepSpeed (read by :mod:`sru_lightning.deepspeed_regime`): the config sections ``amp``
  (APEX AMP inside DeepSpeed), ``fp16``, ``bf16`` (alias ``bfloat16``) and ``torch_autocast``;
  a section Lightning will add at setup from ``precision=`` counts as present.
* FSDP: ``FSDPStrategy(mixed_precision=MixedPrecision(param_dtype=...))``, else the plugin.
* The precision plugin: ``Precision`` (32-true), ``DoublePrecision``, ``MixedPrecision``
  (16-mixed / bf16-mixed), ``HalfPrecision`` (16-true / bf16-true),
  ``TransformerEnginePrecision``, ``BitsandbytesPrecision``, or a plugin's precision string.
* APEX AMP initialised by the user (``amp.initialize(..., opt_level="O1")``) on top of a
  32-true Trainer.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Mapping

import torch

from sru_lightning.apex_support import initialized_apex_properties
from sru_lightning.ops.policy import (
    HALF_DTYPES,
    POLICIES,
    accumulation_dtype,
    resolve_storage_dtype,
    validate_policy,
)

__all__ = ["Regime", "detect_regime", "regime_from_dtypes", "dtype_name"]


def dtype_name(dtype: torch.dtype | None) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``; None -> ``"off"``."""
    return "off" if dtype is None else str(dtype).replace("torch.", "")


@dataclasses.dataclass(frozen=True)
class Regime:
    """A precision regime as the SRU recurrence sees it.

    Attributes:
        name: short label, e.g. ``"bf16-mixed"``, ``"deepspeed-fp16"``, ``"apex-O1"``.
        param_dtype: dtype of the weights during the forward pass.
        autocast_dtype: dtype of the active ``torch.autocast`` (None when off).
        u_dtype: dtype the input matmul produces, i.e. what reaches the recurrence as U.
        device_type: ``"cpu"``, ``"cuda"``, ...
        source: what the regime was read from, in words.
        storage_dtypes: policy -> dtype the kernel stores tensors in.
        accumulation_dtypes: policy -> dtype the kernel accumulates in.
        apex_opt_level: APEX AMP opt level ("O0".."O3") when APEX does the casting.
        notes: remarks worth logging (conflicts, unsupported combinations).
    """

    name: str
    param_dtype: torch.dtype
    autocast_dtype: torch.dtype | None
    u_dtype: torch.dtype
    device_type: str
    source: str
    storage_dtypes: Mapping[str, torch.dtype] = dataclasses.field(hash=False)
    accumulation_dtypes: Mapping[str, torch.dtype] = dataclasses.field(hash=False)
    apex_opt_level: str | None = None
    notes: tuple[str, ...] = ()

    @property
    def is_half(self) -> bool:
        """True when the matmul runs in fp16/bf16 (the regimes where tensor cores matter)."""
        return self.u_dtype in HALF_DTYPES

    def storage_dtype(self, policy: str = "auto") -> torch.dtype:
        """Dtype the recurrence kernel stores its tensors in under ``policy``."""
        return self.storage_dtypes[validate_policy(policy)]

    def accumulation_dtype(self, policy: str = "auto") -> torch.dtype:
        """Dtype the recurrence kernel accumulates in under ``policy``."""
        return self.accumulation_dtypes[validate_policy(policy)]

    def describe(self, policy: str = "auto") -> str:
        """One line: regime, where it came from, dtypes along the way."""
        text = (
            f"regime {self.name!r} on {self.device_type} (from {self.source}): "
            f"weights {dtype_name(self.param_dtype)}, autocast {dtype_name(self.autocast_dtype)}, "
            f"U {dtype_name(self.u_dtype)}; policy {policy!r} -> recurrence storage "
            f"{dtype_name(self.storage_dtype(policy))}, accumulation "
            f"{dtype_name(self.accumulation_dtype(policy))}"
        )
        if self.apex_opt_level is not None:
            text += f"; APEX AMP {self.apex_opt_level}"
        return text


@contextlib.contextmanager
def _autocast_off():
    # resolve_storage_dtype consults the live autocast state; a regime must not depend on
    # where detect_regime happens to be called from.
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.autocast("cpu", enabled=False))
        if torch.cuda.is_available():
            stack.enter_context(torch.autocast("cuda", enabled=False))
        yield


def regime_from_dtypes(
    name: str,
    *,
    param_dtype: torch.dtype,
    autocast_dtype: torch.dtype | None,
    device_type: str,
    source: str,
    u_dtype: torch.dtype | None = None,
    apex_opt_level: str | None = None,
    notes: tuple[str, ...] = (),
) -> Regime:
    """Build a :class:`Regime`; U's dtype defaults to the autocast dtype, else the weights'."""
    if u_dtype is None:
        u_dtype = autocast_dtype if autocast_dtype is not None else param_dtype
    with _autocast_off():
        storage = {policy: resolve_storage_dtype(policy, u_dtype) for policy in POLICIES}
    accumulation = {policy: accumulation_dtype(dtype) for policy, dtype in storage.items()}
    return Regime(
        name=name,
        param_dtype=param_dtype,
        autocast_dtype=autocast_dtype,
        u_dtype=u_dtype,
        device_type=device_type,
        source=source,
        storage_dtypes=storage,
        accumulation_dtypes=accumulation,
        apex_opt_level=apex_opt_level,
        notes=tuple(notes),
    )


# Lightning precision strings -> (weights dtype, autocast dtype).
_PRECISION_STRINGS: dict[str, tuple[torch.dtype, torch.dtype | None]] = {
    "64-true": (torch.float64, None),
    "32-true": (torch.float32, None),
    "16-true": (torch.float16, None),
    "bf16-true": (torch.bfloat16, None),
    "16-mixed": (torch.float32, torch.float16),
    "bf16-mixed": (torch.float32, torch.bfloat16),
}


def _device_type(strategy, plugin) -> str:
    plugin_device = getattr(plugin, "device", None)
    if isinstance(plugin_device, str):
        return torch.device(plugin_device).type
    if strategy is not None:
        try:
            return strategy.root_device.type
        except Exception:  # a strategy not attached to an accelerator yet has no root device
            pass
    return "cuda" if torch.cuda.is_available() else "cpu"


def _unpack(obj):
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


def detect_regime(trainer) -> Regime:
    """The precision regime ``trainer`` trains in (see the module docstring for the sources).

    ``trainer`` may also be a ``Strategy`` or a precision plugin. APEX AMP counts once
    ``amp.initialize`` has run, so call this again after it (the callback does, at fit start).
    """
    strategy, plugin = _unpack(trainer)
    device_type = _device_type(strategy, plugin)

    from lightning.pytorch.strategies import DeepSpeedStrategy, FSDPStrategy

    if isinstance(strategy, DeepSpeedStrategy):
        from sru_lightning.deepspeed_regime import deepspeed_regime

        return deepspeed_regime(strategy.config, plugin.precision, device_type)
    if isinstance(strategy, FSDPStrategy):
        # Lightning runs FSDP on CUDA only (and FSDPPrecision autocasts "cuda").
        return _fsdp_regime(strategy.mixed_precision, plugin, "cuda")

    regime = _plugin_regime(plugin, device_type)
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


# --------------------------------------------------------------------------- plugins


def _plugin_regime(plugin, device_type: str) -> Regime:
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
            source=f"{plugin_name}(weights_dtype={dtype_name(weights)}, "
            f"fallback_compute_dtype={dtype_name(fallback)})",
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
    dtypes = _PRECISION_STRINGS.get(precision)
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


# --------------------------------------------------------------------------- FSDP


def _fsdp_regime(mixed_precision, plugin, device_type: str) -> Regime:
    precision = str(getattr(plugin, "precision", "32-true"))
    weights_from_plugin, autocast = _PRECISION_STRINGS.get(precision, (torch.float32, None))
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


# --------------------------------------------------------------------------- APEX


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
