"""SRU++: parity with the reference numbers, options, memory, decoding, compile and gradcheck."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from sru_lightning.nn import (
    SRUpp,
    SRUppAttention,
    SRUppCell,
    SRUppProjectedLinear,
    iter_sru_cells,
    set_recurrence_policy,
)
from sru_lightning.ops import trace_storage_dtypes
from sru_lightning.ops.testing import relative_error

GOLDEN = torch.load(Path(__file__).resolve().parents[1] / "fixtures" / "srupp_golden.pt", weights_only=True)
L, B, D_IN, H, P = 5, 3, 6, 8, 4


def causal_mask(length: int, memory_length: int = 0, dtype=torch.float32) -> torch.Tensor:
    """Additive (length, memory_length + length): step t sees the memory and steps <= t."""
    mask = torch.full((length, memory_length + length), float("-inf"), dtype=dtype)
    return torch.triu(mask, diagonal=memory_length + 1)


def build(args: dict) -> SRUpp:
    args = dict(args)
    return SRUpp(args.pop("input_size"), args.pop("hidden_size"), args.pop("proj_size"), **args)


def attending(model: SRUpp, alpha: float = 0.5) -> SRUpp:
    """A non-zero attention scale (it starts at 0), so the attention shows in the output."""
    with torch.no_grad():
        for layer in model.rnn_lst:
            if layer.has_attention:
                layer.transform_module.alpha.fill_(alpha)
    return model


# --------------------------------------------------------------------------- golden parity


def _case_id(case) -> str:
    return ",".join(f"{key}={value}" for key, value in case["args"].items())


@pytest.mark.parametrize("case", GOLDEN["cases"], ids=_case_id)
def test_matches_reference_numbers(case):
    """Outputs, c, memory bank and every gradient of two calls (the second attends to the
    first's memory under a causal mask and padding) within 1e-6 relative, float64.

    The second call's saved inputs are compared at its valid steps: its padding holds random
    values, which the layers (and the first projection, `proj_input_to_hidden_first`) read as
    zeros here, so that a NaN or Inf there reaches nothing (tests/nn/test_padding_isolation.py)."""
    model = build(case["args"]).double().eval()
    model.load_state_dict(case["state_dict"])  # strict: names and shapes are the reference's

    h1, c1, bank1 = model(case["x1"])
    x2 = case["x2"].clone().requires_grad_(True)
    h2, c2, bank2 = model(
        x2, c0=c1, mask_pad=case["mask_pad"], attn_mask=case["attn_mask"], memory=bank1["saved_inputs"]
    )
    (h2 * case["grad_out"]).sum().backward()

    checks = [("h1", h1, case["h1"]), ("c1", c1, case["c1"]), ("h2", h2, case["h2"]), ("c2", c2, case["c2"])]
    checks.append(("grad_x2", x2.grad, case["grad_x2"]))
    for call, bank in ((1, bank1), (2, bank2)):
        expected = case[f"saved_inputs_{call}"]
        assert len(bank["saved_inputs"]) == len(expected)
        if call == 2:
            padded = case["mask_pad"].bool().unsqueeze(-1)
            expected = [e.masked_fill(padded, 0.0) for e in expected]
            bank = {"saved_inputs": [a.masked_fill(padded, 0.0) for a in bank["saved_inputs"]]}
        checks += [(f"saved_inputs_{call}[{i}]", a, e) for i, (a, e) in enumerate(zip(bank["saved_inputs"], expected))]
    parameters = dict(model.named_parameters())
    assert set(case["grad_params"]) == set(parameters)
    checks += [(f"grad {name}", parameters[name].grad, g) for name, g in case["grad_params"].items()]
    for name, actual, expected in checks:
        assert actual.shape == expected.shape, name
        # floor=1e-12: a gradient the reference computes as exactly zero (alpha = 0 stops it)
        # must be ~zero here too.
        assert relative_error(actual, expected, floor=1e-12) < 1e-6, name


def test_state_dict_round_trips_with_reference_names():
    case = GOLDEN["cases"][4]  # proj_input_to_hidden_first, layer norm after
    model = build(case["args"]).double()
    assert set(model.state_dict()) == set(case["state_dict"])
    for name, value in model.state_dict().items():
        assert value.shape == case["state_dict"][name].shape, name


# --------------------------------------------------------------------------- construction


def test_layer_schedule_and_transforms():
    model = SRUpp(D_IN, H, P, num_layers=4, attention_every_n_layers=2)
    assert [layer.has_attention for layer in model.rnn_lst] == [False, True, False, True]
    assert isinstance(model[0].transform_module, SRUppProjectedLinear)
    assert isinstance(model[1].transform_module, SRUppAttention)
    model = SRUpp(D_IN, H, P, num_layers=4, attention_last_n_layers=1)
    assert [layer.has_attention for layer in model.rnn_lst] == [False, False, False, True]
    # k = 4 where the layer input differs from the output size, else 3.
    assert [layer.num_matrices for layer in model.rnn_lst] == [4, 3, 3, 3]


def test_initialisation_recipe():
    model = SRUpp(D_IN, H, P, num_layers=2, highway_bias=-3.0, rescale=True, weight_c_init=0.5)
    for layer in model.rnn_lst:
        assert torch.all(layer.bias[: layer.output_size] == 0)
        assert torch.all(layer.bias[layer.output_size :] == -3.0)
        assert layer.weight_c.abs().max() <= 0.5
        assert layer.scale_x.item() == pytest.approx((1 + 2 * torch.exp(torch.tensor(-3.0)).item()) ** 0.5)
    attention = model[0].transform_module
    assert attention.alpha.item() == 0.0  # the attention starts switched off (rezero)
    bound = (6 / (D_IN + P)) ** 0.5  # xavier uniform
    assert attention.linear1.weight.abs().max() <= bound
    assert SRUpp(D_IN, H, P)[0].scale_x.item() == 1.0


def test_dropout_shrinks_the_last_projection():
    torch.manual_seed(3)
    plain = SRUpp(D_IN, H, P, num_layers=1)
    torch.manual_seed(3)
    dropped = SRUpp(D_IN, H, P, num_layers=1, dropout=0.36)
    torch.testing.assert_close(
        dropped[0].transform_module.linear3.weight, plain[0].transform_module.linear3.weight * 0.8
    )


# --------------------------------------------------------------------------- options


@pytest.mark.parametrize("bidirectional", [False, True])
def test_shapes_and_memory_bank(bidirectional):
    dirs = 2 if bidirectional else 1
    model = SRUpp(D_IN, H, P, num_layers=3, num_heads=2, bidirectional=bidirectional)
    h, c, bank = model(torch.randn(L, B, D_IN))
    assert h.shape == (L, B, dirs * H)
    assert c.shape == (3, B, dirs * H)
    assert [tuple(t.shape) for t in bank["saved_inputs"]] == [(L, B, D_IN)] + [(L, B, dirs * H)] * 2


def test_batch_first_matches_time_major():
    torch.manual_seed(1)
    time_major = attending(SRUpp(D_IN, H, P, num_layers=2, num_heads=2).eval())
    batch_first = SRUpp(D_IN, H, P, num_layers=2, num_heads=2, batch_first=True).eval()
    batch_first.load_state_dict(time_major.state_dict())
    x, memory_x = torch.randn(L, B, D_IN), torch.randn(2, B, D_IN)
    mask = torch.zeros(L, B, dtype=torch.bool)
    mask[3:, 1] = True
    _, _, bank = time_major(memory_x)
    h, c, new_bank = time_major(x, mask_pad=mask, attn_mask=causal_mask(L, 2), memory=bank["saved_inputs"])
    h_bf, c_bf, new_bank_bf = batch_first(
        x.transpose(0, 1),
        mask_pad=mask.t(),
        attn_mask=causal_mask(L, 2),
        memory=[t.transpose(0, 1) for t in bank["saved_inputs"]],
    )
    torch.testing.assert_close(h_bf, h.transpose(0, 1))
    torch.testing.assert_close(c_bf, c)
    for a, b in zip(new_bank_bf["saved_inputs"], new_bank["saved_inputs"]):
        torch.testing.assert_close(a, b.transpose(0, 1))


@pytest.mark.parametrize("bidirectional", [False, True])
def test_padding_hides_padded_content(bidirectional):
    """Valid positions do not depend on what the padded positions hold."""
    model = attending(SRUpp(D_IN, H, P, num_layers=2, bidirectional=bidirectional).eval())
    x = torch.randn(L, B, D_IN)
    mask = torch.zeros(L, B, dtype=torch.bool)
    mask[3:, 1] = True
    h, c, _ = model(x, mask_pad=mask)
    noisy = x.clone()
    noisy[3:, 1] = 100 * torch.randn(L - 3, D_IN)
    h_noisy, c_noisy, _ = model(noisy, mask_pad=mask)
    torch.testing.assert_close(h_noisy[:3], h[:3])
    torch.testing.assert_close(h_noisy[:, 0], h[:, 0])
    torch.testing.assert_close(c_noisy, c)
    # and the padded sequence equals the same sequence run alone, unpadded
    h_alone, c_alone, _ = model(x[:3, 1:2])
    torch.testing.assert_close(h[:3, 1:2], h_alone)
    torch.testing.assert_close(c[:, 1:2], c_alone)


def test_packed_sequence_matches_mask_pad():
    model = attending(SRUpp(D_IN, H, P, num_layers=2).eval())
    x = torch.randn(L, B, D_IN)
    lengths = torch.tensor([5, 3, 4])
    mask = torch.arange(L).unsqueeze(1) >= lengths.unsqueeze(0)
    h, c, _ = model(x, mask_pad=mask)
    packed_h, packed_c, bank = model(pack_padded_sequence(x, lengths, enforce_sorted=False))
    unpacked, _ = pad_packed_sequence(packed_h)
    torch.testing.assert_close(unpacked, h.masked_fill(mask.unsqueeze(-1), 0))
    torch.testing.assert_close(packed_c, c)
    assert len(bank["saved_inputs"]) == 2


def test_memory_continues_a_causal_sequence():
    """Two segments with memory + causal mask equal one causal pass over both."""
    model = attending(SRUpp(D_IN, H, P, num_layers=3, num_heads=2, attention_every_n_layers=1).eval())
    x = torch.randn(7, B, D_IN)
    h_full, c_full, _ = model(x, attn_mask=causal_mask(7))
    h1, c1, bank = model(x[:3], attn_mask=causal_mask(3))
    h2, c2, _ = model(x[3:], c0=c1, attn_mask=causal_mask(4, 3), memory=bank["saved_inputs"])
    torch.testing.assert_close(torch.cat([h1, h2]), h_full)
    torch.testing.assert_close(c2, c_full)


def test_step_by_step_decoding_equals_full_pass():
    model = attending(SRUpp(D_IN, H, P, num_layers=2, num_heads=2, batch_first=True).eval())
    x = torch.randn(B, L, D_IN)
    h_full, c_full, _ = model(x, attn_mask=causal_mask(L))
    c, memory, steps = None, None, []
    for t in range(L):
        h, c, bank = model(x[:, t : t + 1], c0=c, memory=memory)
        memory = model.extend_memory(memory, bank["saved_inputs"])
        steps.append(h)
    torch.testing.assert_close(torch.cat(steps, dim=1), h_full)
    torch.testing.assert_close(c, c_full)
    assert memory[0].shape == (B, L, D_IN) and not memory[1].requires_grad


def test_extend_memory_keeps_the_last_steps():
    model = SRUpp(D_IN, H, P, num_layers=1)
    earlier = [torch.arange(4.0).view(4, 1, 1).expand(4, B, D_IN)]
    new = [torch.arange(4.0, 7.0).view(3, 1, 1).expand(3, B, D_IN)]
    kept = model.extend_memory(earlier, new, max_length=5)[0]
    assert kept[:, 0, 0].tolist() == [2.0, 3.0, 4.0, 5.0, 6.0]


def test_memory_mask_pad_hides_memory():
    model = attending(SRUpp(D_IN, H, P, num_layers=1).eval())
    x, memory = torch.randn(L, B, D_IN), torch.randn(2, B, D_IN)
    all_padded = torch.ones(2, B, dtype=torch.bool)
    h_hidden, _, _ = model(x, memory=[memory], memory_mask_pad=all_padded)
    h_without, _, _ = model(x)
    torch.testing.assert_close(h_hidden, h_without)
    h_seen, _, _ = model(x, memory=[memory])
    assert not torch.allclose(h_seen, h_without)


def test_attention_matches_plain_formula():
    """The scaled_dot_product_attention path equals softmax(q k^T / sqrt(d) + mask) v."""
    attention = SRUppAttention(D_IN, 3 * H, P, num_heads=2, layer_norm=True).eval()
    with torch.no_grad():
        attention.alpha.fill_(0.7)
    x, memory = torch.randn(L, B, D_IN), torch.randn(2, B, D_IN)
    mask_pad = torch.zeros(L, B, dtype=torch.bool)
    mask_pad[4:, 2] = True
    attn_mask = causal_mask(L, 2)
    out = attention(x, mask_pad=mask_pad, attn_mask=attn_mask, memory=memory)

    z = attention.linear1(torch.cat([memory, x]))
    keys, values = attention.linear2(z).chunk(2, dim=-1)
    heads = lambda t: t.reshape(t.shape[0], B, 2, P // 2).permute(1, 2, 0, 3)  # noqa: E731
    scores = heads(z[2:]) @ heads(keys).transpose(-1, -2) / (P // 2) ** 0.5 + attn_mask
    padded = torch.cat([torch.zeros(2, B, dtype=torch.bool), mask_pad]).t()[:, None, None, :]
    weights = F.softmax(scores.masked_fill(padded, float("-inf")), dim=-1)
    attended = (weights @ heads(values)).permute(2, 0, 1, 3).reshape(L, B, P)
    expected = attention.linear3(attention.layer_norm(0.7 * attended + z[2:]))
    torch.testing.assert_close(out, expected)


def test_dropout_train_is_random_eval_is_deterministic():
    model = SRUpp(D_IN, H, P, num_layers=2, dropout=0.3, attn_dropout=0.3)
    x = torch.randn(L, B, D_IN)
    assert not torch.allclose(model(x)[0], model(x)[0])
    model.eval()
    torch.testing.assert_close(model(x)[0], model(x)[0])


# --------------------------------------------------------------------------- precision


def test_policy_reaches_srupp_layers():
    class Wrapper(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = SRUpp(D_IN, H, P, num_layers=2)

    model = Wrapper()
    names = [name for name, _ in set_recurrence_policy(model, "fp32")]
    assert names == ["encoder.rnn_lst.0", "encoder.rnn_lst.1"]
    assert model.encoder.recurrence_policy == "fp32"
    assert all(isinstance(cell, SRUppCell) for _, cell in iter_sru_cells(model))


@pytest.mark.parametrize("policy", ["auto", "fp32"])
def test_autocast_bf16(policy):
    model = SRUpp(D_IN, H, P, num_layers=2, recurrence_policy=policy)
    x = torch.randn(L, B, D_IN, requires_grad=True)
    with trace_storage_dtypes() as calls, torch.autocast("cpu", dtype=torch.bfloat16):
        h, c, _ = model(x, attn_mask=causal_mask(L))
    assert h.dtype == torch.bfloat16
    assert {call.storage_dtype for call in calls} == {torch.float32 if policy == "fp32" else torch.bfloat16}
    h.float().sum().backward()
    assert torch.isfinite(x.grad).all()


def test_model_in_bfloat16():
    model = SRUpp(D_IN, H, P, num_layers=2, layer_norm=True).to(torch.bfloat16)
    x = torch.randn(L, B, D_IN, dtype=torch.bfloat16)
    h, c, bank = model(x, attn_mask=causal_mask(L, dtype=torch.bfloat16))
    assert h.dtype == c.dtype == torch.bfloat16 and torch.isfinite(h).all()


# --------------------------------------------------------------------------- autograd / compile


def test_gradcheck_float64():
    model = SRUpp(3, 4, 2, num_layers=2, num_heads=2, layer_norm=True, attention_every_n_layers=2).double().eval()
    attending(model)
    names = [name for name, _ in model.named_parameters()]
    x = torch.randn(3, 2, 3, dtype=torch.float64, requires_grad=True)
    memory = [torch.randn(2, 2, 3, dtype=torch.float64), torch.randn(2, 2, 4, dtype=torch.float64, requires_grad=True)]
    mask = torch.tensor([[False, False], [False, False], [False, True]])
    attn_mask = causal_mask(3, 2, dtype=torch.float64)

    def run(x, memory1, *parameters):
        h, c, _ = torch.func.functional_call(
            model,
            dict(zip(names, parameters)),
            (x,),
            dict(mask_pad=mask, attn_mask=attn_mask, memory=[memory[0], memory1]),
        )
        return h, c

    parameters = tuple(p.detach().clone().requires_grad_(True) for p in model.parameters())
    assert torch.autograd.gradcheck(run, (x, memory[1]) + parameters)


def test_compile_fullgraph_equals_eager():
    model = attending(SRUpp(D_IN, H, P, num_layers=2, num_heads=2, attention_every_n_layers=2).eval())
    x, memory_x = torch.randn(L, B, D_IN), torch.randn(2, B, D_IN)
    mask = torch.zeros(L, B, dtype=torch.bool)
    mask[3:, 1] = True
    memory = model.extend_memory(None, model(memory_x)[2]["saved_inputs"])  # detached

    def forward(x):
        h, c, bank = model(x, mask_pad=mask, attn_mask=causal_mask(L, 2), memory=memory)
        return h, c, bank["saved_inputs"]

    compiled = torch.compile(forward, fullgraph=True, backend="aot_eager")
    x_eager = x.clone().requires_grad_(True)
    x_compiled = x.clone().requires_grad_(True)
    eager, compiled_out = forward(x_eager), compiled(x_compiled)
    torch.testing.assert_close(compiled_out, eager)
    eager[0].sum().backward()
    compiled_out[0].sum().backward()
    torch.testing.assert_close(x_compiled.grad, x_eager.grad)


@pytest.mark.slow
def test_compile_inductor_fullgraph_equals_eager():
    """The default backend generates kernels around the recurrence op and the attention."""
    model = attending(SRUpp(D_IN, H, P, num_layers=2, num_heads=2).eval())
    x = torch.randn(L, B, D_IN)
    mask = causal_mask(L)

    def forward(x):
        h, c, _ = model(x, attn_mask=mask)
        return h, c

    torch.testing.assert_close(torch.compile(forward, fullgraph=True)(x), forward(x))


def test_a_model_without_attention_takes_the_memory_sized_mask():
    # With a memory of length M the mask is (L, M + L), whether or not a layer attends.
    model = SRUpp(8, 8, 4, num_layers=1, attention_every_n_layers=2)
    length, batch, memory_length = 5, 2, 3
    x = torch.randn(length, batch, 8)
    memory = [torch.randn(memory_length, batch, 8)]
    output, _, _ = model(x, memory=memory, attn_mask=torch.zeros(length, memory_length + length))
    assert output.shape == (length, batch, 8)
    with pytest.raises(ValueError, match=r"`attn_mask` must have shape \(5, 8\)"):
        model(x, memory=memory, attn_mask=torch.zeros(length, length))
