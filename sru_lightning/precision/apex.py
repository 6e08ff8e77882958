"""NVIDIA APEX AMP and the SRU recurrence: registering the recurrence with ``apex.amp``, and
reading the precision regime APEX sets up.

**Registration.** APEX AMP O1 patches torch functions so that matmuls run in fp16 while the
weights stay fp32. The recurrence is not one of the functions APEX knows, so without help it
receives an fp16 U next to fp32 weights and an fp32 skip input. The op boundary casts every
input to one storage dtype, so that is already correct; registering the two entry points of
``sru_lightning.ops.functional`` with APEX additionally makes APEX's own casting agree with
the policy (and lets APEX cache the casts):

==============  ==========================================
policy          registration
==============  ==========================================
``auto/half``   ``apex.amp.register_half_function``
``fp32``        ``apex.amp.register_float_function``
==============  ==========================================

APEX applies its registry inside ``amp.initialize`` (and then empties it), so registration
must happen BEFORE ``amp.initialize``::

    from sru_lightning.precision.apex import register_with_apex
    register_with_apex(policy="auto")
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")

:class:`sru_lightning.callbacks.SRUPrecisionCallback` calls it in its ``setup`` hook, which
runs before DeepSpeed's ``amp.initialize`` and before ``configure_optimizers``.

**The regime.** :func:`apex_regime` is the regime of APEX AMP at an opt level, initialised by
the user (:func:`initialized_apex_properties`) or asked for by a DeepSpeed ``amp`` section.
"""

from __future__ import annotations

import importlib
import warnings
import weakref

import torch

from .regime import Regime, regime_from_dtypes

__all__ = [
    "ENTRY_POINTS",
    "apex_amp",
    "apex_regime",
    "initialized_apex_properties",
    "registration_kind",
    "register_with_apex",
]

ENTRY_POINTS = ("sru_recurrence", "sru_recurrence_inference")

# apex.amp module -> {entry point name: "half" | "float"} registered with it so far
_registered: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def apex_amp():
    """The ``apex.amp`` module, or None when APEX is not importable."""
    try:
        return importlib.import_module("apex.amp")
    except ImportError:
        return None


def initialized_apex_properties():
    """APEX AMP's option set once ``amp.initialize`` ran with ``enabled=True``, else None.

    The object has ``opt_level`` ("O0".."O3") and ``cast_model_type`` attributes
    (``apex.amp._amp_state.opt_properties``).
    """
    amp = apex_amp()
    if amp is None:
        return None
    state = getattr(amp, "_amp_state", None)
    # apex.amp re-exports the state object under the name of its module; accept either.
    state = getattr(state, "_amp_state", state)
    properties = getattr(state, "opt_properties", None)
    if properties is None or not getattr(properties, "enabled", False):
        return None
    if getattr(properties, "opt_level", None) is None:
        return None
    return properties


def registration_kind(policy: str) -> str:
    """``"half"`` or ``"float"``: how APEX should cast the recurrence under ``policy``."""
    from sru_lightning.ops.storage_dtype import validate_policy

    return "float" if validate_policy(policy) == "fp32" else "half"


def register_with_apex(policy: str = "auto", *, amp=None) -> list[tuple[str, str]]:
    """Register both recurrence entry points with APEX AMP for ``policy``.

    Call it before ``amp.initialize``. Returns ``[(entry point, "half" | "float"), ...]``,
    empty when APEX is not importable. Registering again with the same policy is harmless
    (APEX keeps a set).
    ``amp`` overrides the ``apex.amp`` module (for wrappers that vendor APEX).
    """
    kind = registration_kind(policy)
    amp = amp if amp is not None else apex_amp()
    if amp is None:
        return []

    from sru_lightning.ops import functional

    if initialized_apex_properties() is not None:
        warnings.warn(
            "register_with_apex: APEX AMP is already initialised; APEX applies function "
            "registrations inside amp.initialize, so call register_with_apex (or add "
            "SRUPrecisionCallback) before amp.initialize. The recurrence still casts its "
            "inputs to one dtype at the op boundary, so results stay correct.",
            RuntimeWarning,
            stacklevel=2,
        )
    register = amp.register_float_function if kind == "float" else amp.register_half_function
    registered = _registered.setdefault(amp, {})
    done = []
    for name in ENTRY_POINTS:
        previous = registered.get(name)
        if previous not in (None, kind):
            warnings.warn(
                f"register_with_apex: `{name}` was registered with APEX as a {previous} function "
                f"and is now registered as a {kind} function (policy={policy!r}); APEX applies "
                "both, the last one wins",
                RuntimeWarning,
                stacklevel=2,
            )
        register(functional, name)
        registered[name] = kind
        done.append((name, kind))
    return done


def apex_regime(
    opt_level: str,
    cast_model_type,
    device_type: str,
    source: str,
    notes: tuple[str, ...] = (),
    name_prefix: str = "",
) -> Regime:
    """The regime of APEX AMP at ``opt_level``: O0 is float32, O1 keeps the weights float32 and
    runs matmuls in fp16, O2/O3 cast the weights to ``cast_model_type`` (fp16 by default)."""
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
