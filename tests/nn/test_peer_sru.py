"""Parity with the `sru` package: same initial weights from a seed, its checkpoints load
directly, and outputs and gradients agree (fp32, 1e-5 relative) across option combinations."""

from __future__ import annotations

import io
import random

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

import sru_lightning.nn as ours

pytestmark = [
    pytest.mark.peer,
    pytest.mark.filterwarnings("ignore::UserWarning"),  # sru: no CUDA, CPU grad loop, rnn_dropout
    pytest.mark.filterwarnings("ignore::FutureWarning"),  # ours: rnn_dropout is deprecated
]

RELATIVE_TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def sru():
    return pytest.importorskip("sru")


def assert_relative(actual, expected, what):
    """||actual - expected|| <= 1e-5 * ||expected|| (plus a floor for all-zero tensors)."""
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} vs {expected.shape}"
    error = (actual.double() - expected.double()).norm().item()
    scale = expected.double().norm().item()
    assert error <= RELATIVE_TOLERANCE * scale + 1e-7, f"{what}: |diff| {error:.3g} vs |ref| {scale:.3g}"


def sample_stack_options(rng: random.Random) -> dict:
    bidirectional = rng.random() < 0.5
    hidden_size = rng.choice([3, 4, 5])
    output_size = hidden_size * (2 if bidirectional else 1)
    return dict(
        # input == output gives k = 3 (skip from the input) in the first layer, else k = 4
        input_size=rng.choice([output_size, 6, 7]),
        hidden_size=hidden_size,
        num_layers=rng.choice([1, 2, 3]),
        dropout=rng.choice([0.0, 0.0, 0.3]),
        rnn_dropout=rng.choice([0.0, 0.0, 0.0, 0.2]),
        bidirectional=bidirectional,
        projection_size=rng.choice([0, 0, 2, 3]),
        layer_norm=rng.random() < 0.5,
        normalize_after=rng.random() < 0.5,
        highway_bias=rng.choice([0.0, -1.5, 0.5]),
        has_skip_term=rng.random() < 0.8,
        rescale=rng.random() < 0.5,
        v1=rng.random() < 0.15,
        weight_c_init=rng.choice([None, None, 0.3]),
        proj_input_to_hidden_first=rng.random() < 0.25,
        nn_rnn_compatible_return=rng.random() < 0.3,
    )


