"""SRUPrecisionCallback: one line in ``Trainer(callbacks=[...])`` sets the recurrence precision
policy of every SRU layer in the model, tells APEX about the recurrence, reports the decision,
and points out matmul shapes that keep half-precision matmuls off the tensor cores.
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

from .tensor_cores import (
    TENSOR_CORE_MULTIPLE,
    ShapeAdvice,
    TensorCoreShapeWarning,
    rows_of,
    should_advise_tensor_cores,
    tensor_core_advice,
)

__all__ = ["SRUPrecisionCallback"]

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
        self.report = self.format_report(self.regime)
        if self.verbose:
            rank_zero_info(self.report)
        for note in self.regime.notes:
            rank_zero_warn(f"SRUPrecisionCallback: {note}")
        if not self.layers and not self._warned_without_layers:
            # Once per callback: a fit followed by a validation of the same model says it once.
            self._warned_without_layers = True
            rank_zero_warn(
                f"SRUPrecisionCallback: {type(pl_module).__name__} holds no SRU layer "
                "(sru_lightning.nn.SRU / SRUCell / SRUpp); the callback has nothing to configure"
            )

    def format_report(self, regime: Regime) -> str:
        """The multi-line report logged once per fit."""
        shown = ", ".join(self.layers[:8]) + (f", ... ({len(self.layers) - 8} more)" if len(self.layers) > 8 else "")
        apex = ""
        if self.apex_registrations:
            kinds = sorted({kind for _, kind in self.apex_registrations})
            apex = f"\n  apex.amp     entry points registered as {'/'.join(kinds)} functions"
        return (
            f"SRU recurrence precision (policy {self.policy!r})\n"
            f"  regime       {regime.name} on {regime.device_type}, from {regime.source}\n"
            f"  dtypes       weights {dtype_name(regime.param_dtype)} | autocast "
            f"{dtype_name(regime.autocast_dtype)} | U {dtype_name(regime.u_dtype)}\n"
            f"  recurrence   storage {dtype_name(regime.storage_dtype(self.policy))} | "
            f"accumulation {dtype_name(regime.accumulation_dtype(self.policy))}\n"
            f"  SRU layers   {len(self.layers)}{': ' + shown if shown else ''}" + apex
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
