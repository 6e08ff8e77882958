"""A language model from one flat list of settings, as the tests spell them: the network's
(sru_lightning.nn.LanguageNet) and the training module's (SRULanguageModel) arguments together."""

from __future__ import annotations

from typing import Any

from sru_lightning.models import SRULanguageModel
from sru_lightning.nn import LanguageNet

#: The arguments of SRULanguageModel besides `net`; every other one is the network's.
TRAINING_ARGUMENTS = ("carry_hidden", "optimizer", "lr_scheduler", "token_unit", "compile")


def language_model(**settings: Any) -> SRULanguageModel:
    training = {name: settings.pop(name) for name in TRAINING_ARGUMENTS if name in settings}
    return SRULanguageModel(LanguageNet(**settings), **training)
