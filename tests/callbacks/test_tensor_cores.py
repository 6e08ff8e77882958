"""Tensor-core shape advisor: the decision logic on CPU, and once-per-fit warnings."""

import warnings

import lightning.pytorch as pl
import pytest
import torch
from helpers.tiny_trainer import tiny_trainer
from torch import nn

from sru_lightning.callbacks import SRUPrecisionCallback
from sru_lightning.callbacks.tensor_cores import (
    TensorCoreShapeWarning,
    should_advise_tensor_cores,
    tensor_core_advice,
)
from sru_lightning.nn import SRU, SRUCell
from sru_lightning.precision import regime_from_dtypes


def advice_for(cell, rows=None, name="layer"):
    return {a.dimension: a for a in tensor_core_advice([(name, cell)], {name: rows} if rows else None)}


def test_friendly_shapes_get_no_advice():
    assert advice_for(SRUCell(64, 64), rows=(32, 16)) == {}
    assert advice_for(SRUCell(64, 32, bidirectional=True), rows=(7, 8)) == {}  # 56 rows


def test_input_size_advice_names_the_value_to_use():
    advice = advice_for(SRUCell(300, 64), name="encoder.rnn.rnn_lst.0")
    assert set(advice) == {"input_size"}
    assert advice["input_size"].value == 300
    text = str(advice["input_size"])
    assert text.startswith("encoder.rnn.rnn_lst.0: input_size=300 is not a multiple of 8")
    assert "304" in text


def test_output_width_advice_accounts_for_directions_and_num_matrices():
    cell = SRUCell(45, 45)  # k = 3 (input == output): width 135
    assert cell.num_matrices == 3
    advice = advice_for(cell)["u_width"]
    assert advice.value == 135
    assert "45 x 3 = 135" in advice.suggestion and "hidden_size=48" in advice.suggestion

    cell = SRUCell(64, 45)  # k = 4: width 180 = 4 x 45; 46 x 4 = 184
    assert advice_for(cell)["u_width"].suggestion.endswith("use hidden_size=46 (46 x 4 = 184)")

    cell = SRUCell(64, 3, bidirectional=True)  # 6 x 4 = 24: already fine
    assert "u_width" not in advice_for(cell)


def test_rows_advice_suggests_batch_or_seq_len():
    advice = advice_for(SRUCell(64, 64), rows=(35, 13))["rows"]
    assert advice.value == 455
    assert advice.suggestion.endswith("use batch_size=16 or seq_len=40")


def test_projection_and_custom_m():
    cell = SRUCell(64, 64, n_proj=20)
    assert advice_for(cell)["projection_size"].suggestion.endswith("use n_proj=24")

    class Matmul(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(30, 90)

        def reset_parameters(self):
            self.linear.reset_parameters()

        def forward(self, x):
            return self.linear(x)

    # custom_m computes U itself: only the row count is the layer's business
    assert set(advice_for(SRUCell(30, 30, custom_m=Matmul()), rows=(3, 3))) == {"rows"}


def test_rows_advice_is_given_once_per_distinct_shape():
    cells = [(f"rnn.rnn_lst.{i}", SRUCell(64, 64)) for i in range(3)]
    rows = {name: (5, 3) for name, _ in cells}
    advice = tensor_core_advice(cells, rows)
    assert [a.dimension for a in advice] == ["rows"]
    assert advice[0].layer == "rnn.rnn_lst.0 (and 2 more layers)"


@pytest.mark.parametrize(
    "u_dtype, device, expected",
    [
        (torch.float16, "cuda", True),
        (torch.bfloat16, "cuda", True),
        (torch.float32, "cuda", False),
        (torch.float16, "cpu", False),
    ],
)
def test_advice_only_in_half_regimes_on_cuda(u_dtype, device, expected):
    regime = regime_from_dtypes("r", param_dtype=u_dtype, autocast_dtype=None, device_type=device, source="test")
    assert should_advise_tensor_cores(regime) is expected


class Awkward(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.rnn = SRU(12, 10, num_layers=1, batch_first=True)
        self.head = nn.Linear(10, 1)

    def training_step(self, batch, batch_idx):
        (x,) = batch
        h, _ = self.rnn(x)
        return self.head(h).square().mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def fit_awkward(callback, precision="bf16-mixed", max_steps=3):
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(9, 7, 12)), batch_size=3)
    trainer = tiny_trainer(precision=precision, max_steps=max_steps, callbacks=[callback])
    trainer.fit(Awkward(), data)


def test_a_fit_warns_once_naming_layer_and_values():
    callback = SRUPrecisionCallback(advise_tensor_cores=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit_awkward(callback)
    advice = [w for w in caught if issubclass(w.category, TensorCoreShapeWarning)]
    assert len(advice) == 1
    message = str(advice[0].message)
    # batch_first input (3, 7, 12): seq_len 7 x batch 3 = 21 rows
    assert "rnn.rnn_lst.0: seq_len x batch = 7 x 3 = 21 rows" in message
    assert "use batch_size=8 or seq_len=8" in message
    assert "input_size=12" in message and "16" in message
    assert "10 x 4 = 40" not in message  # 40 is a multiple of 8: no advice
    assert {a.dimension for a in callback.shape_advice} == {"rows", "input_size"}


def test_no_advice_on_cpu_by_default():
    callback = SRUPrecisionCallback()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit_awkward(callback, max_steps=1)
    assert not [w for w in caught if issubclass(w.category, TensorCoreShapeWarning)]
    assert callback.shape_advice == []
