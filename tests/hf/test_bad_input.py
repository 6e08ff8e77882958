"""A folder transformers cannot read as this package's model is refused in one line naming the
file: another model type, a missing or truncated model.safetensors, an unknown config key, a
tokenizer.json that does not fit the network."""

from __future__ import annotations

import json
import shutil

import pytest

pytest.importorskip(
    "transformers", reason="the transformers classes need the `hf` extra: pip install 'sru_lightning[hf]'"
)

from transformers import AutoModelForCausalLM  # noqa: E402

from sru_lightning.hf import SRULightningForCausalLM  # noqa: E402


def _edit_config(folder, change):
    config = json.loads((folder / "config.json").read_text())
    change(config)
    (folder / "config.json").write_text(json.dumps(config))


def _truncate(folder):
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])


def _other_tokenizer(folder):
    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    tokenizer["model"]["vocab"] = {"a": 0, "b": 1, "c": 2}
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer))


CASES = {
    "other-model-type": (
        lambda f: (f / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 2})),
        "config.json",
        "`format_name` must be 'sru_lightning-pretrained', got None",
    ),
    "no-weights": (lambda f: (f / "model.safetensors").unlink(), "model.safetensors", "the weights file is missing"),
    "truncated": (_truncate, "model.safetensors", "it is not a safetensors file that can be read"),
    "unknown-key": (
        lambda f: _edit_config(f, lambda c: c["config"].update(hidden=3)),
        "config.json",
        "unknown key(s) 'hidden' for a LanguageNet",
    ),
    "tokenizer": (_other_tokenizer, "tokenizer.json", "it has 3 tokens but the network 15"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_folder_is_refused_in_one_line_naming_the_file(case, folders, tmp_path):
    damage, file, message = CASES[case]
    folder = shutil.copytree(folders["sru"], tmp_path / "folder")
    damage(folder)
    with pytest.raises(ValueError) as error:
        SRULightningForCausalLM.from_pretrained(folder)
    text = str(error.value)
    assert "\n" not in text and str(folder / file) in text and message in text, text
    if case != "other-model-type":  # (transformers builds a GPT-2 from that one: not ours to refuse)
        with pytest.raises(ValueError) as error:
            AutoModelForCausalLM.from_pretrained(folder)
        text = str(error.value)
        assert "\n" not in text and str(folder / file) in text and message in text, text