def perturb_(module: nn.Module, seed: int) -> None:
    """Move every parameter and buffer off its initial value, so loading must carry them all."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for tensor in list(module.parameters()) + list(module.buffers()):
            tensor.add_(0.1 * torch.randn(tensor.shape, generator=generator, dtype=tensor.dtype))


def checkpoint_bytes(module: nn.Module) -> io.BytesIO:
    buffer = io.BytesIO()
    torch.save(module.state_dict(), buffer)
    buffer.seek(0)
    return buffer


def run_and_grad(model, x, c0, mask_pad, seed, output_weight, state_weight):
    """Forward (seeded, so dropout masks agree) and backward; returns outputs and gradients."""
    x = x.clone().requires_grad_(True)
    c0 = None if c0 is None else c0.clone().requires_grad_(True)
    torch.manual_seed(seed)
    h, c = model(x, c0, mask_pad=mask_pad)
    ((h * output_weight).sum() + (c * state_weight).sum()).backward()
    grads = {name: p.grad for name, p in model.named_parameters() if p.grad is not None}
    grads["input"] = x.grad
    if c0 is not None:
        grads["c0"] = c0.grad
    return h.detach(), c.detach(), grads


@pytest.mark.parametrize("case", range(24))
def test_sru_stack_parity_random_options(sru, case):
    rng = random.Random(1000 + case)
    options = sample_stack_options(rng)
    length, batch = rng.choice([1, 3, 6]), rng.choice([1, 3])
    train = rng.random() < 0.5
    use_c0, use_mask = rng.random() < 0.6, rng.random() < 0.6

    torch.manual_seed(case)
    peer = sru.SRU(**options)
    torch.manual_seed(case)
    model = ours.SRU(**options)
    # Same recipe and same random-number order: identical initial weights.
    peer_state = peer.state_dict()
    assert list(model.state_dict()) == list(peer_state), options
    for name, value in model.state_dict().items():
        assert torch.equal(value, peer_state[name]), f"initial {name} differs for {options}"

    perturb_(peer, seed=case)
    torch.manual_seed(case + 7)
    model = ours.SRU(**options)
    model.load_state_dict(torch.load(checkpoint_bytes(peer)))
    peer.train(train)
    model.train(train)

    dirs = 2 if options["bidirectional"] else 1
    output_size = dirs * options["hidden_size"]
    x = torch.randn(length, batch, options["input_size"])
    c0 = torch.randn(options["num_layers"], batch, output_size) if use_c0 else None
    mask_pad = None
    if use_mask and length > 1:
        mask_pad = torch.zeros(length, batch, dtype=torch.bool)
        mask_pad[length - 1 :, 0] = True
    output_weight = torch.randn(length, batch, output_size)
    state_weight = torch.randn(options["num_layers"] * dirs, batch, options["hidden_size"]).reshape(
        options["num_layers"], batch, output_size
    )
    if options["nn_rnn_compatible_return"]:
        state_weight = state_weight.reshape(options["num_layers"] * dirs, batch, options["hidden_size"])

    h_peer, c_peer, grads_peer = run_and_grad(peer, x, c0, mask_pad, case, output_weight, state_weight)
    h, c, grads = run_and_grad(model, x, c0, mask_pad, case, output_weight, state_weight)
    assert_relative(h, h_peer, f"h {options}")
    assert_relative(c, c_peer, f"c {options}")
    assert set(grads) == set(grads_peer)
    for name in grads_peer:
        assert_relative(grads[name], grads_peer[name], f"grad {name} {options}")


@pytest.mark.parametrize("bidirectional", [False, True])
def test_eval_no_grad_parity(sru, bidirectional):
    """No grad: sru runs its C++ CPU kernel, we run the inference entry point."""
    options = dict(
        input_size=5,
        hidden_size=4,
        num_layers=2,
        bidirectional=bidirectional,
        layer_norm=True,
        rescale=True,
        highway_bias=-1.0,
    )
    peer = sru.SRU(**options).eval()
    perturb_(peer, seed=3)
    model = ours.SRU(**options).eval()
    model.load_state_dict(peer.state_dict())
    x, c0 = torch.randn(7, 3, 5), torch.randn(2, 3, model.output_size)
    mask_pad = torch.zeros(7, 3, dtype=torch.bool)
    mask_pad[5:, 2] = True
    with torch.no_grad():
        h_peer, c_peer = peer(x, c0, mask_pad=mask_pad)
        h, c = model(x, c0, mask_pad=mask_pad)
    assert_relative(h, h_peer, "h")
    assert_relative(c, c_peer, "c")


@pytest.mark.parametrize(
    "options",
    [
        dict(input_size=4, hidden_size=4),
        dict(input_size=6, hidden_size=4, n_proj=3, dropout=0.3),
        dict(input_size=8, hidden_size=4, bidirectional=True, layer_norm=True, highway_bias=-2.0),
        dict(input_size=5, hidden_size=3, has_skip_term=False, rescale=False, layer_norm=True, normalize_after=True),
    ],
)
@pytest.mark.parametrize("one_step", [False, True])
def test_sru_cell_parity(sru, options, one_step):
    torch.manual_seed(11)
    peer = sru.SRUCell(**options)
    torch.manual_seed(11)
    model = ours.SRUCell(**options)
    for name, value in model.state_dict().items():
        assert torch.equal(value, peer.state_dict()[name]), name
    perturb_(peer, seed=5)
    model.load_state_dict(torch.load(checkpoint_bytes(peer)))
    shape = (3, options["input_size"]) if one_step else (5, 3, options["input_size"])
    x = torch.randn(shape)
    c0 = torch.randn(3, model.output_size)
    output_weight = torch.randn(shape[:-1] + (model.output_size,))
    state_weight = torch.randn(3, model.output_size)

    h_peer, c_peer, grads_peer = run_and_grad(peer, x, c0, None, 2, output_weight, state_weight)
    h, c, grads = run_and_grad(model, x, c0, None, 2, output_weight, state_weight)
    # sru returns (1, B, out) for one-step input on CPU; ours returns (B, out) like nn.LSTMCell.
    assert_relative(h, h_peer.reshape(h.shape), "h")
    assert_relative(c, c_peer, "c")
    for name in grads_peer:
        assert_relative(grads[name], grads_peer[name], f"grad {name}")


class LinearUV(nn.Module):
    """custom_m returning U and a per-step V added to weight_c."""

    def __init__(self, input_size, u_size, v_size):
        super().__init__()
        self.u = nn.Linear(input_size, u_size)
        self.v = nn.Linear(input_size, v_size)

    def reset_parameters(self):
        self.u.reset_parameters()
        self.v.reset_parameters()

    def forward(self, x):
        return self.u(x), 0.5 * torch.tanh(self.v(x))


@pytest.mark.parametrize("returns_v", [False, True])
def test_custom_m_parity(sru, returns_v):
    hidden, dirs = 3, 2
    # input_size 5 != output size 6, so k = 4 (U carries the skip column)
    custom = LinearUV(5, 4 * hidden * dirs, 2 * hidden * dirs) if returns_v else nn.Linear(5, 4 * hidden * dirs)
    options = dict(input_size=5, hidden_size=hidden, num_layers=1, bidirectional=True, custom_m=custom)
    torch.manual_seed(4)
    peer = sru.SRU(**options)
    model = ours.SRU(**options)
    model.load_state_dict(torch.load(checkpoint_bytes(peer)))
    x, c0 = torch.randn(5, 2, 5), torch.randn(1, 2, hidden * dirs)
    output_weight, state_weight = torch.randn(5, 2, hidden * dirs), torch.randn(1, 2, hidden * dirs)
    h_peer, c_peer, grads_peer = run_and_grad(peer, x, c0, None, 0, output_weight, state_weight)
    h, c, grads = run_and_grad(model, x, c0, None, 0, output_weight, state_weight)
    assert_relative(h, h_peer, "h")
    assert_relative(c, c_peer, "c")
    assert set(grads) == set(grads_peer)
    for name in grads_peer:
        assert_relative(grads[name], grads_peer[name], f"grad {name}")


def test_packed_sequence_parity(sru):
    peer = sru.SRU(4, 3, num_layers=2, bidirectional=True).eval()
    perturb_(peer, seed=9)
    model = ours.SRU(4, 3, num_layers=2, bidirectional=True).eval()
    model.load_state_dict(peer.state_dict())
    x, lengths = torch.randn(6, 3, 4), torch.tensor([4, 6, 2])
    packed = pack_padded_sequence(x, lengths, enforce_sorted=False)
    out_peer, c_peer = peer(packed)
    out, c = model(packed)
    assert_relative(pad_packed_sequence(out)[0], pad_packed_sequence(out_peer)[0], "h")
    assert_relative(c, c_peer, "c")
