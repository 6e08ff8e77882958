"""FSDP: MixedPrecision(param_dtype=...) and FSDPPrecision resolve to the recurrence regime.

Lightning builds FSDP Trainers on CUDA only, so these read the strategy object itself."""

import pytest
import torch
from lightning.pytorch.plugins.precision import FSDPPrecision
from lightning.pytorch.strategies import FSDPStrategy
from torch.distributed.fsdp import MixedPrecision

from sru_lightning.precision import detect_regime


@pytest.mark.parametrize("param_dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_mixed_precision_param_dtype_sets_weights_and_storage(param_dtype):
    strategy = FSDPStrategy(
        mixed_precision=MixedPrecision(param_dtype=param_dtype), precision_plugin=FSDPPrecision("32-true")
    )
    regime = detect_regime(strategy)
    assert regime.param_dtype == param_dtype and regime.u_dtype == param_dtype
    assert regime.autocast_dtype is None
    assert regime.device_type == "cuda"
    assert regime.storage_dtype("auto") == param_dtype
    assert regime.storage_dtype("fp32") == torch.float32
    assert regime.accumulation_dtype("auto") == torch.float32
    assert "param_dtype=" in regime.source


def test_mixed_precision_without_param_dtype_keeps_the_plugins_dtype():
    strategy = FSDPStrategy(mixed_precision=MixedPrecision(reduce_dtype=torch.float16),
                            precision_plugin=FSDPPrecision("bf16-true"))
    assert detect_regime(strategy).param_dtype == torch.bfloat16


@pytest.mark.parametrize(
    "precision, weights, autocast",
    [("bf16-mixed", torch.bfloat16, torch.bfloat16), ("16-mixed", torch.float16, torch.float16),
     ("bf16-true", torch.bfloat16, None), ("32-true", torch.float32, None)],
)
def test_fsdp_precision_plugin_alone(precision, weights, autocast):
    regime = detect_regime(FSDPStrategy(precision_plugin=FSDPPrecision(precision)))
    assert (regime.param_dtype, regime.autocast_dtype) == (weights, autocast)
    assert regime.storage_dtype("auto") == (weights if weights != torch.float32 else torch.float32)
