"""SRULanguageModel: shapes, weight tying, state carry, metrics and optimiser wiring."""

from __future__ import annotations

import math
from functools import partial
from types import SimpleNamespace

import lightning.pytorch as pl
import pytest
import torch
from helpers.language_models import language_model

from sru_lightning.data import PydocDataModule


def tiny(rnn="sru", **kwargs):
    options = dict(embedding_dim=8, hidden_size=12, num_layers=2, dropout=0.0)
    options.update(kwargs)
    return language_model(vocab_size=11, rnn=rnn, **options)


@pytest.mark.parametrize("rnn", ["sru", "lstm"])
def test_forward_shapes_and_state(rnn):
    model = tiny(rnn)
    logits, state = model(torch.randint(0, 11, (3, 5)))
    assert logits.shape == (3, 5, 11)
    first = state[0] if isinstance(state, tuple) else state
    assert first.shape[:2] == (2, 3)  # (layers, batch, ...)


def test_sru_stack_comes_from_sru_lightning_nn():
    from sru_lightning.nn import SRU

    assert isinstance(tiny().net.rnn, SRU)
    assert isinstance(tiny("lstm").net.rnn, torch.nn.LSTM)


def test_tied_weights_share_the_embedding_with_a_projection_when_sizes_differ():
    model = tiny(tie_weights=True)
    assert model.net.decoder.weight is model.net.embedding.weight
    assert model.net.projection is not None and model.net.projection.in_features == 12
    assert tiny(tie_weights=True, hidden_size=8).net.projection is None


def test_state_is_carried_detached_and_reset_on_shape_change_and_epoch_start():
    model = tiny()
    batch = (torch.randint(0, 11, (3, 5)), torch.randint(0, 11, (3, 5)))
    model.training_step(batch, 0)
    carried = model.carried.get("train")
    assert not carried.requires_grad
    assert model.carried.initial("train", 3) is carried
    assert model.carried.initial("train", 4) is None  # different batch size: new streams
    model.on_train_epoch_start()
    assert model.carried.initial("train", 3) is None
    stateless = tiny(carry_hidden=False)
    stateless.training_step(batch, 0)
    assert stateless.carried.initial("train", 3) is None


def test_carried_state_changes_the_next_prediction():
    model = tiny().eval()
    tokens = torch.randint(0, 11, (2, 6))
    fresh, state = model(tokens)
    continued, _ = model(tokens, state)
    assert not torch.allclose(fresh, continued)


def test_bad_arguments_name_the_config_key():
    with pytest.raises(ValueError, match=r"`rnn` must be one of \('sru', 'srupp', 'lstm'\), got 'gru'"):
        tiny("gru")
    with pytest.raises(ValueError, match="`hidden_size` must be a positive integer, got 0"):
        tiny(hidden_size=0)
    with pytest.raises(ValueError, match="vocab_size"):
        language_model(vocab_size=1)


def test_optimizer_and_schedule_from_config_fill_total_steps():
    model = tiny(
        optimizer={"_target_": "torch.optim.SGD", "lr": 0.5},
        lr_scheduler={
            "_target_": "torch.optim.lr_scheduler.OneCycleLR",
            "max_lr": 0.5,
            "total_steps": None,
            "interval": "step",
        },
    )
    model._trainer = SimpleNamespace(estimated_stepping_batches=7)
    config = model.configure_optimizers()
    assert isinstance(config["optimizer"], torch.optim.SGD)
    scheduler = config["lr_scheduler"]["scheduler"]
    assert scheduler.total_steps == 7 and config["lr_scheduler"]["interval"] == "step"
    config = tiny(optimizer=partial(torch.optim.Adam, lr=0.1)).configure_optimizers()
    assert isinstance(config["optimizer"], torch.optim.Adam) and "lr_scheduler" not in config


def test_validation_metrics_are_bits_and_perplexity_of_the_token_mean_loss(tmp_path):
    model = tiny()
    data = PydocDataModule(batch_size=2, seq_len=8)
    model = language_model(vocab_size=data.vocab_size, embedding_dim=8, hidden_size=12, num_layers=1)
    trainer = pl.Trainer(
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=3,
        default_root_dir=tmp_path,
    )
    (result,) = trainer.validate(model, datamodule=data, verbose=False)
    assert result["val_bpc"] == pytest.approx(result["val_loss"] / math.log(2), rel=1e-5)
    assert result["val_ppl"] == pytest.approx(math.exp(result["val_loss"]), rel=1e-5)
    # an untrained model is near uniform over the vocabulary
    assert result["val_bpc"] == pytest.approx(math.log2(data.vocab_size), abs=0.5)


