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
    ],
)
def test_bad_arguments_are_refused_in_one_line_naming_them(arguments, message):
    with pytest.raises(ValueError, match=message):
        LanguageNet(vocab_size=11, **arguments)


@pytest.mark.slow  # imports in a fresh interpreter
def test_the_network_imports_neither_lightning_nor_hydra():
    import subprocess
    import sys

    script = "import sys, sru_lightning.nn.language_net; print([m for m in ('lightning', 'hydra') if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.stdout.strip() == "[]", out.stderr[-2000:]
