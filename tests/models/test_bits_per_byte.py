"""`{stage}_bpb`: bits per UTF-8 byte, the summed cross-entropy of the predicted tokens over the
summed byte lengths of those tokens (the datamodule's `token_byte_lengths()`), so runs of
characters, bytes and BPE subwords compare; BPE runs name their per-token metrics `bpt`."""

from __future__ import annotations

import json
import math

import pytest
from helpers.language_models import language_model
from helpers.tiny_trainer import tiny_trainer
from lightning.pytorch import Trainer, seed_everything

from sru_lightning.data import DocumentsDataModule, TextDataModule

ASCII = "".join(f"line {i}: the quick brown fox jumps over the lazy dog {i * 7 % 13}.\n" for i in range(120))
NON_ASCII = ASCII.replace("fox", "füx").replace("dog", "狗")


def _trainer(**settings) -> Trainer:
    return tiny_trainer(**settings)


def _model(data):
    seed_everything(0, verbose=False)
    return language_model(
        vocab_size=data.vocab_size,
        rnn="lstm",
        embedding_dim=8,
        hidden_size=16,
        num_layers=1,
        token_unit=data.token_unit,
    )


def _text_module(tmp_path, text: str, **settings) -> TextDataModule:
    path = tmp_path / "text.txt"
    path.write_text(text, encoding="utf-8")
    return TextDataModule(path=str(path), batch_size=2, seq_len=16, val_fraction=0.1, test_fraction=0.1, **settings)


def _predicted(data, split: str = "val") -> tuple[int, int]:
    """(tokens, bytes) of the targets the split's loader yields (ignored targets left out)."""
    data.setup()
    lengths = data.token_byte_lengths()
    tokens = total = 0
    loader = data.val_dataloader() if split == "val" else data.test_dataloader()
    for _, targets, *_ in loader:
        kept = targets[targets >= 0]
        tokens += kept.numel()
        total += int(lengths[kept].sum())
    return tokens, total


def test_bits_per_byte_equal_bits_per_character_for_ascii_characters(tmp_path):
    data = _text_module(tmp_path, ASCII)
    metrics = _trainer().validate(_model(data), datamodule=data, verbose=False)[0]
    assert metrics["val_bpb"] == pytest.approx(metrics["val_bpc"], rel=1e-6)
    assert metrics["val_bpc"] > 1.0


def test_bits_per_byte_divide_by_the_utf8_bytes_of_non_ascii_characters(tmp_path):
    data = _text_module(tmp_path, NON_ASCII)
    tokens, total = _predicted(data)
    assert total > tokens  # ü and 狗 are several bytes
    metrics = _trainer().validate(_model(data), datamodule=data, verbose=False)[0]
    assert metrics["val_bpb"] == pytest.approx(metrics["val_bpc"] * tokens / total, rel=1e-5)


def test_bpe_runs_log_bits_per_token_and_per_byte(tmp_path):
    data = _text_module(tmp_path, NON_ASCII, tokenizer="bpe", vocab_size=300)
    assert data.token_unit == "token"
    tokens, total = _predicted(data, "test")
    assert total > 1.5 * tokens  # subwords of several bytes
    model = _model(data)
    trainer = _trainer(max_steps=2, limit_val_batches=1)
    trainer.fit(model, datamodule=data)
    assert {"train_bpt", "train_bpb"} <= set(trainer.callback_metrics)
    validated = trainer.validate(model, datamodule=data, verbose=False)[0]
    assert {"val_bpt", "val_bpb", "val_token_ppl"} <= set(validated) and "val_bpc" not in validated
    metrics = trainer.test(model, datamodule=data, verbose=False)[0]
    assert metrics["test_bpb"] == pytest.approx(metrics["test_bpt"] * tokens / total, rel=1e-5)
    assert metrics["test_token_ppl"] == pytest.approx(2 ** metrics["test_bpt"], rel=1e-5)


def test_packed_documents_count_the_bytes_of_predicted_tokens_only(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text("\n".join(json.dumps({"text": ASCII[i : i + 300]}) for i in range(0, 6000, 300)), encoding="utf-8")
    data = DocumentsDataModule(path=str(path), batch_size=2, seq_len=16, val_fraction=0.2, test_fraction=0.1)
    model = language_model(vocab_size=data.vocab_size, embedding_dim=8, hidden_size=16, num_layers=1)
    metrics = _trainer().validate(model, datamodule=data, verbose=False)[0]
    assert metrics["val_bpb"] == pytest.approx(metrics["val_bpc"], rel=1e-6)


def test_no_bits_per_byte_without_a_datamodule_that_gives_byte_lengths(tmp_path):
    data = _text_module(tmp_path, ASCII)
    data.setup()
    metrics = _trainer().validate(_model(data), dataloaders=data.val_dataloader(), verbose=False)[0]
    assert "val_bpc" in metrics and "val_bpb" not in metrics
    assert math.isfinite(metrics["val_bpc"])


def test_byte_lengths_of_another_vocabulary_are_not_used(tmp_path):
    data = _text_module(tmp_path, ASCII)
    model = language_model(vocab_size=data.vocab_size + 1, rnn="lstm", embedding_dim=8, hidden_size=16, num_layers=1)
    metrics = _trainer().validate(model, datamodule=data, verbose=False)[0]
    assert "val_bpc" in metrics and "val_bpb" not in metrics and model.token_bytes is None
