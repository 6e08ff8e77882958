"""DeepSpeed: a Trainer built with DeepSpeedStrategy resolves to the right regime for each of
the fp16 / bf16 / amp / torch_autocast config sections. The fit itself runs in the cuda tier."""

import importlib.util

import pytest
import torch
from lightning.pytorch import Trainer
from lightning.pytorch.strategies import DeepSpeedStrategy

from sru_lightning.precision import detect_regime

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("deepspeed") is None, reason="needs deepspeed: pip install 'sru_lightning[deepspeed]'"
)


def deepspeed_trainer(config, precision="32-true", accelerator="cpu", **kwargs):
    return Trainer(
        accelerator=accelerator,
        devices=1,
        strategy=DeepSpeedStrategy(config=config),
        precision=precision,
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        **kwargs,
    )


@pytest.mark.parametrize(
    "config, name, weights, u_dtype",
    [
        ({"fp16": {"enabled": True}}, "deepspeed-fp16", torch.float16, torch.float16),
        ({"bf16": {"enabled": True}}, "deepspeed-bf16", torch.bfloat16, torch.bfloat16),
        ({"bfloat16": {"enabled": True}}, "deepspeed-bf16", torch.bfloat16, torch.bfloat16),
        ({"amp": {"enabled": True, "opt_level": "O1"}}, "deepspeed-apex-O1", torch.float32, torch.float16),
        ({"amp": {"enabled": True, "opt_level": "O2"}}, "deepspeed-apex-O2", torch.float16, torch.float16),
        (
            {"torch_autocast": {"enabled": True, "dtype": "bfloat16"}},
            "deepspeed-torch_autocast",
            torch.float32,
            torch.bfloat16,
        ),
        ({"fp16": {"enabled": False}}, "deepspeed-fp32", torch.float32, torch.float32),
        ({}, "deepspeed-fp32", torch.float32, torch.float32),
    ],
)
def test_deepspeed_config_sections(config, name, weights, u_dtype):
    regime = detect_regime(deepspeed_trainer(config))
    assert (regime.name, regime.param_dtype, regime.u_dtype) == (name, weights, u_dtype)
    assert regime.storage_dtype("auto") == (u_dtype if u_dtype != torch.float32 else torch.float32)
    assert regime.storage_dtype("fp32") == torch.float32
    assert regime.accumulation_dtype("auto") == torch.float32


def test_amp_section_registers_as_apex_and_warns_when_deepspeed_dropped_it():
    regime = detect_regime(deepspeed_trainer({"amp": {"enabled": True}}))
    assert regime.apex_opt_level == "O1"
    from deepspeed.runtime import config as deepspeed_config

    if "amp" in getattr(deepspeed_config, "_REMOVED_TOP_LEVEL_CONFIG_KEYS", {}):
        assert any("removed the 'amp'" in note for note in regime.notes)


@pytest.mark.parametrize(
    "precision, name",
    [
        ("16-mixed", "deepspeed-fp16"),
        ("16-true", "deepspeed-fp16"),
        ("bf16-mixed", "deepspeed-bf16"),
        ("bf16-true", "deepspeed-bf16"),
    ],
)
def test_precision_flag_counts_as_the_section_lightning_adds_at_setup(precision, name):
    regime = detect_regime(deepspeed_trainer({}, precision=precision))
    assert regime.name == name
    assert "added by Lightning" in regime.source


def test_explicit_section_wins_over_the_precision_flag():
    # Lightning adds "fp16" only when the config has no "fp16" key; a disabled one stays off.
    regime = detect_regime(deepspeed_trainer({"fp16": {"enabled": False}}, precision="16-mixed"))
    assert regime.name == "deepspeed-fp32"


def test_bad_torch_autocast_dtype_names_the_config_key():
    with pytest.raises(ValueError, match=r"`torch_autocast.dtype` must be one of .* got 'fp8'"):
        detect_regime(deepspeed_trainer({"torch_autocast": {"enabled": True, "dtype": "fp8"}}))


@pytest.mark.cuda
@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: torch.cuda.is_available() is False")
@pytest.mark.parametrize("section, dtype", [("fp16", torch.float16), ("bf16", torch.bfloat16)])
def test_deepspeed_fit_runs_the_recurrence_in_the_config_dtype(section, dtype):
    import lightning.pytorch as pl
    from torch import nn

    from sru_lightning.callbacks import SRUPrecisionCallback
    from sru_lightning.nn import SRU
    from sru_lightning.ops import trace_storage_dtypes

    class TinyLM(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(32, 16)
            self.rnn = SRU(16, 16, num_layers=2)
            self.head = nn.Linear(16, 32)
            self.losses = []

        def training_step(self, batch, batch_idx):
            tokens, targets = batch
            h, _ = self.rnn(self.embed(tokens).transpose(0, 1))
            logits = self.head(h.transpose(0, 1)).float()
            loss = nn.functional.cross_entropy(logits.reshape(-1, 32), targets.reshape(-1))
            self.losses.append(loss.item())
            return loss

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-2, eps=1e-4)

    tokens = torch.randint(0, 32, (16, 8))
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(tokens, (tokens + 1) % 32), batch_size=8)
    model, callback = TinyLM(), SRUPrecisionCallback()
    trainer = deepspeed_trainer(
        {section: {"enabled": True}, "train_micro_batch_size_per_gpu": 8},
        accelerator="cuda",
        max_steps=20,
        callbacks=[callback],
    )
    with trace_storage_dtypes() as calls:
        trainer.fit(model, data)
    assert callback.regime.name == f"deepspeed-{section}"
    assert {call.storage_dtype for call in calls} == {dtype}
    assert {call.device_type for call in calls} == {"cuda"}
    assert model.losses[-1] < model.losses[0]


def test_torch_autocast_without_dtype_uses_the_devices_autocast_default():
    regime = detect_regime(deepspeed_trainer({"torch_autocast": {"enabled": True}}))
    assert regime.autocast_dtype == torch.get_autocast_dtype("cpu") == torch.bfloat16
