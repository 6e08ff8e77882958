"""What the transformers tests (tests/hf/) share: the language network of each architecture (SRU
with a tied output layer, SRU++ with a bounded attention memory, the LSTM baseline) exported with
`format=hf` and a character codec."""

from __future__ import annotations

from pathlib import Path

import torch

from sru_lightning.data import TokenCodec
from sru_lightning.export.pretrained import save_pretrained
from sru_lightning.nn import LanguageNet

ALPHABET = list("abcdefghij .,\nT")
NETWORKS = {
    "sru": dict(rnn="sru", tie_weights=True, sru_options={"highway_bias": -2.0, "rescale": True}),
    "srupp": dict(rnn="srupp", sru_options={"proj_size": 8, "attention_last_n_layers": 1}, memory_length=6),
    "lstm": dict(rnn="lstm"),
}


def network(name: str) -> LanguageNet:
    torch.manual_seed(0)
    return LanguageNet(len(ALPHABET), embedding_dim=8, hidden_size=16, num_layers=2, **NETWORKS[name]).eval()


def write_folders(root: Path) -> dict[str, Path]:
    """An export folder of each network under `root`, by name."""
    codec = TokenCodec("char", ALPHABET)
    return {name: save_pretrained(network(name), root / name, codec, source={"global_step": 3}) for name in NETWORKS}
