"""The Regime type: a precision regime as the SRU recurrence sees it, and how to build one
from dtypes. The bottom of the precision package: the readers of Lightning, DeepSpeed, FSDP
and APEX setups build their answers from this module and import nothing else of the package.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Mapping

import torch

from sru_lightning.ops.storage_dtype import (
    HALF_DTYPES,
    POLICIES,
    accumulation_dtype,
    resolve_storage_dtype,
    validate_policy,
)

__all__ = ["PRECISION_STRINGS", "Regime", "dtype_name", "regime_from_dtypes"]


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
PRECISION_STRINGS: dict[str, tuple[torch.dtype, torch.dtype | None]] = {
    "64-true": (torch.float64, None),
    "32-true": (torch.float32, None),
    "16-true": (torch.float16, None),
    "bf16-true": (torch.bfloat16, None),
    "16-mixed": (torch.float32, torch.float16),
    "bf16-mixed": (torch.float32, torch.bfloat16),
}


def plugin_class_name(plugin) -> str:
    """The name of the Lightning plugin class a plugin is (or extends): a report says
    ``FSDPPrecision`` under the Trainer and under Fabric alike, whichever subclass of it the
    strategy runs (:mod:`sru_lightning.strategies` adapts Lightning's for CPU processes)."""
    for cls in type(plugin).__mro__:
        if cls.__module__.startswith("lightning."):
            return cls.__name__
    return type(plugin).__name__
