"""ExponentialWeightAverage: the average is the exponential moving average of the trained
weights, replayed here step by step; validations and the end of the fit use it; a checkpoint
holds it as the model and the trained weights beside it; a resume goes on exactly."""

from __future__ import annotations

import pytest
import torch
from helpers.language_models import language_model
from helpers.tiny_trainer import tiny_trainer
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from lightning.pytorch import Callback, seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint

from sru_lightning._resources import conf_dir
from sru_lightning.callbacks import ExponentialWeightAverage, RestoreDataPosition, SeedEveryBatch
from sru_lightning.data import TextDataModule

TEXT = "".join(f"line {i}: the quick brown fox jumps over the lazy dog {i * 7 % 13}.\n" for i in range(200))
DECAY = 0.7  # a short horizon, so that six steps give an average far from both ends
STEPS = 6


class RecordWeights(Callback):
    """The trained parameters after every optimizer step."""

    def __init__(self) -> None:
        self.steps: list[dict[str, torch.Tensor]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.steps.append({name: p.detach().clone() for name, p in pl_module.named_parameters()})


def _data(tmp_path) -> TextDataModule:
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "text.txt"
    path.write_text(TEXT, encoding="utf-8")
    return TextDataModule(path=str(path), batch_size=2, seq_len=16, val_fraction=0.1, test_fraction=0.1)


def _model(data):
    seed_everything(0, verbose=False)
    # an SRU language model: its setup adds the token byte lengths buffer the copy must hold
    return language_model(
        vocab_size=data.vocab_size, rnn="sru", embedding_dim=8, hidden_size=16, num_layers=2, token_unit=data.token_unit
    )


def _fit(tmp_path, name, max_steps, extra_callbacks=(), ckpt_path=None):
    data = _data(tmp_path)
    model = _model(data)
    average = ExponentialWeightAverage(decay=DECAY)
    recorder = RecordWeights()
    saver = ModelCheckpoint(dirpath=tmp_path / "checkpoints", every_n_train_steps=3, save_top_k=-1, filename="{step}")
    trainer = tiny_trainer(
        max_steps=max_steps,
        callbacks=[average, recorder, saver, SeedEveryBatch(), RestoreDataPosition(), *extra_callbacks],
        enable_checkpointing=True,
        val_check_interval=3,
        limit_val_batches=2,
        num_sanity_val_steps=0,
        default_root_dir=tmp_path / name,
    )
    trainer.fit(model, datamodule=data, ckpt_path=ckpt_path)
    return trainer, model, recorder


def _replayed(steps: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    average = {name: value.clone() for name, value in steps[0].items()}
    for weights in steps[1:]:
        average = {name: DECAY * average[name] + (1 - DECAY) * weights[name] for name in average}
    return average


def _assert_same(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert sorted(got) == sorted(expected)
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-6, atol=1e-7, msg=name)


def test_the_fit_ends_with_the_average_and_validates_on_it(tmp_path):
    trainer, model, recorder = _fit(tmp_path, "run", STEPS)
    assert len(recorder.steps) == STEPS
    expected = _replayed(recorder.steps)
    _assert_same(dict(model.named_parameters()), expected)
    # not a copy of either end: the average lies between the first and the last weights
    last = recorder.steps[-1]
    assert any(not torch.equal(expected[name], last[name]) for name in last)
    # the copy holds the module alone, not the trainer (and its data) it was attached to
    average = next(c for c in trainer.callbacks if isinstance(c, ExponentialWeightAverage))
    with pytest.raises(RuntimeError, match="not attached"):
        average._average_model.module.trainer  # noqa: B018
    assert model.trainer is trainer
    logged = trainer.callback_metrics["val_loss"].item()
    again = tiny_trainer(limit_val_batches=2).validate(model, datamodule=_data(tmp_path), verbose=False)[0]
    assert again["val_loss"] == pytest.approx(logged, rel=1e-6)


def test_a_checkpoint_holds_the_average_as_the_model_and_the_trained_weights_beside_it(tmp_path):
    _, _, recorder = _fit(tmp_path, "run", STEPS)
    checkpoint = torch.load(tmp_path / "checkpoints" / f"step={STEPS}.ckpt", weights_only=True)
    parameters = set(recorder.steps[-1])
    _assert_same({k: v for k, v in checkpoint["state_dict"].items() if k in parameters}, _replayed(recorder.steps))
    _assert_same({k: v for k, v in checkpoint["current_model_state"].items() if k in parameters}, recorder.steps[-1])


def test_a_resume_trains_the_weights_it_stopped_with_and_keeps_their_average(tmp_path):
    _, whole, _ = _fit(tmp_path / "whole", "run", STEPS)
    _fit(tmp_path / "parts", "first", 3)
    checkpoint = tmp_path / "parts" / "checkpoints" / "step=3.ckpt"
    _, resumed, recorder = _fit(tmp_path / "parts", "second", STEPS, ckpt_path=str(checkpoint))
    assert len(recorder.steps) == STEPS - 3
    _assert_same(dict(resumed.named_parameters()), {k: v.detach() for k, v in whole.named_parameters()})
    ends = [
        torch.load(root / "checkpoints" / f"step={STEPS}.ckpt", weights_only=True)["current_model_state"]
        for root in (tmp_path / "whole", tmp_path / "parts")
    ]
    _assert_same(ends[1], ends[0])


@pytest.mark.parametrize(
    "settings, named, error",
    [
        (dict(decay=1.0), "decay", ValueError),
        (dict(decay=-0.1), "decay", ValueError),
        (dict(decay="0.9"), "decay", TypeError),
        (dict(update_every_n_steps=0), "update_every_n_steps", ValueError),
        (dict(update_starting_at_step=-1), "update_starting_at_step", ValueError),
    ],
)
def test_bad_settings_name_the_argument(settings, named, error):
    with pytest.raises(error, match=named) as raised:
        ExponentialWeightAverage(**settings)
    assert str(next(iter(settings.values()))) in str(raised.value)


def test_the_config_adds_it_beside_the_default_callbacks():
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = compose("config", overrides=["callbacks=[default,weight_average]"])
    assert "time_budget" in cfg.callbacks and "model_checkpoint" in cfg.callbacks
    callback = instantiate(cfg.callbacks.weight_average)
    assert isinstance(callback, ExponentialWeightAverage) and callback.decay == 0.99
