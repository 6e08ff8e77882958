"""SRUPrecisionCallback in real Trainer.fit runs on CPU, in every precision Lightning allows
there: the storage dtype the kernel ran in (traced), falling loss, no dtype error."""

import logging

import lightning.pytorch as pl
import pytest
import torch
from helpers.tiny_trainer import tiny_trainer
from lightning.pytorch import Trainer
from torch import nn

from sru_lightning.callbacks import SRUPrecisionCallback
from sru_lightning.nn import SRU, SRUCell
from sru_lightning.ops import trace_storage_dtypes

VOCAB = 16


class Encoder(nn.Module):
    """A user's own module that hides an SRU stack and a lone SRUCell a few levels down."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleDict({"recurrent": SRU(12, 16, num_layers=2)})
        self.refine = nn.Sequential(SRUCell(16, 16))

    def forward(self, x):
        h, _ = self.blocks["recurrent"](x)
        h, _ = self.refine[0](h)
        return h


class TinyLM(pl.LightningModule):
    """Learns next token = token + 1 (mod VOCAB): the loss falls within a few steps."""

    def __init__(self, optimizer="adam"):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 12)
        self.encoder = Encoder()
        self.head = nn.Linear(16, VOCAB)
        self.optimizer = optimizer
        self.losses = []

    def training_step(self, batch, batch_idx):
        tokens, targets = batch
        h = self.encoder(self.embed(tokens).transpose(0, 1))
        logits = self.head(h.transpose(0, 1)).float()
        loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self):
        # eps representable in fp16/bf16 weights (16-true / bf16-true keep Adam's state there)
        return torch.optim.Adam(self.parameters(), lr=3e-2, eps=1e-4)


def token_data():
    tokens = torch.randint(0, VOCAB, (8, 8), generator=torch.Generator().manual_seed(0))
    dataset = torch.utils.data.TensorDataset(tokens, (tokens + 1) % VOCAB)
    return torch.utils.data.DataLoader(dataset, batch_size=8)


def fit(precision, callback, max_steps=12, model=None):
    model = model or TinyLM()
    trainer = tiny_trainer(precision=precision, max_steps=max_steps, callbacks=[callback])
    with trace_storage_dtypes() as calls:
        trainer.fit(model, token_data())
    return model, calls


F16, BF16, F32, F64 = torch.float16, torch.bfloat16, torch.float32, torch.float64


@pytest.mark.slow
@pytest.mark.parametrize(
    "precision, policy, storage",
    [
        ("32-true", "auto", F32),
        ("64-true", "auto", F64),
        ("bf16-mixed", "auto", BF16),
        ("16-mixed", "auto", BF16),  # Lightning turns 16-mixed on CPU into bf16-mixed
        ("16-true", "auto", F16),
        ("bf16-true", "auto", BF16),
        ("bf16-mixed", "fp32", F32),
        ("32-true", "half", F32),  # nothing half to follow: float32
    ],
)
def test_fit_runs_the_recurrence_in_the_regimes_storage_dtype(precision, policy, storage):
    callback = SRUPrecisionCallback(policy)
    model, calls = fit(precision, callback)
    assert calls, "the recurrence never ran"
    assert {call.storage_dtype for call in calls} == {storage}
    assert {call.accumulation_dtype for call in calls} == {F64 if storage == F64 else F32}
    assert {"forward", "backward"} <= {call.direction for call in calls}
    assert callback.regime.storage_dtype(policy) == storage  # what was reported is what ran
    assert all(torch.isfinite(torch.tensor(model.losses)))
    assert sum(model.losses[-3:]) < sum(model.losses[:3]), model.losses


def test_policy_reaches_every_sru_layer_in_nested_user_modules():
    callback = SRUPrecisionCallback("fp32")
    model = TinyLM()
    callback.setup(tiny_trainer(), model, "fit")
    assert callback.layers == [
        "encoder.blocks.recurrent.rnn_lst.0",
        "encoder.blocks.recurrent.rnn_lst.1",
        "encoder.refine.0",
    ]
    assert {
        cell.recurrence_policy for cell in (model.encoder.refine[0], *model.encoder.blocks["recurrent"].rnn_lst)
    } == {"fp32"}


class BuiltLate(TinyLM):
    """Creates its SRU in configure_model (after the callback's setup hook)."""

    def __init__(self):
        super().__init__()
        self.encoder = None

    def configure_model(self):
        if self.encoder is None:
            self.encoder = Encoder()


def test_layers_created_in_configure_model_get_the_policy_and_report_is_logged_once(caplog):
    callback = SRUPrecisionCallback("fp32")
    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    logger.addHandler(caplog.handler)  # Lightning's logger may not propagate to the root
    try:
        with caplog.at_level(logging.INFO, logger="lightning.pytorch.utilities.rank_zero"):
            model, calls = fit("bf16-mixed", callback, max_steps=2, model=BuiltLate())
    finally:
        logger.removeHandler(caplog.handler)
    assert len(callback.layers) == 3
    assert {call.storage_dtype for call in calls} == {F32}
    # The record may reach caplog twice (our handler and root propagation): count records once.
    records = {id(r): r for r in caplog.records}.values()
    reports = [r.getMessage() for r in records if "SRU recurrence precision" in r.getMessage()]
    assert len(reports) == 1
    report = reports[0]
    assert "regime       bf16-mixed on cpu" in report
    assert "storage float32 | accumulation float32" in report
    assert "SRU layers   3: encoder.blocks.recurrent.rnn_lst.0" in report


def test_model_without_sru_layers_is_warned_about():
    class NoSRU(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            return self.layer(batch[0]).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(4, 4)), batch_size=2)
    trainer = tiny_trainer(max_steps=1, callbacks=[SRUPrecisionCallback()])
    with pytest.warns(UserWarning, match="NoSRU holds no SRU layer"):
        trainer.fit(NoSRU(), data)


