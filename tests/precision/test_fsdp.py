"""FSDP: MixedPrecision(param_dtype=...) and FSDPPrecision resolve to the recurrence regime.

These read a strategy object not yet attached to devices, which is read as configured for
CUDA; the real CPU-process fits (tests/strategies/test_engines.py) check the report of attached ones."""

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
    strategy = FSDPStrategy(
        mixed_precision=MixedPrecision(reduce_dtype=torch.float16), precision_plugin=FSDPPrecision("bf16-true")
    )
    assert detect_regime(strategy).param_dtype == torch.bfloat16


@pytest.mark.parametrize(
    "precision, weights, autocast",
    [
        ("bf16-mixed", torch.bfloat16, torch.bfloat16),
        ("16-mixed", torch.float16, torch.float16),
        ("bf16-true", torch.bfloat16, None),
        ("32-true", torch.float32, None),
    ],
)
def test_fsdp_precision_plugin_alone(precision, weights, autocast):
    regime = detect_regime(FSDPStrategy(precision_plugin=FSDPPrecision(precision)))
    assert (regime.param_dtype, regime.autocast_dtype) == (weights, autocast)
    assert regime.storage_dtype("auto") == (weights if weights != torch.float32 else torch.float32)


def test_fsdp2_policy_applied_by_the_user_is_what_the_report_and_the_kernels_say(tmp_path):
    """fully_shard(mp_policy=bf16) under a 32-true Trainer: the layers compute in bf16, and
    the regime says bf16 storage, as the kernel calls traced in a forward and backward."""
    import torch.distributed as dist
    from lightning.pytorch.plugins.precision import Precision
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from sru_lightning.nn import SRU
    from sru_lightning.ops import trace_storage_dtypes
    from sru_lightning.precision.fsdp import fsdp2_regime
    from sru_lightning.precision.lightning import plugin_regime

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        model = SRU(8, 8, num_layers=2)
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for layer in model.rnn_lst:
            fully_shard(layer, mp_policy=policy)
        fully_shard(model, mp_policy=policy)
        regime = fsdp2_regime(plugin_regime(Precision(), "cpu"), model)
        with trace_storage_dtypes() as calls:
            output, _ = model(torch.randn(5, 3, 8))
            output.float().sum().backward()
    finally:
        dist.destroy_process_group()
    assert regime.param_dtype == torch.bfloat16 and regime.storage_dtype("auto") == torch.bfloat16
    assert "MixedPrecisionPolicy(param_dtype=bfloat16)" in regime.source
    assert {call.storage_dtype for call in calls} == {torch.bfloat16}
    assert {call.direction for call in calls} >= {"forward", "backward"}
