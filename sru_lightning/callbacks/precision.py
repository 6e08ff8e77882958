"""SRUPrecisionCallback: one line in ``Trainer(callbacks=[...])`` sets the recurrence precision
policy of every SRU layer in the model, tells APEX about the recurrence, reports the decision,
and points out matmul shapes that keep half-precision matmuls off the tensor cores.

SRUFabricPrecision does the same for a loop written with ``lightning.fabric.Fabric``, with the
same rule (:func:`sru_lightning.precision.detect_regime` reads Fabric's plugins and strategies
too) and the same report (:func:`format_precision_report`). It is not a Lightning Callback:
Fabric calls any object's methods by name, and the one hook Fabric calls by itself is
``on_after_setup``, at the end of ``fabric.setup(model, *optimizers)`` (the module converted to
its precision's dtype and wrapped, no forward run yet). ``fabric.setup_module`` calls no hook;
after it, call :func:`apply_precision` (or :meth:`SRUFabricPrecision.apply`).
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.types import STEP_OUTPUT
from typing_extensions import override

from sru_lightning.nn import SRU, SRUCell, SRUpp, SRUppCell, iter_sru_cells, set_recurrence_policy
from sru_lightning.ops.storage_dtype import validate_policy
from sru_lightning.precision import Regime, detect_regime, dtype_name
from sru_lightning.precision.apex import register_with_apex
from sru_lightning.precision.cpu_half import cpu_half_advice

from .tensor_cores import (
    TENSOR_CORE_MULTIPLE,
    ShapeAdvice,
    TensorCoreShapeWarning,
    rows_of,
    should_advise_tensor_cores,
    tensor_core_advice,
)

__all__ = ["SRUFabricPrecision", "SRUPrecisionCallback", "apply_precision", "format_precision_report"]

# How many layer names the report spells out before it counts the rest.
SHOWN_LAYERS = 8


def format_precision_report(
    regime: Regime,
    policy: str,
    layers: list[str],
    apex_registrations: list[tuple[str, str]] = (),
    cpu_advice: str | None = None,
) -> str:
    """The multi-line report of a decision, the same text under a Trainer and under Fabric:
    the regime and where it was read from, the dtypes along the way, the recurrence's storage
    and accumulation dtypes under ``policy``, the SRU layers that got the policy, when APEX
    is importable, how the recurrence is registered with it and, for a half-precision regime
    on a CPU without native half arithmetic, ``cpu_advice`` (:func:`cpu_advice_for`)."""
    shown = ", ".join(layers[:SHOWN_LAYERS])
    if len(layers) > SHOWN_LAYERS:
        shown += f", ... ({len(layers) - SHOWN_LAYERS} more)"
    apex = ""
    if apex_registrations:
        kinds = sorted({kind for _, kind in apex_registrations})
        apex = f"\n  apex.amp     entry points registered as {'/'.join(kinds)} functions"
    return (
        f"SRU recurrence precision (policy {policy!r})\n"
        f"  regime       {regime.name} on {regime.device_type}, from {regime.source}\n"
        f"  dtypes       weights {dtype_name(regime.param_dtype)} | autocast "
        f"{dtype_name(regime.autocast_dtype)} | U {dtype_name(regime.u_dtype)}\n"
        f"  recurrence   storage {dtype_name(regime.storage_dtype(policy))} | "
        f"accumulation {dtype_name(regime.accumulation_dtype(policy))}\n"
        f"  SRU layers   {len(layers)}{': ' + shown if shown else ''}"
        + apex
        + (f"\n  CPU          {cpu_advice}" if cpu_advice else "")
    )


def cpu_advice_for(regime: Regime) -> str | None:
    """What a half-precision regime on CPU costs when the CPU lacks native arithmetic for its
    matmul dtype (:func:`sru_lightning.precision.cpu_half.cpu_half_advice`); None otherwise."""
    if regime.device_type != "cpu" or not regime.is_half:
        return None
    return cpu_half_advice(regime.u_dtype)


def _no_layers_warning(owner: str, module_name: str) -> str:
    return (
        f"{owner}: {module_name} holds no SRU layer "
        "(sru_lightning.nn.SRU / SRUCell / SRUpp); the callback has nothing to configure"
    )


# --------------------------------------------------------------------------- callback


class SRUPrecisionCallback(Callback):
    """Set the recurrence precision policy of every SRU layer and report the regime.

    Args:
        policy: ``"auto"`` (half storage in every half-precision regime, float32/float64
            otherwise), ``"fp32"`` (float32 storage, float64 for 64-true) or ``"half"``.
            Accumulation is float32 (float64 for float64 storage) under every policy.
        register_apex: register the recurrence with ``apex.amp`` when APEX is importable.
        advise_tensor_cores: warn once per fit about matmul dimensions that are not
            multiples of 8; None (default) does so in half-precision regimes on CUDA.
        verbose: log the regime/policy report at the start of each fit.

    Works with any LightningModule: SRU layers are found wherever they sit in the module
    tree. The report goes through Lightning's rank-zero logger; :attr:`regime`,
    :attr:`layers` and :attr:`report` keep the last decision for programmatic use.
    """

    def __init__(
        self,
        policy: str = "auto",
        *,
        register_apex: bool = True,
        advise_tensor_cores: bool | None = None,
        verbose: bool = True,
    ) -> None:
        super().__init__()
        self.policy = validate_policy(policy, argument="policy")
        if not isinstance(register_apex, bool):
            raise TypeError(f"SRUPrecisionCallback: `register_apex` must be a bool, got {register_apex!r}")
        if advise_tensor_cores is not None and not isinstance(advise_tensor_cores, bool):
            raise TypeError(
                f"SRUPrecisionCallback: `advise_tensor_cores` must be None or a bool, got {advise_tensor_cores!r}"
            )
        self.register_apex = register_apex
        self.advise_tensor_cores = advise_tensor_cores
        self.verbose = bool(verbose)
        self.regime: Regime | None = None
        self.layers: list[str] = []
        self.apex_registrations: list[tuple[str, str]] = []
        self.report: str = ""
        self.cpu_advice: str | None = None
        self.shape_advice: list[ShapeAdvice] = []
        self._reported = False
        self._rows: dict[str, tuple[int, int]] = {}
        self._hooks: list = []

    # ------------------------------------------------------------------ hooks
    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        # Before configure_optimizers and before DeepSpeed builds its engine: the only moment
        # APEX registration can still take effect.
        self._apply_policy(pl_module)
        if self.register_apex:
            self.apex_registrations = register_with_apex(self.policy)
        self._reported = False
        self._warned_without_layers = getattr(self, "_warned_without_layers", False)

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._apply_and_report(trainer, pl_module)
        if self._advising(trainer):
            self._watch_rows(pl_module)

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._apply_and_report(trainer, pl_module)

    @override
    def on_test_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._apply_and_report(trainer, pl_module)

    @override
    def on_predict_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._apply_and_report(trainer, pl_module)

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: STEP_OUTPUT, batch: Any, batch_idx: int
    ) -> None:
        if self._hooks:
            self._remove_hooks()
            self.shape_advice = tensor_core_advice(iter_sru_cells(pl_module), self._rows)
            if self.shape_advice:
                rank_zero_warn(self.format_shape_advice(self.shape_advice), category=TensorCoreShapeWarning)

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._remove_hooks()

    # ------------------------------------------------------------------ pieces
    def _apply_policy(self, pl_module) -> None:
        self.layers = [name for name, _ in set_recurrence_policy(pl_module, self.policy)]

    def _apply_and_report(self, trainer, pl_module) -> None:
        if self._reported:
            return
        self._reported = True
        # Again here: configure_model may have built layers after setup, and APEX may have
        # been initialised in configure_optimizers.
        self._apply_policy(pl_module)
        self.regime = detect_regime(trainer)
        self.cpu_advice = cpu_advice_for(self.regime)
        self.report = self.format_report(self.regime)
        if self.verbose:
            rank_zero_info(self.report)
        for note in self.regime.notes:
            rank_zero_warn(f"SRUPrecisionCallback: {note}")
        if not self.layers and not self._warned_without_layers:
            # Once per callback: a fit followed by a validation of the same model says it once.
            self._warned_without_layers = True
            rank_zero_warn(_no_layers_warning("SRUPrecisionCallback", type(pl_module).__name__))

    def format_report(self, regime: Regime) -> str:
        """The multi-line report logged once per fit (the same text Fabric's entry point logs)."""
        return format_precision_report(
            regime, self.policy, self.layers, self.apex_registrations, cpu_advice_for(regime)
        )

    @staticmethod
    def format_shape_advice(advice: list[ShapeAdvice]) -> str:
        lines = "\n".join(f"  - {item}" for item in advice)
        return (
            f"SRU layers have matmul dimensions that are not multiples of {TENSOR_CORE_MULTIPLE}, "
            f"which keeps half-precision matmuls off the tensor cores:\n{lines}"
        )

    def _advising(self, trainer) -> bool:
        if self.advise_tensor_cores is not None:
            return self.advise_tensor_cores
        return self.regime is not None and should_advise_tensor_cores(self.regime)

    def _watch_rows(self, pl_module) -> None:
        """Record (seq_len, batch) of every SRU layer during the first training batch."""
        self._remove_hooks()
        self._rows = {}
        for name, module in pl_module.named_modules():
            if isinstance(module, (SRU, SRUpp)):
                cell_names = [f"{name}.{sub}" if name else sub for sub, _ in iter_sru_cells(module)]
            elif isinstance(module, (SRUCell, SRUppCell)):
                cell_names = [name]
            else:
                continue

            def record(mod, inputs, cell_names=cell_names):
                rows = rows_of(inputs, getattr(mod, "batch_first", False))
                if rows is not None:
                    for cell_name in cell_names:
                        self._rows.setdefault(cell_name, rows)

            self._hooks.append(module.register_forward_pre_hook(record))

    def _remove_hooks(self) -> None:
        for handle in self._hooks:
            handle.remove()
        self._hooks = []


# --------------------------------------------------------------------------- Fabric


class SRUFabricPrecision:
    """Set the recurrence precision policy of every SRU layer of a Fabric model and report the
    regime, as :class:`SRUPrecisionCallback` does for a Trainer::

        fabric = Fabric(precision="bf16-mixed", callbacks=[SRUFabricPrecision()])
        model, optimizer = fabric.setup(model, optimizer)  # Fabric calls on_after_setup here

    Args:
        policy: ``"auto"``, ``"fp32"`` or ``"half"``, as for :class:`SRUPrecisionCallback`.
        register_apex: register the recurrence with ``apex.amp`` when APEX is importable (APEX
            applies registrations inside ``amp.initialize``: a loop that calls it before
            ``fabric.setup`` calls :func:`sru_lightning.precision.apex.register_with_apex`
            first).
        verbose: log the report through Lightning's rank-zero logger.

    :attr:`regime`, :attr:`layers` and :attr:`report` keep the last decision. The tensor-core
    shape advice needs a training-batch hook, which Fabric does not call: it is left out.
    """

    def __init__(self, policy: str = "auto", *, register_apex: bool = True, verbose: bool = True) -> None:
        self.policy = validate_policy(policy, argument="policy")
        if not isinstance(register_apex, bool):
            raise TypeError(f"SRUFabricPrecision: `register_apex` must be a bool, got {register_apex!r}")
        self.register_apex = register_apex
        self.verbose = bool(verbose)
        self.regime: Regime | None = None
        self.layers: list[str] = []
        self.apex_registrations: list[tuple[str, str]] = []
        self.report: str = ""
        self.cpu_advice: str | None = None
        self._warned_without_layers = False

    def on_after_setup(self, fabric, module) -> None:
        """Fabric's hook at the end of ``fabric.setup``."""
        self.apply(fabric, module)

    def apply(self, fabric, module) -> Regime:
        """Set the policy on every SRU layer of ``module`` (what ``fabric.setup`` or
        ``fabric.setup_module`` returned, or the plain module), read the regime of ``fabric``
        and log the report. Returns the regime."""
        from lightning.fabric import is_wrapped

        # The user's module inside Fabric's wrapper (outside DDP's too): layer names then read
        # as in the user's model, as the Trainer callback reports them.
        model = module.module if is_wrapped(module) else module
        self.layers = [name for name, _ in set_recurrence_policy(model, self.policy)]
        if self.register_apex:
            self.apex_registrations = register_with_apex(self.policy)
        self.regime = detect_regime(fabric, model)
        self.cpu_advice = cpu_advice_for(self.regime)
        self.report = format_precision_report(
            self.regime, self.policy, self.layers, self.apex_registrations, self.cpu_advice
        )
        if self.verbose:
            rank_zero_info(self.report)
        for note in self.regime.notes:
            rank_zero_warn(f"SRUFabricPrecision: {note}")
        if not self.layers and not self._warned_without_layers:
            # Once per callback: a loop that sets up a second model without SRU layers (a
            # discriminator, say) hears it once.
            self._warned_without_layers = True
            rank_zero_warn(_no_layers_warning("SRUFabricPrecision", type(model).__name__))
        return self.regime


def apply_precision(
    fabric, module, policy: str = "auto", *, register_apex: bool = True, verbose: bool = True
) -> SRUFabricPrecision:
    """Apply the recurrence policy to ``module`` under ``fabric`` and log the report, for a loop
    that sets its model up with ``fabric.setup_module`` (Fabric calls no hook there). Returns
    the :class:`SRUFabricPrecision` that did it (its ``regime``, ``layers`` and ``report``)."""
    callback = SRUFabricPrecision(policy, register_apex=register_apex, verbose=verbose)
    callback.apply(fabric, module)
    return callback