def test_callback_arguments_are_checked():
    with pytest.raises(ValueError, match=r"`policy` must be one of \('auto', 'fp32', 'half'\), got 'bf16'"):
        SRUPrecisionCallback("bf16")
    with pytest.raises(TypeError, match="`advise_tensor_cores` must be None or a bool, got 'yes'"):
        SRUPrecisionCallback(advise_tensor_cores="yes")
    with pytest.raises(TypeError, match="`register_apex` must be a bool"):
        SRUPrecisionCallback(register_apex=1)


@pytest.mark.cuda
@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: torch.cuda.is_available() is False")
@pytest.mark.parametrize("precision, storage", [("16-mixed", F16), ("bf16-mixed", BF16), ("16-true", F16)])
def test_cuda_fit_runs_half_storage_and_advises_on_shapes(precision, storage):
    from sru_lightning.callbacks import TensorCoreShapeWarning

    callback = SRUPrecisionCallback()
    model = TinyLM()
    trainer = Trainer(
        accelerator="cuda",
        devices=1,
        precision=precision,
        max_steps=12,
        callbacks=[callback],
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    with trace_storage_dtypes() as calls, pytest.warns(TensorCoreShapeWarning, match="input_size=12"):
        trainer.fit(model, token_data())
    ours = [call for call in calls if call.device_type == "cuda"]
    assert ours and {call.storage_dtype for call in ours} == {storage}
    assert callback.regime.device_type == "cuda" and callback.regime.is_half
    assert sum(model.losses[-3:]) < sum(model.losses[:3]), model.losses


@pytest.mark.parametrize("flags, says", [({"avx2", "fma"}, True), ({"avx2", "avx512f", "avx512_bf16"}, False)])
def test_the_report_says_when_this_cpu_has_no_native_half_arithmetic(monkeypatch, flags, says):
    from sru_lightning.precision import cpu_half

    # A CPU without AVX512_BF16/AMX-BF16 (an AVX2 one) and one with it, as read from its flags.
    monkeypatch.setattr(cpu_half, "cpu_flags", lambda cpuinfo=None: frozenset(flags))
    monkeypatch.setattr(cpu_half, "half_matmul_slowdown", lambda dtype: 52.0)
    callback = SRUPrecisionCallback(verbose=False)
    fit("bf16-mixed", callback, max_steps=1)
    line = (
        "  CPU          no native bfloat16 arithmetic on this CPU (no AVX512_BF16 or AMX-BF16): "
        "a bfloat16 matmul measured 52x slower than float32; precision '32-true' trains faster"
    )
    assert (line in callback.report.splitlines()) is says, callback.report
    assert (callback.cpu_advice is not None) is says
    fit("32-true", callback, max_steps=1)  # nothing half: nothing to say
    assert "CPU " not in callback.report and callback.cpu_advice is None
