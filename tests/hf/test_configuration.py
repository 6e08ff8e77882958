"""SRULightningConfig: the fields of LanguageNetConfig, read from the package's config.json."""

from __future__ import annotations

import dataclasses
import json

import pytest

pytest.importorskip(
    "transformers", reason="the transformers classes need the `hf` extra: pip install 'sru_lightning[hf]'"
)

from transformers import AutoConfig  # noqa: E402

from sru_lightning.hf import SRULightningConfig  # noqa: E402
from sru_lightning.nn.configs import LanguageNetConfig  # noqa: E402


def test_its_fields_are_the_language_networks_with_the_same_defaults():
    fields = {field.name: field for field in dataclasses.fields(SRULightningConfig)}
    for field in dataclasses.fields(LanguageNetConfig):
        assert field.name in fields, field.name
        if field.default is not dataclasses.MISSING:  # vocab_size has none in the network's
            assert fields[field.name].default == field.default, field.name


def test_autoconfig_reads_an_export_folders_config_json(folders):
    folder = folders["srupp"]
    header = json.loads((folder / "config.json").read_text())
    config = AutoConfig.from_pretrained(folder)
    assert type(config) is SRULightningConfig and header["model_type"] == "sru_lightning"
    assert config.network_config() == LanguageNetConfig.from_dict(header["config"])
    assert config.tokenizer["level"] == "char" and config.source == {"global_step": 3}
    assert not config.tie_word_embeddings and AutoConfig.from_pretrained(folders["sru"]).tie_word_embeddings


def test_an_unknown_network_key_is_refused_naming_it():
    with pytest.raises(ValueError, match="unknown key\\(s\\) 'hidden'"):
        SRULightningConfig(config={"vocab_size": 5, "hidden": 3})
