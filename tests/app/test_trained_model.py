"""A trained model rebuilt from a run's checkpoint (`app/runs/trained_model.py`): what cannot be
read is one usage error naming the checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest

from sru_lightning.app.runs.trained_model import load_codec
from sru_lightning.app.usage import UsageError


@pytest.mark.parametrize(
    "state, reason",
    [
        ({"level": "bpe", "itos": None, "tokenizer": "{not json"}, "cannot be read"),
        ({"level": "syllable", "itos": ["a", "b"]}, "cannot be read: TokenCodec: `level` must be one of"),
    ],
)
def test_a_damaged_vocabulary_in_a_checkpoint_is_one_usage_error(state, reason):
    with pytest.raises(UsageError, match=reason) as raised:
        load_codec({"TextDataModule": {"token_codec": state}}, Path("/runs/x/last.ckpt"))
    assert "'/runs/x/last.ckpt'" in str(raised.value) and "\n" not in str(raised.value)
