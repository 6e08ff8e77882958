"""Bad input to SRUCell / SRU fails early with an error naming argument, expectation and value."""

from __future__ import annotations

import pytest
import torch

from sru_lightning.nn import SRU, SRUCell

L, B, D_IN, H = 4, 2, 6, 4


@pytest.fixture(params=["cell", "stack"])
def layer(request):
    if request.param == "cell":
        return SRUCell(D_IN, H, bidirectional=True)
    return SRU(D_IN, H, num_layers=2, bidirectional=True)


def test_wrong_input_rank(layer):
    with pytest.raises(ValueError, match=r"`input` must be 3-D .* got shape \(1, 4, 2, 6\)"):
        layer(torch.randn(1, L, B, D_IN))
    with pytest.raises(ValueError, match=r"`input` must be 3-D .* got shape \(6,\)"):
        layer(torch.randn(D_IN))


def test_input_size_mismatch(layer):
    with pytest.raises(ValueError, match=r"`input` last dimension must be input_size=6, got shape \(4, 2, 5\)"):
        layer(torch.randn(L, B, 5))


def test_integer_input(layer):
    with pytest.raises(TypeError, match=r"`input` must be a floating-point tensor .* got dtype torch.int64"):
        layer(torch.ones(L, B, D_IN, dtype=torch.long))


def test_non_tensor_input(layer):
    with pytest.raises(TypeError, match=r"`input` must be a torch.Tensor, got list"):
        layer([[1.0] * D_IN])


def test_c0_wrong_shape():
    expected = r"SRU: `c0` must have shape \(2, 2, 8\) \(num_layers, batch, dirs\*hidden_size\), got \(2, 8\)"
    with pytest.raises(ValueError, match=expected):
        SRU(D_IN, H, bidirectional=True)(torch.randn(L, B, D_IN), torch.randn(B, 2 * H))
    with pytest.raises(ValueError, match=r"SRUCell: `c0` must have shape \(2, 8\) .* got \(2, 4\)"):
        SRUCell(D_IN, H, bidirectional=True)(torch.randn(L, B, D_IN), torch.randn(B, H))


def test_c0_integer(layer):
    c0 = torch.zeros(B, 2 * H, dtype=torch.int32)
    if isinstance(layer, SRU):
        c0 = c0.expand(2, B, 2 * H)
    with pytest.raises(TypeError, match=r"`c0` must be a floating-point tensor .* got dtype torch.int32"):
        layer(torch.randn(L, B, D_IN), c0)


def test_mask_pad_wrong_shape(layer):
    with pytest.raises(ValueError, match=r"`mask_pad` must have shape \(4, 2\) \(length, batch\), got \(2, 4\)"):
        layer(torch.randn(L, B, D_IN), mask_pad=torch.zeros(B, L, dtype=torch.bool))


def test_mask_pad_shape_follows_batch_first():
    model = SRU(D_IN, H, batch_first=True)
    expected = r"`mask_pad` must have shape \(2, 4\) \(batch, length\) with batch_first=True, got \(4, 2\)"
    with pytest.raises(ValueError, match=expected):
        model(torch.randn(B, L, D_IN), mask_pad=torch.zeros(L, B, dtype=torch.bool))
    model(torch.randn(B, L, D_IN), mask_pad=torch.zeros(B, L, dtype=torch.uint8))  # 0/1 masks work


def test_tensors_on_different_devices(layer):
    # The meta device stands in for a second device on a CPU-only machine.
    x = torch.randn(L, B, D_IN)
    c0 = torch.zeros(B, 2 * H, device="meta")
    if isinstance(layer, SRU):
        c0 = torch.zeros(2, B, 2 * H, device="meta")
    with pytest.raises(ValueError, match=r"`c0` must be on the input's device cpu, got device meta"):
        layer(x, c0)
    with pytest.raises(ValueError, match=r"`mask_pad` must be on the input's device cpu, got device meta"):
        layer(x, mask_pad=torch.zeros(L, B, dtype=torch.bool, device="meta"))
    with pytest.raises(ValueError, match=r"`input` must be on the parameters' device cpu, got device meta"):
        layer(x.to("meta"))


