"""Bad input to SRUpp fails early with an error naming the argument, expectation and value."""

from __future__ import annotations

import pytest
import torch

from sru_lightning.nn import SRUpp, SRUppAttention, SRUppCell

L, B, D_IN, H, P = 4, 2, 6, 8, 4


@pytest.mark.parametrize(
    "kwargs, error, pattern",
    [
        (dict(proj_size=0), ValueError, r"SRUpp: `proj_size` must be a positive int, got 0"),
        (dict(proj_size=-4), ValueError, r"`proj_size` must be a positive int, got -4"),
        (dict(proj_size=4.0), TypeError, r"`proj_size` must be an int, got float 4.0"),
        (dict(num_heads=3), ValueError, r"`num_heads` must divide proj_size=4, got num_heads=3"),
        (dict(num_heads=0), ValueError, r"`num_heads` must be a positive int, got 0"),
        (
            dict(attention_every_n_layers=2, attention_last_n_layers=1),
            ValueError,
            r"at most one of `attention_every_n_layers` and `attention_last_n_layers`, got "
            r"attention_every_n_layers=2 and attention_last_n_layers=1",
        ),
        (dict(attention_last_n_layers=-3), ValueError, r"`attention_last_n_layers` must be -1 .* got -3"),
        (dict(dropout=1.5), ValueError, r"`dropout` must be in \[0, 1\), got 1.5"),
        (dict(attn_dropout=-0.1), ValueError, r"`attn_dropout` must be in \[0, 1\), got -0.1"),
        (dict(weight_c_init=0.0), ValueError, r"`weight_c_init` must be a positive float, got 0.0"),
        (dict(recurrence_policy="fast"), ValueError, r"recurrence_policy.*'fast'"),
    ],
)
def test_constructor_arguments(kwargs, error, pattern):
    arguments = dict(input_size=D_IN, hidden_size=H, proj_size=P) | kwargs
    with pytest.raises(error, match=pattern):
        SRUpp(**arguments)


def test_attention_heads_must_divide_proj_features():
    with pytest.raises(ValueError, match=r"SRUppAttention: `num_heads` must divide proj_features=6, got 4"):
        SRUppAttention(D_IN, 24, 6, num_heads=4)


def test_cell_needs_a_transform_module():
    with pytest.raises(TypeError, match=r"SRUppCell: `transform_module` must be an nn.Module .* got NoneType"):
        SRUppCell(D_IN, H, None)


@pytest.fixture
def model():
    return SRUpp(D_IN, H, P, num_layers=2)


def test_input_rank_and_width(model):
    with pytest.raises(ValueError, match=r"`input` must be 3-D \(L, B, input_size\), got shape \(2, 6\)"):
        model(torch.randn(B, D_IN))
    with pytest.raises(ValueError, match=r"`input` last dimension must be input_size=6, got shape \(4, 2, 5\)"):
        model(torch.randn(L, B, 5))


def test_c0_shape(model):
    with pytest.raises(ValueError, match=r"`c0` must have shape \(2, 2, 8\) .* got \(2, 8\)"):
        model(torch.randn(L, B, D_IN), c0=torch.randn(B, H))


def test_memory_list_of_wrong_length(model):
    with pytest.raises(ValueError, match=r"`memory` must hold num_layers=2 entries, got 1"):
        model(torch.randn(L, B, D_IN), memory=[torch.randn(3, B, D_IN)])


def test_memory_must_be_a_list(model):
    with pytest.raises(TypeError, match=r"`memory` must be a list of tensors .* got Tensor"):
        model(torch.randn(L, B, D_IN), memory=torch.randn(3, B, D_IN))


def test_memory_of_wrong_width(model):
    memory = [torch.randn(3, B, D_IN), torch.randn(3, B, D_IN)]  # layer 1 takes width 8
    with pytest.raises(ValueError, match=r"`memory\[1\]` must be 3-D .* width=8 .* got shape \(3, 2, 6\)"):
        model(torch.randn(L, B, D_IN), memory=memory)


def test_memory_of_wrong_batch(model):
    memory = [torch.randn(3, B + 1, D_IN), None]
    with pytest.raises(ValueError, match=r"`memory\[0\]` must be 3-D .* batch=2 .* got shape \(3, 3, 6\)"):
        model(torch.randn(L, B, D_IN), memory=memory)


def test_memories_of_different_lengths(model):
    memory = [torch.randn(3, B, D_IN), torch.randn(2, B, H)]
    with pytest.raises(ValueError, match=r"`memory` entries must have one length .* \{0: 3, 1: 2\}"):
        model(torch.randn(L, B, D_IN), memory=memory)


def test_attn_mask_of_wrong_shape(model):
    with pytest.raises(ValueError, match=r"`attn_mask` must have shape \(4, 4\) .* got \(4, 7\)"):
        model(torch.randn(L, B, D_IN), attn_mask=torch.zeros(L, L + 3))
    memory = [torch.randn(3, B, D_IN), torch.randn(3, B, H)]
    with pytest.raises(ValueError, match=r"`attn_mask` must have shape \(4, 7\) .* got \(4, 4\)"):
        model(torch.randn(L, B, D_IN), attn_mask=torch.zeros(L, L), memory=memory)


def test_boolean_attn_mask_is_refused(model):
    with pytest.raises(TypeError, match=r"`attn_mask` must be a floating-point tensor .* got dtype torch.bool"):
        model(torch.randn(L, B, D_IN), attn_mask=torch.ones(L, L, dtype=torch.bool))


def test_memory_mask_pad_without_memory(model):
    with pytest.raises(ValueError, match=r"`memory_mask_pad` must be None when no `memory` is given, got .* \(3, 2\)"):
        model(torch.randn(L, B, D_IN), memory_mask_pad=torch.zeros(3, B, dtype=torch.bool))


def test_memory_mask_pad_of_wrong_shape(model):
    memory = [torch.randn(3, B, D_IN), torch.randn(3, B, H)]
    with pytest.raises(ValueError, match=r"`memory_mask_pad` must have shape \(3, 2\) .* got \(2, 3\)"):
        model(torch.randn(L, B, D_IN), memory=memory, memory_mask_pad=torch.zeros(B, 3, dtype=torch.bool))


def test_mask_pad_of_wrong_shape(model):
    with pytest.raises(ValueError, match=r"`mask_pad` must have shape \(4, 2\) \(length, batch\), got \(2, 4\)"):
        model(torch.randn(L, B, D_IN), mask_pad=torch.zeros(B, L, dtype=torch.bool))
