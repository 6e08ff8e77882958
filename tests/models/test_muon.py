"""MuonAdamW: Muon steps the hidden matrices, AdamW everything else, as one resumable optimizer."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from sru_lightning.models.muon import MuonAdamW, is_hidden_matrix, refuse_sharded_engine
from sru_lightning.nn import SRU


class _TinyNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(11, 8)
        self.rnn = SRU(8, 8, num_layers=2)
        self.norm = nn.LayerNorm(8)
        self.decoder = nn.Linear(8, 11)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.rnn(self.embedding(tokens))
        return self.decoder(self.norm(hidden))


def _loss(net: nn.Module, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 11, (6, 3), generator=generator)
    return net(tokens).square().mean()


def _train(net: nn.Module, optimizer: torch.optim.Optimizer, seeds) -> None:
    for seed in seeds:
        optimizer.zero_grad()
        _loss(net, seed).backward()
        optimizer.step()


def test_hidden_matrices_go_to_muon_and_the_rest_to_adamw():
    torch.manual_seed(0)
    net = _TinyNet()
    optimizer = MuonAdamW(net.named_parameters(), lr=1e-2)
    rules = {id(p): group["rule"] for group in optimizer.param_groups for p in group["params"]}
    names = dict(net.named_parameters())
    muon = sorted(name for name, p in names.items() if rules[id(p)] == "muon")
    # Every SRU layer's projection weight is a 2-D hidden matrix; nothing else is.
    assert muon == ["rnn.rnn_lst.0.weight", "rnn.rnn_lst.1.weight"]
    for name in ("embedding.weight", "decoder.weight", "decoder.bias", "norm.weight"):
        assert rules[id(names[name])] == "adamw", name
    assert any("weight_c" in name and rules[id(p)] == "adamw" for name, p in names.items())
    assert sorted(optimizer.muon_names) == muon


def test_steps_equal_torch_muon_and_adamw_side_by_side():
    torch.manual_seed(0)
    net = _TinyNet()
    twin = copy.deepcopy(net)
    optimizer = MuonAdamW(net.named_parameters(), lr=3e-3, weight_decay=0.05)
    named = list(twin.named_parameters())
    muon = torch.optim.Muon(
        [p for n, p in named if is_hidden_matrix(n, p)], lr=3e-3, weight_decay=0.05, adjust_lr_fn="match_rms_adamw"
    )
    adamw = torch.optim.AdamW([p for n, p in named if not is_hidden_matrix(n, p)], lr=3e-3, weight_decay=0.05)
    for seed in range(4):
        for opt in (optimizer, muon, adamw):
            opt.zero_grad()
        _loss(net, seed).backward()
        _loss(twin, seed).backward()
        optimizer.step()
        muon.step()
        adamw.step()
    for (name, a), (_, b) in zip(net.named_parameters(), twin.named_parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)


def test_a_scheduler_scales_both_parts():
    net = _TinyNet()
    optimizer = MuonAdamW(net.named_parameters(), lr=1e-2, muon_lr=2e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5**step)
    _train(net, optimizer, [0])
    scheduler.step()
    assert sorted(group["lr"] for group in optimizer.param_groups) == [5e-3, 1e-2]
    for part in optimizer._parts.values():
        assert part.param_groups[0]["lr"] in (5e-3, 1e-2)


def test_resume_from_its_state_dict_continues_exactly():
    torch.manual_seed(1)
    net = _TinyNet()
    resumed_net = copy.deepcopy(net)
    optimizer = MuonAdamW(net.named_parameters(), lr=5e-3)
    _train(net, optimizer, range(3))
    saved_net, saved_opt = copy.deepcopy(net.state_dict()), copy.deepcopy(optimizer.state_dict())
    _train(net, optimizer, range(3, 6))

    resumed_net.load_state_dict(saved_net)
    resumed = MuonAdamW(resumed_net.named_parameters(), lr=5e-3)
    resumed.load_state_dict(saved_opt)
    _train(resumed_net, resumed, range(3, 6))
    for (name, a), (_, b) in zip(net.named_parameters(), resumed_net.named_parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
    # The state survives a round trip through torch.save with weights_only loading.
    buffer = __import__("io").BytesIO()
    torch.save(optimizer.state_dict(), buffer)
    buffer.seek(0)
    MuonAdamW(_TinyNet().named_parameters()).load_state_dict(torch.load(buffer, weights_only=True))


def test_a_state_dict_of_another_split_is_refused():
    net = _TinyNet()
    optimizer = MuonAdamW(net.named_parameters())
    plain = MuonAdamW(net.named_parameters(), hidden_matrix=lambda name, p: False)
    with pytest.raises(ValueError, match=r"groups are \['adamw'\], this one's \['muon', 'adamw'\]"):
        optimizer.load_state_dict(plain.state_dict())


def test_bad_arguments_are_named():
    with pytest.raises(TypeError, match="`named_params` must be a module or"):
        MuonAdamW(_TinyNet().parameters())
    frozen = nn.Linear(2, 2).requires_grad_(False)
    with pytest.raises(ValueError, match="no parameter that requires a gradient"):
        MuonAdamW(frozen.named_parameters())


@pytest.mark.parametrize("engine", ["DeepSpeedStrategy", "FSDPStrategy", "ModelParallelStrategy"])
def test_sharding_engines_are_refused_in_one_line(engine):
    strategy = type(engine, (), {})()
    with pytest.raises(ValueError, match=rf"the {engine} engine .* needs whole matrices"):
        refuse_sharded_engine(strategy)


def test_ddp_and_single_process_are_accepted():
    from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy

    refuse_sharded_engine(DDPStrategy())
    refuse_sharded_engine(SingleDeviceStrategy(device=torch.device("cpu")))
