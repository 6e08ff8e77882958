"""LanguageNet: a plain network (no Lightning), rebuilt from its config, with one-line errors."""

from __future__ import annotations

import json

import pytest
import torch

from sru_lightning.nn import LanguageNet, build_network


@pytest.mark.parametrize(
    "options",
    [
        {"rnn": "sru"},
        {"rnn": "lstm"},
        {"rnn": "srupp", "sru_options": {"proj_size": 4}, "memory_length": 3},
        {"rnn": "sru", "tie_weights": True},
        {"rnn": "sru", "time_shared_dropout": True},
    ],
)
def test_the_config_is_json_and_rebuilds_the_same_network(options):
    torch.manual_seed(0)
    net = LanguageNet(vocab_size=11, embedding_dim=8, hidden_size=12, num_layers=2, **options).eval()
    config = json.loads(json.dumps(net.config))
    other = build_network({"_target_": "sru_lightning.nn.LanguageNet", **config})
    other.load_state_dict(net.state_dict())
    tokens = torch.randint(0, 11, (2, 5))
    assert torch.equal(net(tokens)[0], other.eval()(tokens)[0])
    logits, state = net.step(tokens[:, 0])
    assert logits.shape == (2, 11)


def test_a_saved_config_names_only_a_known_network():
    with pytest.raises(ValueError, match="`_target_` must be one of .* got 'os.system'"):
        build_network({"_target_": "os.system", "command": "true"})


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"rnn": "gru"}, r"LanguageNet: `rnn` must be one of \('sru', 'srupp', 'lstm'\), got 'gru'"),
        ({"hidden_size": 0}, "LanguageNet: `hidden_size` must be a positive integer, got 0"),
        ({"dropout": 1.5}, r"LanguageNet: `dropout` must be in \[0, 1\), got 1.5"),
        ({"memory_length": -1}, "LanguageNet: `memory_length` must be an integer >= 0, got -1"),
        ({"rnn": "srupp"}, r"`sru_options.proj_size` .* required with rnn='srupp'"),
        ({"tie_weights": "yes"}, "LanguageNet: `tie_weights` must be true or false, got 'yes'"),
        ({"time_shared_dropout": 1}, "LanguageNet: `time_shared_dropout` must be true or false, got 1"),
    ],
)
def test_bad_arguments_are_refused_in_one_line_naming_them(arguments, message):
    with pytest.raises(ValueError, match=message):
        LanguageNet(vocab_size=11, **arguments)


@pytest.mark.parametrize("rnn", ["sru", "srupp", "lstm"])
def test_time_shared_dropout_keeps_one_mask_per_sequence_over_time(rnn):
    """The embeddings' and the output's dropout: with `time_shared_dropout`, each row of the
    batch loses the same features at every step (as between SRU layers); without it, each
    element draws its own. Evaluation drops nothing either way."""
    p = 0.5
    options = {"sru_options": {"proj_size": 4}} if rnn == "srupp" else {}
    dropped = {}
    for shared in (False, True):
        net = LanguageNet(
            vocab_size=11, rnn=rnn, embedding_dim=8, hidden_size=12, dropout=p, time_shared_dropout=shared, **options
        )
        ones = torch.ones(40, 6, 64)  # (L, B, F), as forward passes them
        torch.manual_seed(1)
        dropped[shared] = net.train()._drop(ones)
        assert set(dropped[shared].unique().tolist()) == {0.0, 1 / (1 - p)}
        assert torch.equal(net.eval()._drop(ones), ones)
    assert all(torch.equal(dropped[True][t], dropped[True][0]) for t in range(40))
    assert not torch.equal(dropped[True][0, 0], dropped[True][0, 1]), "each row draws its own mask"
    assert not all(torch.equal(dropped[False][t], dropped[False][0]) for t in range(40))
    # under bfloat16 autocast the kept values are scaled by 1 / (1 - p) in float32, then stored
    net = LanguageNet(vocab_size=11, dropout=0.3, time_shared_dropout=True).train()
    values = torch.ones(5, 2, 64, dtype=torch.bfloat16)
    kept = net._drop(values)
    assert kept.dtype == torch.bfloat16
    assert set(kept.unique().tolist()) == {0.0, torch.tensor(1 / 0.7).bfloat16().item()}


def test_a_network_with_time_shared_dropout_trains():
    """A training step with the shared masks: a finite loss and a gradient for every parameter."""
    torch.manual_seed(0)
    net = LanguageNet(vocab_size=11, embedding_dim=8, hidden_size=12, dropout=0.3, time_shared_dropout=True)
    tokens = torch.randint(0, 11, (3, 9))
    logits, _ = net.train()(tokens)
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 11), tokens[:, 1:].reshape(-1))
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in net.parameters())


@pytest.mark.slow  # imports in a fresh interpreter
def test_the_network_imports_neither_lightning_nor_hydra():
    import subprocess
    import sys

    script = "import sys, sru_lightning.nn.language_net; print([m for m in ('lightning', 'hydra') if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.stdout.strip() == "[]", out.stderr[-2000:]
