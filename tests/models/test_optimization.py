"""The optimizer builder: params= for plain optimizers, named_params= for a factory asking for it."""

from __future__ import annotations

import torch

from sru_lightning.models.optimization import configure_optimizers
from sru_lightning.nn import LanguageNet


def test_a_factory_taking_named_params_receives_the_networks_names():
    net = LanguageNet(vocab_size=11, embedding_dim=8, hidden_size=12, num_layers=1)
    seen = {}

    def factory(named_params, lr):
        seen["names"] = [name for name, _ in named_params]
        return torch.optim.SGD([param for _, param in named_params], lr=lr)

    def plain(**kwargs):
        seen["plain"] = sorted(kwargs)
        return torch.optim.SGD(kwargs["params"], lr=0.1)

    configure_optimizers(net, plain)
    assert seen == {"plain": ["params"]}  # a factory not naming named_params gets params=, as any optimizer
    config = configure_optimizers(net, lambda named_params: factory(named_params, lr=0.1))
    assert seen["names"][0] == "embedding.weight" and "decoder.bias" in seen["names"]
    assert isinstance(config["optimizer"], torch.optim.SGD)


def test_a_plain_optimizer_and_a_filled_schedule_length():
    net = LanguageNet(vocab_size=11, embedding_dim=8, hidden_size=12, num_layers=1)
    scheduler = {"_target_": "torch.optim.lr_scheduler.OneCycleLR", "max_lr": 0.5, "total_steps": None}
    config = configure_optimizers(net, {"_target_": "torch.optim.SGD", "lr": 0.5}, scheduler, step_estimate=9)
    assert isinstance(config["optimizer"], torch.optim.SGD)
    assert config["lr_scheduler"]["scheduler"].total_steps == 9
