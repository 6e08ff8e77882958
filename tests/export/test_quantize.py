"""The SRU projection as an nn.Linear, reachable by dynamic int8 quantisation."""

from __future__ import annotations

import torch
from helpers.language_models import language_model
from torch import nn

from sru_lightning.export.quantize import projection_as_linear, quantize_input_projections


def test_the_projection_moves_into_a_linear_without_changing_outputs_and_quantises():
    model = language_model(
        vocab_size=17,
        embedding_dim=8,
        hidden_size=16,
        num_layers=2,
        sru_options={"highway_bias": -2.0, "rescale": True},
    ).eval()
    tokens = torch.randint(0, 17, (3, 11))
    with torch.no_grad():
        expected, expected_c = model(tokens)
    quantized = quantize_input_projections(model)
    assert projection_as_linear(model) == ["net.rnn.rnn_lst.0", "net.rnn.rnn_lst.1"]
    assert all(isinstance(cell.custom_m, nn.Linear) and cell.weight is None for cell in model.net.rnn.rnn_lst)
    with torch.no_grad():
        moved, moved_c = model(tokens)
        int8, _ = quantized(tokens)
    torch.testing.assert_close(moved, expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(moved_c, expected_c, rtol=1e-5, atol=1e-6)
    int8_linear = torch.ao.nn.quantized.dynamic.Linear
    assert all(isinstance(cell.custom_m, int8_linear) for cell in quantized.net.rnn.rnn_lst)
    assert isinstance(quantized.net.decoder, int8_linear)
    # int8 weights: close to, not equal to, the float32 logits
    assert 0 < (int8 - expected).abs().max() < 0.1 * expected.abs().max()