def test_metric_states_stay_float32_when_the_model_is_cast_to_bf16(tmp_path):
    data = PydocDataModule(batch_size=2, seq_len=8)
    model = language_model(vocab_size=data.vocab_size, embedding_dim=8, hidden_size=12, num_layers=1)
    trainer = pl.Trainer(
        precision="bf16-true",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=3,
        default_root_dir=tmp_path,
    )
    (result,) = trainer.validate(model, datamodule=data, verbose=False)
    assert model.net.embedding.weight.dtype == torch.bfloat16
    assert model.mean_nats["val_nats"].mean_value.dtype == torch.float32
    # a float32 state keeps the derived perplexity off the coarse bf16 grid
    assert result["val_ppl"] == pytest.approx(2 ** result["val_bpc"], rel=1e-5)


@pytest.mark.slow
def test_a_short_fit_beats_the_unigram_baseline(tmp_path):
    data = PydocDataModule(batch_size=16, seq_len=32)
    model = language_model(
        vocab_size=data.vocab_size,
        embedding_dim=32,
        hidden_size=64,
        num_layers=2,
        dropout=0.0,
        optimizer={"_target_": "torch.optim.Adam", "lr": 1e-2},
    )
    trainer = pl.Trainer(
        max_steps=150,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=10,
        default_root_dir=tmp_path,
    )
    trainer.fit(model, datamodule=data)
    (result,) = trainer.validate(model, datamodule=data, verbose=False)
    assert result["val_bpc"] < data.unigram_bpc("val") - 0.5


@pytest.mark.parametrize(
    "rnn,options", [("sru", {}), ("lstm", {}), ("srupp", {"sru_options": {"proj_size": 4}, "memory_length": 8})]
)
def test_step_by_step_decoding_with_the_carried_state_matches_one_pass(rnn, options):
    model = tiny(rnn, **options).eval()
    tokens = torch.randint(0, 11, (2, 7))
    with torch.no_grad():
        full, _ = model(tokens)
        logits, state = model.net.step(tokens[:, :3])  # a prompt in one pass
        stepped = [logits]
        for t in range(3, 7):
            logits, state = model.net.step(tokens[:, t], state)
            stepped.append(logits)
    assert torch.allclose(torch.stack(stepped, dim=1), full[:, 2:], atol=1e-5)


