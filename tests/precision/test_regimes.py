"""detect_regime on real Lightning Trainers and precision plugins (no fit: construction only)."""

import contextlib

import pytest
import torch
from helpers.tiny_trainer import tiny_trainer
from lightning.pytorch.plugins.precision import (
    DoublePrecision,
    HalfPrecision,
    MixedPrecision,
    Precision,
    TransformerEnginePrecision,
)

from sru_lightning.ops import resolve_storage_dtype
from sru_lightning.precision import Regime, detect_regime, regime_from_dtypes

F16, BF16, F32, F64 = torch.float16, torch.bfloat16, torch.float32, torch.float64


def cpu_trainer(precision):
    return tiny_trainer(precision=precision)


# precision flag -> (regime name, weights, autocast, U, storage under auto/fp32/half)
CPU_TABLE = {
    "32-true": ("32-true", F32, None, F32, (F32, F32, F32)),
    "64-true": ("64-true", F64, None, F64, (F64, F64, F32)),
    "bf16-mixed": ("bf16-mixed", F32, BF16, BF16, (BF16, F32, BF16)),
    "16-true": ("16-true", F16, None, F16, (F16, F32, F16)),
    "bf16-true": ("bf16-true", BF16, None, BF16, (BF16, F32, BF16)),
}


@pytest.mark.parametrize("flag", sorted(CPU_TABLE))
def test_trainer_precision_flags_map_to_the_design_table(flag):
    name, weights, autocast, u_dtype, (auto, fp32, half) = CPU_TABLE[flag]
    regime = detect_regime(cpu_trainer(flag))
    assert isinstance(regime, Regime)
    assert (regime.name, regime.param_dtype, regime.autocast_dtype, regime.u_dtype) == (
        name,
        weights,
        autocast,
        u_dtype,
    )
    assert regime.device_type == "cpu"
    assert regime.storage_dtypes == {"auto": auto, "fp32": fp32, "half": half}
    expected_accumulation = {p: (F64 if d == F64 else F32) for p, d in regime.storage_dtypes.items()}
    assert regime.accumulation_dtypes == expected_accumulation


def test_16_mixed_on_cpu_is_what_lightning_makes_of_it_bf16_mixed():
    with pytest.warns(UserWarning, match="Using `precision='bf16-mixed'` instead"):
        trainer = cpu_trainer("16-mixed")
    regime = detect_regime(trainer)
    assert regime.name == "bf16-mixed"
    assert regime.storage_dtype("auto") == BF16


def test_16_mixed_plugin_on_cuda_stores_fp16_with_float_accumulation():
    no_cuda = not torch.cuda.is_available()
    with pytest.warns(UserWarning, match="CUDA is not available") if no_cuda else contextlib.nullcontext():
        plugin = MixedPrecision("16-mixed", "cuda")
    regime = detect_regime(plugin)
    assert (regime.name, regime.device_type, regime.autocast_dtype) == ("16-mixed", "cuda", F16)
    assert regime.storage_dtype("auto") == F16 and regime.accumulation_dtype("auto") == F32
    assert regime.storage_dtype("fp32") == F32
    assert regime.is_half


def test_plain_plugins_and_strategy_objects_are_accepted():
    assert detect_regime(Precision()).name == "32-true"
    assert detect_regime(DoublePrecision()).u_dtype == F64
    assert detect_regime(HalfPrecision("bf16-true")).param_dtype == BF16
    trainer = cpu_trainer("bf16-true")
    assert detect_regime(trainer.strategy) == detect_regime(trainer)


def test_transformer_engine_regime_uses_weights_and_fallback_compute_dtype():
    # TransformerEnginePrecision needs transformer_engine to construct; the regime only reads
    # the two dtype attributes, so build the real class without running its __init__.
    plugin = TransformerEnginePrecision.__new__(TransformerEnginePrecision)
    plugin.weights_dtype = BF16
    plugin.fallback_compute_dtype = BF16
    regime = detect_regime(plugin)
    assert (regime.name, regime.device_type, regime.param_dtype, regime.u_dtype) == (
        "transformer-engine",
        "cuda",
        BF16,
        BF16,
    )
    assert regime.storage_dtype("auto") == BF16


def test_unknown_precision_string_is_reported_and_treated_as_32_true():
    class OddPrecision(Precision):
        precision = "transformer-engine-float16-odd"

    regime = detect_regime(OddPrecision())
    assert regime.name == "32-true"
    assert any("unknown precision" in note for note in regime.notes)


def test_detect_regime_rejects_other_objects_naming_the_argument():
    with pytest.raises(TypeError, match=r"`trainer` must be a lightning.pytorch Trainer.*got str"):
        detect_regime("bf16-mixed")


def test_regime_ignores_the_autocast_state_it_is_called_in():
    trainer = cpu_trainer("32-true")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        regime = detect_regime(trainer)
    assert regime.storage_dtype("half") == F32


def test_regime_storage_agrees_with_the_op_boundary_rule_under_the_regimes_autocast():
    # The kernel resolves its storage dtype at run time from U's dtype and the live autocast
    # state; the regime predicts it at setup. Both must agree.
    regime = detect_regime(cpu_trainer("bf16-mixed"))
    with torch.autocast("cpu", dtype=regime.autocast_dtype):
        u = torch.randn(4, 4) @ torch.randn(4, 4)
        assert u.dtype == regime.u_dtype
        for policy in ("auto", "fp32", "half"):
            assert resolve_storage_dtype(policy, u.dtype) == regime.storage_dtype(policy)


def test_regime_describe_and_bad_policy():
    regime = regime_from_dtypes("x", param_dtype=F32, autocast_dtype=F16, device_type="cuda", source="test")
    assert "storage float16, accumulation float32" in regime.describe("auto")
    with pytest.raises(ValueError, match=r"`policy` must be one of \('auto', 'fp32', 'half'\), got 'fp8'"):
        regime.storage_dtype("fp8")
