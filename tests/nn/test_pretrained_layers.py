"""The layers' own save_pretrained / from_pretrained: a folder of config.json (the layer's config
object) and model.safetensors that rebuilds the same layer, and one-line refusals of anything
else; folders of the first layer format still load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from sru_lightning.nn import SRU, SRUCell, SRUpp
from sru_lightning.nn.configs import SRUConfig

LAYERS = {
    "SRU": lambda: SRU(8, 16, num_layers=2, layer_norm=True, highway_bias=-1.0, rescale=True),
    "SRU-bidirectional-projected": lambda: SRU(8, 8, num_layers=2, bidirectional=True, projection_size=4),
    "SRUCell": lambda: SRUCell(8, 8, layer_norm=True),
    "SRUpp": lambda: SRUpp(8, 16, 4, num_layers=2, attention_every_n_layers=1),
}


def _output(layer, x):
    out = layer(x)
    return out[0] if isinstance(out, tuple) else out


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_a_saved_layer_is_rebuilt_with_the_same_weights_and_outputs(name, tmp_path):
    torch.manual_seed(0)
    layer = LAYERS[name]().eval()
    layer.save_pretrained(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["format_name"] == "sru_lightning-pretrained" and config["format_version"] == 2
    assert config["architecture"] == type(layer).__name__ and config["config"] == layer.pretrained_config.to_dict()
    loaded = type(layer).from_pretrained(tmp_path).eval()
    assert loaded.pretrained_config == layer.pretrained_config
    x = torch.randn(5, 3, 8)
    assert torch.equal(_output(loaded, x), _output(layer, x))
    for (key, a), (_, b) in zip(layer.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert torch.equal(a, b), key


def test_the_config_holds_the_constructor_arguments_with_the_defaults():
    layer = SRU(4, 6, num_layers=1, dropout=0.1)
    config = layer.pretrained_config
    assert type(config) is SRUConfig
    assert config.input_size == 4 and config.hidden_size == 6 and config.dropout == 0.1
    assert config.recurrence_policy == "auto" and config.highway_bias == 0.0
    # The cells inside have their own.
    assert layer.rnn_lst[0].pretrained_config.input_size == 4
    assert SRU(**config.to_dict()).pretrained_config == config


def test_a_double_layer_comes_back_in_double(tmp_path):
    layer = SRUCell(4, 4).double().eval()
    layer.save_pretrained(tmp_path)
    loaded = SRUCell.from_pretrained(tmp_path).eval()
    x = torch.randn(3, 2, 4, dtype=torch.float64)
    assert loaded.weight.dtype == torch.float64 and torch.equal(loaded(x)[0], layer(x)[0])


def test_a_layer_with_a_module_argument_is_refused_by_name(tmp_path):
    layer = SRU(4, 4, num_layers=1, custom_m=torch.nn.Linear(4, 12))
    with pytest.raises(ValueError, match=r"argument\(s\) custom_m are not plain values"):
        layer.save_pretrained(tmp_path)
    assert not (tmp_path / "config.json").exists()


@pytest.fixture
def saved(tmp_path):
    SRU(8, 16, num_layers=2).save_pretrained(tmp_path)
    return tmp_path


def test_a_missing_file_is_named(saved):
    (saved / "model.safetensors").unlink()
    with pytest.raises(
        ValueError, match=r"^SRU.from_pretrained: cannot load '.*/model.safetensors': the weights file is"
    ):
        SRU.from_pretrained(saved)
    (saved / "config.json").unlink()
    with pytest.raises(ValueError, match=r"config.json': the file is missing"):
        SRU.from_pretrained(saved)


def test_a_folder_of_another_class_or_library_is_refused(saved):
    with pytest.raises(ValueError, match=r"it holds a 'SRU'; read it with SRU.from_pretrained$"):
        SRUpp.from_pretrained(saved)
    config = json.loads((saved / "config.json").read_text())
    (saved / "config.json").write_text(json.dumps({**config, "config": {**config["config"], "hiden_size": 3}}))
    with pytest.raises(ValueError, match=r"`config`: unknown key\(s\) 'hiden_size' for a SRU \(its keys: input_size,"):
        SRU.from_pretrained(saved)
    (saved / "config.json").write_text(json.dumps({**config, "format_version": 3}))
    with pytest.raises(
        ValueError,
        match=r"`format_version` is 3, and this sru_lightning reads \[1, 2\] of 'sru_lightning-pretrained' only$",
    ):
        SRU.from_pretrained(saved)
    for odd in ({"format_name": ["a"]}, {**config, "architecture": ["SRU"]}):
        (saved / "config.json").write_text(json.dumps(odd))
        with pytest.raises(ValueError, match=r"`(format_name|architecture)` must be .*, got \['"):
            SRU.from_pretrained(saved)
    (saved / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 16}))
    with pytest.raises(ValueError, match=r"`format_name` must be 'sru_lightning-pretrained', got None \(the config of"):
        SRU.from_pretrained(saved)
    (saved / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"config.json': it is not JSON"):
        SRU.from_pretrained(saved)


def test_truncated_or_mismatched_weights_are_refused(saved):
    weights = saved / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"model.safetensors': it is not a safetensors file that can be read"):
        SRU.from_pretrained(saved)
    weights.write_bytes(data)
    config = json.loads((saved / "config.json").read_text())
    config["config"]["hidden_size"] = 12
    (saved / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        ValueError,
        match=r"the weights do not fit the SRU of config.json \(shapes: rnn_lst.0.bias \(32,\) \(expected \(24,\)\)",
    ):
        SRU.from_pretrained(saved)
    config["config"]["num_layers"], config["config"]["hidden_size"] = 3, 16
    (saved / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"the weights do not fit the SRU of config.json \(missing tensors: rnn_lst.2"):
        SRU.from_pretrained(saved)
    config["config"]["num_layers"] = 0
    (saved / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        ValueError, match=r"config.json': it describes no SRU that can be built: SRU: `num_layers` must"
    ):
        SRU.from_pretrained(saved)


def test_the_saving_example_in_the_layers_page_runs():
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "layers.md").read_text()
    section = page.split("## Saving and sharing a layer", 1)[1].split("\n## ", 1)[0]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    exec(compile(code, "docs/layers.md (Saving and sharing a layer)", "exec"), {})


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "pretrained_v1"
LAYER_FIXTURES = {"layer-sru": SRU, "layer-srucell": SRUCell, "layer-srupp": SRUpp}


@pytest.mark.parametrize("name", sorted(LAYER_FIXTURES))
def test_a_layer_folder_of_format_version_1_loads_to_the_outputs_it_was_saved_with(name):
    """Folders written by the first layer format (config.json `sru_lightning-layer`, version 1:
    the recorded constructor arguments) stay readable: committed, with the outputs they gave."""
    expected = torch.load(FIXTURES / "expected_outputs.pt", weights_only=True)
    layer = LAYER_FIXTURES[name].from_pretrained(FIXTURES / name).eval()
    with torch.no_grad():
        h, c = layer(expected["layer_input"])[:2]
    # Within float32 rounding, not bit for bit: the matrix products' kernels, and so the last
    # bits of their sums, differ from one CPU's vector instructions to another's.
    torch.testing.assert_close(h, expected[f"{name}.h"], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(c, expected[f"{name}.c"], rtol=1e-5, atol=1e-6)


def test_keys_a_writer_adds_to_config_json_are_kept_and_read_back(tmp_path):
    """A writer may add its own keys to config.json (an export adds `tokenizer` and `source`;
    another library's loader may need `model_type`); the reader hands them back and builds the
    same layer."""
    from sru_lightning.nn.pretrained import read_pretrained_config, write_pretrained

    layer = SRUCell(4, 4)
    write_pretrained(layer, tmp_path, extra={"model_type": "sru", "source": {"step": 3}})
    read = read_pretrained_config(tmp_path, ("SRUCell",))
    assert read.config == layer.pretrained_config and read.torch_dtype == "float32"
    assert read.extra["model_type"] == "sru" and read.extra["source"] == {"step": 3}
    assert SRUCell.from_pretrained(tmp_path).pretrained_config == layer.pretrained_config
    with pytest.raises(ValueError, match=r"`extra` must not set the format's own keys, got \['format_version'\]"):
        write_pretrained(layer, tmp_path, extra={"format_version": 9})