def test_predict_step_gives_next_token_log_probabilities_through_trainer_predict(tmp_path):
    model = tiny()
    windows = [torch.randint(0, 11, (3, 6)) for _ in range(2)]
    loader = torch.utils.data.DataLoader(windows, batch_size=None)
    trainer = pl.Trainer(
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    predictions = trainer.predict(model, dataloaders=loader)
    assert len(predictions) == 2 and predictions[0].shape == (3, 6, 11) and predictions[0].dtype == torch.float32
    with torch.no_grad():
        expected = torch.log_softmax(model.eval()(windows[1])[0], dim=-1)
    assert torch.allclose(predictions[1], expected, atol=1e-6)
    assert torch.allclose(predictions[1].exp().sum(-1), torch.ones(3, 6), atol=1e-5)
    # an (inputs, targets) pair as the data modules' loaders yield reads the inputs
    assert torch.equal(model.predict_step((windows[1], windows[0]), 0), model.predict_step(windows[1], 0))
    with pytest.raises(ValueError, match=r"integer token ids of shape \(B, L\), got \(3, 6, 2\)"):
        model.predict_step(torch.zeros(3, 6, 2), 0)


def test_word_level_models_log_bits_per_word_and_word_perplexity(tmp_path):
    corpus = tmp_path / "story.txt"
    corpus.write_text("the cat sat on the mat and the dog sat on the log\n" * 100)
    from sru_lightning.data import TextDataModule

    data = TextDataModule(path=str(corpus), level="word", batch_size=2, seq_len=8)
    model = language_model(
        vocab_size=data.vocab_size, embedding_dim=8, hidden_size=12, num_layers=1, token_unit=data.token_unit
    )
    trainer = pl.Trainer(
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=3,
        default_root_dir=tmp_path,
    )
    (result,) = trainer.validate(model, datamodule=data, verbose=False)
    assert set(result) == {"val_loss", "val_bpw", "val_word_ppl", "val_bpb"}
    assert result["val_bpw"] == pytest.approx(result["val_loss"] / math.log(2), rel=1e-5)
    with pytest.raises(ValueError, match="`token_unit` must be one of"):
        tiny(token_unit="sentence")


def test_the_fit_summary_counts_the_flops_of_a_forward_of_one_batch(tmp_path):
    """The summary printed as a fit starts runs an example batch of the datamodule's size: its
    FLOPs are those of a forward of that batch, recurrence included (the summary printed
    `0` without one)."""
    from lightning.fabric.utilities.throughput import measure_flops
    from lightning.pytorch.callbacks import ModelSummary

    seen = {}

    class Summary(ModelSummary):
        def summarize(self, summary_data, total_parameters, trainable_parameters, model_size, *args, **kwargs):
            seen.update(kwargs, rows=dict(summary_data))

    data = PydocDataModule(batch_size=3, seq_len=10)
    model = language_model(vocab_size=data.vocab_size, embedding_dim=8, hidden_size=12, num_layers=2)
    trainer = pl.Trainer(
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        callbacks=[Summary(max_depth=2)],  # the network's layers (net.rnn) have rows
        max_steps=1,
        limit_val_batches=0,
        default_root_dir=tmp_path,
    )
    trainer.fit(model, datamodule=data)
    assert tuple(model.example_input_array.shape) == (3, 10)
    model.eval()
    with torch.no_grad():
        expected = measure_flops(model, lambda: model(model.example_input_array))
    decoder_only = 2 * 3 * 10 * 12 * data.vocab_size
    assert seen["total_flops"] == expected > decoder_only  # the SRU layers' FLOPs are counted too
    rnn_row = seen["rows"]["Name"].index("net.rnn")
    assert seen["rows"]["FLOPs"][rnn_row] not in ("0", 0)


class _RecordingLogger(pl.loggers.Logger):
    """Keeps every row the trainer writes: (step, {name: value})."""

    def __init__(self):
        super().__init__()
        self.rows = []

    name, version = "recording", "0"

    def log_hyperparams(self, params, *args, **kwargs):
        pass

    def log_metrics(self, metrics, step=None):
        self.rows.append((step, dict(metrics)))


@pytest.mark.parametrize("max_steps", [7, -1])
def test_the_training_bits_are_logged_only_where_loggers_or_the_final_metrics_read_them(tmp_path, max_steps):
    """train_loss, train_bpc and train_bpb reach the loggers at every step they write (and the
    fit's final metrics at its last step) with the step's own values, from fewer `self.log` calls."""
    data = PydocDataModule(batch_size=2, seq_len=8)
    model = language_model(vocab_size=data.vocab_size, embedding_dim=8, hidden_size=12, num_layers=1)
    logger = _RecordingLogger()
    logged_losses, logged_bits = [], []
    original_log = model.log

    def log(name, value, *args, **kwargs):
        if name == "train_loss":
            logged_losses.append(float(value))
        if name == "train_bpc":
            logged_bits.append(float(value))
        return original_log(name, value, *args, **kwargs)

    model.log = log
    trainer = pl.Trainer(
        logger=logger,
        max_steps=max_steps,
        max_epochs=1,
        limit_train_batches=9,
        limit_val_batches=0,
        log_every_n_steps=3,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(model, datamodule=data)
    steps = 7 if max_steps == 7 else 9
    rows = [(step, metrics) for step, metrics in logger.rows if "train_bpc" in metrics]
    assert [step for step, _ in rows] == [step for step in (2, 5, 8) if step < steps]  # every third step
    for _, metrics in rows:
        assert metrics["train_bpc"] == pytest.approx(metrics["train_loss"] / math.log(2), rel=1e-6)
        assert "train_bpb" in metrics
    # the logged rows, and the fit's last step for its final metrics
    assert len(logged_bits) == len(logged_losses) == len(rows) + (steps - 1 not in [step for step, _ in rows])
    final = trainer.callback_metrics
    assert float(final["train_bpc"]) == pytest.approx(logged_losses[-1] / math.log(2), rel=1e-6)
