"""The interfaces a run relies on (sru_lightning/app/runs/interfaces.py) are what the package's
own data modules and models provide, found without running a property."""

from __future__ import annotations

import pytest
import torch

from sru_lightning.app.runs import interfaces
from sru_lightning.app.runs.interfaces import provides
from sru_lightning.data import DocumentsDataModule, PydocDataModule
from sru_lightning.models import SRULanguageModel
from sru_lightning.nn import LanguageNet


def model(rnn: str) -> SRULanguageModel:
    return SRULanguageModel(net=LanguageNet(vocab_size=10, embedding_dim=4, hidden_size=8, num_layers=1, rnn=rnn))


@pytest.mark.parametrize("rnn, keeps_apart", [("sru", True), ("lstm", False)])
def test_the_language_model_names_its_metrics_and_says_whether_it_keeps_documents_apart(rnn, keeps_apart):
    trained = model(rnn)
    assert provides(trained, interfaces.NamesItsMetrics) and trained.bits_name("val") == "val_bpc"
    assert provides(trained, interfaces.KeepsDocumentsApart)
    assert trained.accepts_document_boundaries is keeps_apart
    assert not provides(torch.nn.Linear(2, 2), interfaces.NamesItsMetrics)


def test_the_data_modules_provide_what_runs_ask_without_reading_their_text(monkeypatch):
    data = PydocDataModule()
    for protocol in (interfaces.RunDataModule, interfaces.TokenUnitData, interfaces.AdoptsVocabulary):
        assert provides(data, protocol), protocol
    assert provides(data, interfaces.ChecksSizes) and not provides(data, interfaces.PacksDocuments)
    assert provides(DocumentsDataModule, interfaces.PacksDocuments)
    assert data._corpus is None  # the checks read no text (vocab_size would have)


def test_a_data_module_of_the_users_own_is_asked_only_for_what_it_has():
    class Minimal:
        vocab_size = 5

    assert provides(Minimal(), interfaces.RunDataModule)
    assert not any(
        provides(Minimal(), protocol)
        for protocol in (interfaces.TokenUnitData, interfaces.AdoptsVocabulary, interfaces.ChecksSizes)
    )
