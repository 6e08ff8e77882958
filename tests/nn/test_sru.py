"""SRUCell / SRU: shapes, options, dropout, layouts, recurrence policy and dtypes (and the last-state
layout SRU and SRUpp share)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from sru_lightning.nn import SRU, SRUCell, SRUpp, iter_sru_cells, set_recurrence_policy
from sru_lightning.ops import functional, sru_recurrence_reference, trace_storage_dtypes

L, B, D_IN, H = 5, 3, 6, 4


def _padding_mask(length=L, batch=B):
    mask = torch.zeros(length, batch, dtype=torch.bool)
    mask[length - 2 :, 1] = True  # sequence 1 is two steps shorter
    return mask


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("num_layers", [1, 3])
def test_sru_shapes(bidirectional, num_layers):
    dirs = 2 if bidirectional else 1
    model = SRU(D_IN, H, num_layers=num_layers, bidirectional=bidirectional)
    h, c = model(torch.randn(L, B, D_IN))
    assert h.shape == (L, B, dirs * H)
    assert c.shape == (num_layers, B, dirs * H)


def test_all_options_together_forward_backward():
    """bidirectional + mask_pad + c0 + projection + layer norm + dropout in one model."""
    model = SRU(
        D_IN,
        H,
        num_layers=3,
        dropout=0.2,
        bidirectional=True,
        projection_size=3,
        layer_norm=True,
        highway_bias=-1.0,
        rescale=True,
    )
    assert all(cell.weight_proj is not None for _, cell in iter_sru_cells(model))
    x = torch.randn(L, B, D_IN, requires_grad=True)
    c0 = torch.randn(3, B, 2 * H, requires_grad=True)
    mask = _padding_mask()
    h, c = model(x, c0, mask_pad=mask)
    assert h.shape == (L, B, 2 * H) and c.shape == (3, B, 2 * H)
    assert torch.all(h[L - 2 :, 1] == 0), "padded steps must emit h = 0"
    (h.sum() + c.sum()).backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    assert c0.grad is not None and torch.isfinite(c0.grad).all()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    # A padded input step influences nothing.
    assert torch.all(x.grad[L - 2 :, 1] == 0)


def test_padding_matches_shorter_sequence():
    model = SRU(D_IN, H, num_layers=2, bidirectional=True).eval()
    x = torch.randn(L, B, D_IN)
    h, c = model(x, mask_pad=_padding_mask())
    h_short, c_short = model(x[: L - 2, 1:2])
    torch.testing.assert_close(h[: L - 2, 1:2], h_short)
    torch.testing.assert_close(c[:, 1:2], c_short)


def test_c0_changes_the_output():
    model = SRU(D_IN, H).eval()
    x = torch.randn(L, B, D_IN)
    h_zero, _ = model(x)
    torch.testing.assert_close(model(x, torch.zeros(2, B, H))[0], h_zero)
    assert not torch.allclose(model(x, torch.randn(2, B, H))[0], h_zero)


def test_stack_equals_chained_cells():
    model = SRU(D_IN, H, num_layers=2, bidirectional=True, layer_norm=True).eval()
    x, c0 = torch.randn(L, B, D_IN), torch.randn(2, B, 2 * H)
    h, c = model(x, c0)
    h0, c_first = model.rnn_lst[0](x, c0[0])
    h1, c_second = model.rnn_lst[1](h0, c0[1])
    torch.testing.assert_close(h, h1)
    torch.testing.assert_close(c, torch.stack([c_first, c_second]))


def test_dropout_train_is_random_eval_is_deterministic():
    model = SRU(D_IN, H, num_layers=2, dropout=0.5)
    x = torch.randn(L, B, D_IN)
    model.train()
    assert not torch.allclose(model(x)[0], model(x)[0])
    model.eval()
    torch.testing.assert_close(model(x)[0], model(x)[0], rtol=0, atol=0)
    # The last layer gets no dropout: it is dropout *between* layers.
    assert model.rnn_lst[0].dropout == 0.5 and model.rnn_lst[1].dropout == 0.0


def test_dropout_mask_is_per_column_shared_over_time():
    cell = SRUCell(H, H, dropout=0.5, has_skip_term=False).train()
    seen = {}
    original = functional.sru_recurrence

    def spy(*args, **kwargs):
        seen["mask_c"] = kwargs["mask_c"]
        return original(*args, **kwargs)

    functional.sru_recurrence = spy
    try:
        cell(torch.randn(L, B, H, requires_grad=True))
    finally:
        functional.sru_recurrence = original
    mask = seen["mask_c"]
    assert mask.shape == (B, H)
    assert set(mask.unique().tolist()) <= {0.0, 2.0}


def test_batch_first_matches_time_major():
    time_major = SRU(D_IN, H, bidirectional=True).eval()
    batch_first = SRU(D_IN, H, bidirectional=True, batch_first=True).eval()
    batch_first.load_state_dict(time_major.state_dict())
    x, mask = torch.randn(L, B, D_IN), _padding_mask()
    h, c = time_major(x, mask_pad=mask)
    h_bf, c_bf = batch_first(x.transpose(0, 1), mask_pad=mask.t())
    torch.testing.assert_close(h_bf, h.transpose(0, 1))
    torch.testing.assert_close(c_bf, c)

    cell = SRUCell(D_IN, H, batch_first=True).eval()
    plain = SRUCell(D_IN, H).eval()
    plain.load_state_dict(cell.state_dict())
    torch.testing.assert_close(cell(x.transpose(0, 1))[0], plain(x)[0].transpose(0, 1))


def test_one_step_input_matches_length_one_sequence():
    cell = SRUCell(D_IN, H, bidirectional=True).eval()
    x, c0 = torch.randn(B, D_IN), torch.randn(B, 2 * H)
    h, c = cell(x, c0)
    h_seq, c_seq = cell(x.unsqueeze(0), c0)
    assert h.shape == (B, 2 * H)
    torch.testing.assert_close(h, h_seq[0])
    torch.testing.assert_close(c, c_seq)

    model = SRU(D_IN, H).eval()
    h, c = model(x)
    assert h.shape == (B, H) and c.shape == (2, B, H)
    torch.testing.assert_close(h, model(x.unsqueeze(0))[0][0])


def test_step_by_step_decoding_equals_full_sequence():
    model = SRU(D_IN, H, num_layers=2).eval()
    x = torch.randn(L, B, D_IN)
    h_full, c_full = model(x)
    state, outputs = None, []
    for t in range(L):
        out, state = model(x[t], state)
        outputs.append(out)
    torch.testing.assert_close(torch.stack(outputs), h_full)
    torch.testing.assert_close(state, c_full)


def test_packed_sequence_round_trip():
    model = SRU(D_IN, H, bidirectional=True).eval()
    x = torch.randn(L, B, D_IN)
    lengths = torch.tensor([L, L - 2, L - 1])
    packed_out, c = model(pack_padded_sequence(x, lengths, enforce_sorted=False))
    padded_out, out_lengths = pad_packed_sequence(packed_out)
    mask = torch.arange(L).unsqueeze(1) >= lengths.unsqueeze(0)
    h_masked, c_masked = model(x, mask_pad=mask)
    torch.testing.assert_close(padded_out, h_masked)
    torch.testing.assert_close(c, c_masked)
    assert out_lengths.tolist() == lengths.tolist()


def _srupp(input_size, hidden_size, **options):
    return SRUpp(input_size, hidden_size, 4, **options)


@pytest.mark.parametrize("stack", [SRU, _srupp], ids=["SRU", "SRUpp"])
def test_nn_rnn_compatible_return_layout(stack):
    # Both stacks lay out their last states through the same StackMixin.
    model = stack(D_IN, H, num_layers=2, bidirectional=True, nn_rnn_compatible_return=True).eval()
    plain = stack(D_IN, H, num_layers=2, bidirectional=True).eval()
    plain.load_state_dict(model.state_dict())
    x = torch.randn(L, B, D_IN)
    c = model(x)[1]
    c_plain = plain(x)[1]
    assert c.shape == (4, B, H)
    torch.testing.assert_close(c[1], c_plain[0, :, H:])  # layer 0, backward direction
    torch.testing.assert_close(c[2], c_plain[1, :, :H])  # layer 1, forward direction


@pytest.mark.parametrize(
    "options, k",
    [
        (dict(input_size=H, hidden_size=H), 3),  # skip from the input
        (dict(input_size=D_IN, hidden_size=H), 4),  # skip column in U
        (dict(input_size=D_IN, hidden_size=H, has_skip_term=False), 3),
        (dict(input_size=2 * H, hidden_size=H, bidirectional=True), 3),
    ],
)
def test_cell_matches_reference_recurrence(options, k):
    """The layer is exactly U = x @ W plus the reference recurrence, for k = 3 and 4."""
    cell = SRUCell(**options, rescale=True, highway_bias=-1.0).eval()
    assert cell.num_matrices == k
    x = torch.randn(L, B, cell.input_size, dtype=torch.float64)
    c0 = torch.randn(B, cell.output_size, dtype=torch.float64)
    cell.double()
    h, c = cell(x, c0)
    U = (x.reshape(L * B, -1) @ cell.weight).view(L, B, -1)
    h_ref, c_ref = sru_recurrence_reference(
        U,
        x if cell.has_skip_term and k == 3 else None,
        cell.weight_c,
        cell.bias,
        c0,
        scale_x=cell.scale_x,
        bidirectional=cell.bidirectional,
        has_skip_term=cell.has_skip_term,
    )
    torch.testing.assert_close(h, h_ref)
    torch.testing.assert_close(c, c_ref)


def test_layer_norm_pre_and_post():
    pre = SRUCell(D_IN, H, layer_norm=True)
    post = SRUCell(D_IN, H, layer_norm=True, normalize_after=True)
    assert pre.layer_norm.normalized_shape == (D_IN,)
    assert post.layer_norm.normalized_shape == (H,)
    h = post.eval()(torch.randn(L, B, D_IN))[0]
    # Post-norm output is normalised per position (LayerNorm starts at weight 1, bias 0).
    torch.testing.assert_close(h.mean(-1), torch.zeros(L, B), atol=1e-5, rtol=0)
    # Pre-norm: scaling the input changes nothing in U but does change the skip term.
    x = torch.randn(L, B, D_IN)
    pre.eval()
    assert not torch.allclose(pre(x)[0], pre(3 * x)[0])


def test_custom_m_returning_u_and_v():
    class UandV(nn.Module):
        def __init__(self):
            super().__init__()
            self.u = nn.Linear(D_IN, 4 * H, bias=False)
            self.v = nn.Linear(D_IN, 2 * H)

        def forward(self, x):
            return self.u(x), self.v(x)

    with pytest.warns(UserWarning, match="reset_parameters"):
        model = SRU(D_IN, H, num_layers=1, custom_m=UandV()).eval()
    cell = model.rnn_lst[0]
    assert cell.weight is None and "rnn_lst.0.custom_m.u.weight" in model.state_dict()
    x = torch.randn(L, B, D_IN)
    h = model(x)[0]
    U, V = cell.custom_m(x)
    h_ref, _ = sru_recurrence_reference(U, None, V + cell.weight_c, cell.bias, has_skip_term=True)
    torch.testing.assert_close(h, h_ref)

    only_u = SRUCell(D_IN, H, custom_m=nn.Linear(D_IN, 4 * H)).eval()
    U = only_u.custom_m(x)
    torch.testing.assert_close(only_u(x)[0], sru_recurrence_reference(U, None, only_u.weight_c, only_u.bias)[0])


def test_custom_m_list_per_layer_and_deep_copies():
    shared = nn.Linear(H, 3 * H)
    model = SRU(H, H, num_layers=2, custom_m=shared)
    assert model.rnn_lst[0].custom_m is not model.rnn_lst[1].custom_m
    modules = [nn.Linear(H, 3 * H), nn.Linear(H, 3 * H)]
    model = SRU(H, H, num_layers=2, custom_m=modules)
    assert model.rnn_lst[1].custom_m is modules[1]


def test_v1_freezes_weight_c_at_zero():
    cell = SRUCell(D_IN, H, v1=True)
    assert torch.all(cell.weight_c == 0) and not cell.weight_c.requires_grad
    cell(torch.randn(L, B, D_IN))[0].sum().backward()
    assert cell.weight_c.grad is None and cell.weight.grad is not None


def test_rnn_dropout_warns_and_masks_the_input():
    with pytest.warns(FutureWarning, match="rnn_dropout"):
        model = SRU(D_IN, H, rnn_dropout=0.5)
    x = torch.randn(L, B, D_IN)
    model.train()
    assert not torch.allclose(model(x)[0], model(x)[0])
    model.eval()
    torch.testing.assert_close(model(x)[0], model(x)[0])


def test_amp_recurrence_fp16_selects_half_policy():
    assert SRU(D_IN, H, amp_recurrence_fp16=True).recurrence_policy == "half"
    assert SRUCell(D_IN, H, amp_recurrence_fp16=True).recurrence_policy == "half"


def test_projection_only_when_it_shrinks():
    assert SRUCell(D_IN, H, n_proj=3).projection_size == 3
    assert SRUCell(D_IN, H, n_proj=5).projection_size == 0  # not smaller than hidden_size=4
    model = SRU(2, 8, num_layers=2, projection_size=4)
    assert model.rnn_lst[0].weight_proj is None and model.rnn_lst[1].weight_proj.shape == (8, 4)


def test_highway_bias_and_rescale_initialisation():
    cell = SRUCell(H, H, highway_bias=-2.0, rescale=True)
    torch.testing.assert_close(cell.bias[H:], torch.full((H,), -2.0))
    torch.testing.assert_close(cell.bias[:H], torch.zeros(H))
    expected = (1 + 2 * torch.exp(torch.tensor(-2.0))).sqrt()
    torch.testing.assert_close(cell.scale_x[0], expected)
    assert SRUCell(H, H, rescale=False).scale_x.item() == 1.0


def test_extra_repr_shows_non_defaults_only():
    assert repr(SRUCell(D_IN, H)) == "SRUCell(6, 4)"
    text = repr(SRU(D_IN, H, num_layers=3, bidirectional=True, dropout=0.1, recurrence_policy="fp32"))
    first_line = text.splitlines()[1]
    assert "num_layers=3" in first_line and "bidirectional=True" in first_line
    assert "dropout=0.1" in first_line and "recurrence_policy='fp32'" in first_line
    assert "layer_norm" not in first_line and "highway_bias" not in first_line
    assert "projection_size=3" in repr(SRUCell(D_IN, H, n_proj=3))


# ---------------------------------------------------------------- recurrence policy
class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = SRU(D_IN, H, num_layers=2)
        self.decoder = nn.ModuleDict({"step": SRUCell(H, H)})
        self.head = nn.Linear(H, 2)


def test_set_recurrence_policy_walks_nested_modules():
    model = Tagger()
    changed = set_recurrence_policy(model, "fp32")
    assert [name for name, _ in changed] == ["encoder.rnn_lst.0", "encoder.rnn_lst.1", "decoder.step"]
    assert all(cell.recurrence_policy == "fp32" for _, cell in iter_sru_cells(model))
    assert model.encoder.recurrence_policy == "fp32"
    assert set_recurrence_policy(nn.Linear(2, 2), "half") == []


def test_unknown_policy_changes_nothing():
    model = Tagger()
    with pytest.raises(ValueError, match=r"recurrence_policy.*\('auto', 'fp32', 'half'\).*'fast'"):
        set_recurrence_policy(model, "fast")
    assert all(cell.recurrence_policy == "auto" for _, cell in iter_sru_cells(model))


def test_policy_reaches_the_op():
    model = SRU(D_IN, H, num_layers=2, recurrence_policy="fp32")
    seen = []
    original = functional.sru_recurrence_inference

    def spy(*args, **kwargs):
        seen.append(kwargs["policy"])
        return original(*args, **kwargs)

    functional.sru_recurrence_inference = spy
    try:
        with torch.no_grad():
            model(torch.randn(L, B, D_IN))
        model.recurrence_policy = "half"
        with torch.no_grad():
            model(torch.randn(L, B, D_IN))
    finally:
        functional.sru_recurrence_inference = original
    assert seen == ["fp32", "fp32", "half", "half"]


def test_inference_entry_point_without_grad():
    model = SRU(D_IN, H)
    x = torch.randn(L, B, D_IN)
    with trace_storage_dtypes() as calls:
        with torch.no_grad():
            model(x)
        model(x)
    directions = [call.direction for call in calls]
    assert directions == ["inference", "inference", "forward", "forward"]


@pytest.mark.parametrize("half", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("policy", ["auto", "half", "fp32"])
def test_autocast_mixed_dtypes(policy, half):
    """fp32 input and weights, half U from autocast: the op gets mixed dtypes and must cope."""
    model = SRU(D_IN, H, num_layers=2, bidirectional=True, recurrence_policy=policy)
    x = torch.randn(L, B, D_IN, requires_grad=True)
    c0 = torch.randn(2, B, 2 * H)
    with trace_storage_dtypes() as calls, torch.autocast("cpu", dtype=half):
        h, c = model(x, c0, mask_pad=_padding_mask())
    assert h.dtype == half
    storage = torch.float32 if policy == "fp32" else half
    assert {call.storage_dtype for call in calls} == {storage}
    h.float().sum().backward()
    assert x.grad.dtype == torch.float32 and torch.isfinite(x.grad).all()


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16])
def test_model_in_storage_dtype(dtype):
    model = SRU(D_IN, H, bidirectional=True, layer_norm=True).to(dtype)
    x = torch.randn(L, B, D_IN, dtype=dtype, requires_grad=True)
    with trace_storage_dtypes() as calls:
        h, c = model(x)
        h.float().sum().backward()
    assert h.dtype == dtype and c.dtype == dtype
    assert {call.storage_dtype for call in calls} == {dtype}
    assert torch.isfinite(x.grad).all()


def test_gradcheck_float64_through_the_layer():
    cell = SRUCell(5, 3, bidirectional=True, n_proj=2, layer_norm=True, highway_bias=-1.0).double()
    x = torch.randn(3, 2, 5, dtype=torch.float64, requires_grad=True)
    c0 = torch.randn(2, 6, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[False, False], [False, False], [False, True]])

    def run(x, c0, weight, weight_proj, weight_c, bias):
        parameters = dict(weight=weight, weight_proj=weight_proj, weight_c=weight_c, bias=bias)
        h, c = torch.func.functional_call(cell, parameters, (x, c0), dict(mask_pad=mask))
        return h, c

    inputs = (x, c0) + tuple(
        getattr(cell, name).detach().clone().requires_grad_(True)
        for name in ("weight", "weight_proj", "weight_c", "bias")
    )
    assert torch.autograd.gradcheck(run, inputs, fast_mode=True)


@pytest.mark.parametrize("layer", [SRUCell, SRU, SRUpp], ids=lambda layer: layer.__name__)
def test_the_options_are_kept_in_the_types_the_layers_work_with(layer):
    """One rule (`nn.common.store_settings`) keeps every layer's options: flags as bool, the
    highway bias and weight_c_init as float, whatever numbers were passed."""
    sizes = (4, 4, 4) if layer is SRUpp else (4, 4)
    built = layer(*sizes, bidirectional=1, rescale=0, normalize_after=1, highway_bias=-1, weight_c_init=2)
    for name in ("bidirectional", "rescale", "normalize_after"):
        assert type(getattr(built, name)) is bool, name
    assert built.bidirectional and not built.rescale and built.output_size == 8 and built.num_directions == 2
    assert type(built.highway_bias) is float and type(built.weight_c_init) is float


@pytest.mark.parametrize(
    "options",
    [{}, {"dropout": 0.2}, {"bidirectional": True}, {"layer_norm": True}, {"rnn_dropout": 0.2}, {"projection_size": 8}],
)
def test_the_skip_gradient_folded_into_the_projection_changes_no_gradient(monkeypatch, options):
    """The layers add the skip term's gradient inside the projection's input gradient where the
    skip reads the projection's input; the gradients are those of the two separate uses."""
    import warnings

    from sru_lightning.nn import cell

    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        stack = SRU(32, 16 if options.get("bidirectional") else 32, num_layers=3, **options).train()
    x = torch.randn(7, 3, 32, requires_grad=True)
    grad = torch.randn(7, 3, 32)

    def gradients():
        stack.zero_grad()
        x.grad = None
        torch.manual_seed(1)  # the same dropout masks in both runs
        h, _ = stack(x)
        h.backward(grad)
        return [h.detach(), x.grad, *(p.grad for p in stack.parameters() if p.grad is not None)]

    folds = []
    with_skip = cell.input_projection_with_skip
    monkeypatch.setattr(cell, "input_projection_with_skip", lambda *args: folds.append(1) or with_skip(*args))
    folded = gradients()
    # The skip reads the projection's input unless a layer norm, rnn_dropout or a factorised
    # projection sits between them.
    assert len(folds) == (0 if {"layer_norm", "rnn_dropout", "projection_size"} & set(options) else 3)
    monkeypatch.setattr(cell.SRUCell, "_skip_is_projection_input", lambda self, x, residual: False)
    separate = gradients()
    assert len(folded) == len(separate)
    for a, b in zip(folded, separate):
        assert torch.equal(a, b)
