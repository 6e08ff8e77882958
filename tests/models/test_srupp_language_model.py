"""The SRU++ language model (model=srupp), the precision callback and advisor on SRU++ layers."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from helpers.language_models import language_model
from torch.utils.data import DataLoader

from sru_lightning.callbacks import SRUPrecisionCallback, tensor_core_advice
from sru_lightning.nn import SRUpp, SRUppCell
from sru_lightning.ops import trace_storage_dtypes

VOCAB = 11


def tiny(**kwargs):
    options = dict(
        vocab_size=VOCAB,
        rnn="srupp",
        embedding_dim=8,
        hidden_size=12,
        num_layers=2,
        dropout=0.0,
        memory_length=6,
        sru_options={"proj_size": 4, "num_heads": 2},
    )
    options.update(kwargs)
    model = language_model(**options)
    with torch.no_grad():  # let the attention contribute from the start
        for layer in model.net.rnn.rnn_lst:
            layer.transform_module.alpha.fill_(0.5)
    return model


def test_state_holds_c_and_the_capped_memory():
    model = tiny()
    assert isinstance(model.net.rnn, SRUpp)
    logits, state = model(torch.randint(0, VOCAB, (3, 4)))
    assert logits.shape == (3, 4, VOCAB)
    c, *memory = state
    assert c.shape == (2, 3, 12)
    assert [tuple(m.shape) for m in memory] == [(4, 3, 8), (4, 3, 12)]
    _, state = model(torch.randint(0, VOCAB, (3, 4)), state)
    assert [tuple(m.shape) for m in state[1:]] == [(6, 3, 8), (6, 3, 12)]  # memory_length = 6
    assert not any(m.requires_grad for m in state[1:])
    _, state = tiny(memory_length=0)(torch.randint(0, VOCAB, (3, 4)))
    assert len(state) == 1


def test_token_by_token_generation_equals_the_full_pass():
    model = tiny(memory_length=8).eval()
    tokens = torch.randint(0, VOCAB, (2, 7))
    full, full_state = model(tokens)
    state, steps = None, []
    for t in range(tokens.shape[1]):
        logits, state = model(tokens[:, t : t + 1], state)
        steps.append(logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), full)
    torch.testing.assert_close(state[0], full_state[0])


def test_carried_memory_is_attended_to_and_reset():
    model = tiny().eval()
    tokens = torch.randint(0, VOCAB, (2, 5))
    fresh, state = model(tokens)
    only_c, _ = model(tokens, state[:1])
    with_memory, _ = model(tokens, state)
    assert not torch.allclose(only_c, with_memory)  # the memory changes the prediction
    model.train()
    batch = (tokens, tokens)
    model.training_step(batch, 0)
    carried = model.carried.get("train")
    assert len(carried) == 3 and carried[1].shape == (5, 2, 8)
    assert model.carried.initial("train", 2) is carried
    assert model.carried.initial("train", 3) is None
    model.on_train_epoch_start()
    assert model.carried.initial("train", 2) is None


def test_bad_arguments_name_the_config_key():
    with pytest.raises(ValueError, match=r"`sru_options.proj_size` .* required with rnn='srupp'"):
        language_model(vocab_size=VOCAB, rnn="srupp", sru_options={"num_heads": 2})
    with pytest.raises(ValueError, match=r"`memory_length` must be an integer >= 0, got -1"):
        tiny(memory_length=-1)


# --------------------------------------------------------------------------- learning


class PeriodicText(torch.utils.data.Dataset):
    """Streams of a random 3-token phrase repeated: after one period the next token is certain."""

    def __init__(self, count: int, length: int = 12, seed: int = 0):
        generator = torch.Generator().manual_seed(seed)
        phrases = torch.randint(0, VOCAB, (count, 3), generator=generator)
        self.tokens = phrases.repeat(1, (length + 1) // 3 + 1)[:, : length + 1]

    def __len__(self):
        return len(self.tokens)

    def __getitem__(self, index):
        return self.tokens[index, :-1], self.tokens[index, 1:]


class LossRecorder(pl.Callback):
    def __init__(self):
        self.losses = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.losses.append(float(outputs["loss"]))


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed", "bf16-true"])
def test_a_tiny_srupp_lm_learns(precision, tmp_path):
    torch.manual_seed(0)
    model = language_model(
        vocab_size=VOCAB,
        rnn="srupp",
        embedding_dim=16,
        hidden_size=32,
        num_layers=2,
        dropout=0.0,
        carry_hidden=False,
        sru_options={"proj_size": 16, "num_heads": 2},
        optimizer={"_target_": "torch.optim.Adam", "lr": 1e-2},
    )
    recorder, precision_callback = LossRecorder(), SRUPrecisionCallback(verbose=False)
    trainer = pl.Trainer(
        max_steps=120,
        precision=precision,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[recorder, precision_callback],
        default_root_dir=tmp_path,
        limit_val_batches=0,
    )
    loader = DataLoader(PeriodicText(32 * 120), batch_size=32)
    with trace_storage_dtypes() as calls:
        trainer.fit(model, train_dataloaders=loader)
    assert precision_callback.layers == ["net.rnn.rnn_lst.0", "net.rnn.rnn_lst.1"]
    storage = torch.float32 if precision == "32-true" else torch.bfloat16
    assert {call.storage_dtype for call in calls} == {storage}
    first, last = sum(recorder.losses[:5]) / 5, sum(recorder.losses[-5:]) / 5
    # chance is ln 11 = 2.4; 8 of the 12 targets per stream are determined by the first 3
    assert last < 0.5 * first and last < 1.2, recorder.losses


# --------------------------------------------------------------------------- advisor


def advice_for(cell):
    return {a.dimension: a for a in tensor_core_advice([("rnn.rnn_lst.0", cell)])}


def test_advisor_checks_proj_size_and_head_dim():
    assert advice_for(SRUpp(64, 64, 64, num_heads=4)[0]) == {}  # 16 per head
    advice = advice_for(SRUpp(64, 64, 20)[0])
    assert set(advice) == {"proj_size", "head_dim"}
    assert "proj_size=20 is not a multiple of 8; use proj_size=24" in str(advice["proj_size"])
    advice = advice_for(SRUpp(64, 64, 32, num_heads=8)[0])  # 4 per head
    assert set(advice) == {"head_dim"}
    text = str(advice["head_dim"])
    assert "proj_size / num_heads = 32 / 8 = 4" in text and "use proj_size=64 or num_heads=4" in text


def test_advisor_checks_input_size_and_u_width_of_srupp_layers():
    cell = SRUpp(30, 45, 16)[0]  # input 30; k = 4: U width 45 x 4 = 180
    assert isinstance(cell, SRUppCell)
    advice = advice_for(cell)
    assert set(advice) == {"input_size", "u_width"}
    assert "make the layer input 32 wide" in str(advice["input_size"])
    assert advice["u_width"].value == 180


# --------------------------------------------------------------------------- CLI


@pytest.mark.slow
def test_model_sweep_compares_sru_srupp_and_lstm(tmp_path, monkeypatch):
    import csv

    from helpers.tiny_run import TINY_RUN

    from sru_lightning.app import cli

    monkeypatch.chdir(tmp_path)
    sweep_dir = tmp_path / "sweep"
    status = cli.main(["fit", "-m", "model=sru,srupp,lstm", *TINY_RUN, f"hydra.sweep.dir={sweep_dir}"])
    assert status == 0
    with open(sweep_dir / "summary.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [row["overrides"].split()[0] for row in rows] == ["model=sru", "model=srupp", "model=lstm"]
    assert all(row["status"] == "completed" and float(row["val_bpc"]) > 0 for row in rows)


def test_carried_memory_survives_a_weights_only_checkpoint(tmp_path):
    from types import SimpleNamespace

    model = tiny()
    tokens = torch.randint(0, VOCAB, (2, 5))
    model.training_step((tokens, tokens), 0)
    model._trainer = SimpleNamespace(world_size=1)
    checkpoint = {}
    model.on_save_checkpoint(checkpoint)
    torch.save(checkpoint, tmp_path / "state.ckpt")
    restored = tiny()
    restored.on_load_checkpoint(torch.load(tmp_path / "state.ckpt", weights_only=True))
    carried = restored.carried.initial("train", 2)
    assert len(carried) == 3
    for a, b in zip(carried, model.carried.get("train")):
        torch.testing.assert_close(a, b)