@pytest.mark.parametrize(
    "kwargs, error, pattern",
    [
        (dict(input_size=0), ValueError, r"`input_size` must be a positive int, got 0"),
        (dict(hidden_size=2.5), TypeError, r"`hidden_size` must be an int, got float 2.5"),
        (dict(num_layers=0), ValueError, r"`num_layers` must be a positive int, got 0"),
        (dict(dropout=1.0), ValueError, r"`dropout` must be in \[0, 1\), got 1.0"),
        (dict(dropout=-0.1), ValueError, r"`dropout` must be in \[0, 1\), got -0.1"),
        (dict(projection_size=-1), ValueError, r"SRU: `projection_size` must be >= 0, got -1"),
        (dict(use_tanh=True), ValueError, r"`use_tanh` must be False .* got True"),
        (
            dict(recurrence_policy="fp16"),
            ValueError,
            r"`recurrence_policy` must be one of \('auto', 'fp32', 'half'\), got 'fp16'",
        ),
        (dict(recurrence_policy=None), TypeError, r"`recurrence_policy` must be a str"),
        (
            dict(amp_recurrence_fp16=True, recurrence_policy="fp32"),
            ValueError,
            r"`amp_recurrence_fp16=True`.*got 'fp32'",
        ),
        (
            dict(custom_m=[torch.nn.Linear(2, 2)]),
            ValueError,
            r"`custom_m` as a list must hold one module per layer \(2\), got 1",
        ),
    ],
)
def test_bad_construction(kwargs, error, pattern):
    arguments = dict(input_size=D_IN, hidden_size=H)
    arguments.update(kwargs)
    with pytest.raises(error, match=pattern):
        SRU(**arguments)


def test_bad_cell_construction():
    with pytest.raises(ValueError, match=r"SRUCell: `n_proj` must be >= 0, got -2"):
        SRUCell(D_IN, H, n_proj=-2)
    with pytest.raises(ValueError, match=r"SRUCell: `weight_c_init` must be None or a positive float, got -1.0"):
        SRUCell(D_IN, H, weight_c_init=-1.0)
    with pytest.raises(TypeError, match=r"SRUCell: `custom_m` must be an nn.Module or None, got function"):
        SRUCell(D_IN, H, custom_m=lambda x: x)


def test_bad_policy_assignment():
    cell = SRUCell(D_IN, H)
    with pytest.raises(ValueError, match=r"SRUCell: `recurrence_policy` must be one of .* got 'bf16'"):
        cell.recurrence_policy = "bf16"
    assert cell.recurrence_policy == "auto"


def test_custom_m_returning_wrong_width():
    cell = SRUCell(D_IN, H, custom_m=torch.nn.Linear(D_IN, 3 * H))  # k = 4 needs 4*H
    with pytest.raises(ValueError, match=r"`custom_m` output U must have shape \(4, 2, 16\) .* got \(4, 2, 12\)"):
        cell(torch.randn(L, B, D_IN))


def test_packed_input_with_mask_pad():
    from torch.nn.utils.rnn import pack_padded_sequence

    packed = pack_padded_sequence(torch.randn(L, B, D_IN), torch.tensor([L, 2]))
    with pytest.raises(ValueError, match=r"`mask_pad` must be None for a PackedSequence input"):
        SRU(D_IN, H)(packed, mask_pad=torch.zeros(L, B))


def test_nan_input_propagates_like_lstm():
    model = SRU(D_IN, H).eval()
    x = torch.randn(L, B, D_IN)
    x[1, 0, 0] = float("nan")
    h, c = model(x)
    assert torch.isnan(h[1:, 0]).any() and torch.isfinite(h[:, 1]).all() and torch.isfinite(h[0]).all()


@pytest.mark.parametrize("layer_class", [SRU, SRUCell])
def test_input_dtype_other_than_the_weights_is_named_outside_autocast(layer_class):
    layer = layer_class(D_IN, H)
    with pytest.raises(
        TypeError,
        match=rf"{layer_class.__name__}: `input` has dtype torch.float16, but the "
        r"layer's weights are torch.float32",
    ):
        layer(torch.randn(L, B, D_IN, dtype=torch.float16))
    with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast casts for the matmul: allowed
        out = layer(torch.randn(L, B, D_IN, dtype=torch.bfloat16))[0]
    assert out.dtype == torch.bfloat16
