"""The config object of each architecture (what a folder of weights records) is its
constructor's argument list: same names, same defaults, only a module argument left out."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from sru_lightning.nn import SRU, LanguageNet, SRUCell, SRUpp
from sru_lightning.nn.configs import CONFIGS, LanguageNetConfig, SRUCellConfig, SRUConfig, SRUppConfig

ARCHITECTURES = {SRUCell: SRUCellConfig, SRU: SRUConfig, SRUpp: SRUppConfig, LanguageNet: LanguageNetConfig}
#: Constructor arguments that JSON cannot describe, so no config holds them.
NOT_IN_A_CONFIG = {"custom_m"}


@pytest.mark.parametrize("cls", list(ARCHITECTURES), ids=lambda cls: cls.__name__)
def test_a_config_has_the_constructors_arguments_and_defaults(cls):
    config = ARCHITECTURES[cls]
    assert cls.config_class is config and CONFIGS[config.architecture] is config and config.architecture == cls.__name__
    parameters = [
        p for p in list(inspect.signature(cls.__init__).parameters.values())[1:] if p.name not in NOT_IN_A_CONFIG
    ]
    fields = dataclasses.fields(config)
    assert [field.name for field in fields] == [parameter.name for parameter in parameters]
    for field, parameter in zip(fields, parameters, strict=True):
        default = dataclasses.MISSING if parameter.default is inspect.Parameter.empty else parameter.default
        assert field.default == default, field.name


def test_a_network_rebuilds_from_its_config_and_its_mapping_is_the_config_property():
    net = LanguageNet(20, rnn="srupp", embedding_dim=8, hidden_size=8, sru_options={"proj_size": 4}, memory_length=3)
    config = net.pretrained_config
    assert config.to_dict() == net.config and config.sru_options == {"proj_size": 4}
    assert LanguageNet(**config.to_dict()).pretrained_config == config
    assert LanguageNetConfig.from_dict(net.config) == config


def test_a_mapping_of_unknown_or_missing_keys_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^unknown key\(s\) 'hidden' for a SRU \(its keys: input_size, hidden_size,"):
        SRUConfig.from_dict({"input_size": 4, "hidden": 8})
    with pytest.raises(ValueError, match=r"^key\(s\) 'hidden_size' missing: a SRU needs them$"):
        SRUConfig.from_dict({"input_size": 4})


def test_a_layer_keeps_the_arguments_it_was_called_with_not_what_it_made_of_them():
    """`amp_recurrence_fp16=True` selects the "half" policy, but the config records the call:
    rebuilding from it resolves the flag again."""
    layer = SRU(4, 4, amp_recurrence_fp16=True)
    assert layer.recurrence_policy == "half"
    assert layer.pretrained_config.amp_recurrence_fp16 is True and layer.pretrained_config.recurrence_policy == "auto"
