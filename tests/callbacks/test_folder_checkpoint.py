"""FolderModelCheckpoint: the record of the best checkpoints follows a run folder that was moved
or copied, and starts anew for another run's checkpoint."""

from __future__ import annotations

import shutil

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

from sru_lightning.callbacks import FolderModelCheckpoint

SCORES = [1.0, 3.0, 2.0, 4.0]  # the monitored value of epochs 0..3: epoch 0 stays the best


class ScriptedScore(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).pow(2).mean()

    def validation_step(self, batch, batch_idx):
        self.log("score", SCORES[self.current_epoch])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.randn(4, 2)), batch_size=2)

    def val_dataloader(self):
        return DataLoader(TensorDataset(torch.randn(2, 2)), batch_size=2)


def fit(folder, epochs, checkpoint_class=FolderModelCheckpoint, ckpt_path=None):
    checkpoint = checkpoint_class(
        dirpath=folder / "checkpoints",
        filename="{epoch}",
        monitor="score",
        mode="min",
        save_top_k=1,
        save_last=True,
        enable_version_counter=False,
    )
    trainer = pl.Trainer(
        max_epochs=epochs,
        callbacks=[checkpoint],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=folder,
    )
    trainer.fit(ScriptedScore(), ckpt_path=ckpt_path)
    return checkpoint


def names(folder):
    return sorted(path.name for path in (folder / "checkpoints").iterdir())


@pytest.mark.parametrize("how", ["moved", "copied"])
def test_a_moved_or_copied_run_folder_keeps_its_best_checkpoint_when_resumed(tmp_path, how):
    first = fit(tmp_path / "run", epochs=1)
    assert first.best_model_score == 1.0
    (shutil.move if how == "moved" else shutil.copytree)(tmp_path / "run", tmp_path / "there")

    resumed = fit(tmp_path / "there", epochs=4, ckpt_path=tmp_path / "there" / "checkpoints" / "last.ckpt")
    there = tmp_path / "there" / "checkpoints"
    # epochs 1-3 scored worse than epoch 0, whose checkpoint stays the one best in the folder
    assert names(tmp_path / "there") == ["epoch=0.ckpt", "last.ckpt"]
    assert resumed.best_model_path == str(there / "epoch=0.ckpt")
    assert resumed.best_model_score == 1.0
    assert list(resumed.best_k_models) == [str(there / "epoch=0.ckpt")]
    assert resumed.last_model_path == str(there / "last.ckpt")
    if how == "copied":  # the original folder is left as it was
        assert names(tmp_path / "run") == ["epoch=0.ckpt", "last.ckpt"]


@pytest.mark.parametrize(
    "first, then", [(ModelCheckpoint, FolderModelCheckpoint), (FolderModelCheckpoint, ModelCheckpoint)]
)
def test_a_checkpoint_of_either_class_resumes_with_the_other_and_keeps_the_record(tmp_path, first, then, recwarn):
    fit(tmp_path / "run", epochs=1, checkpoint_class=first)
    resumed = fit(
        tmp_path / "run", epochs=3, checkpoint_class=then, ckpt_path=tmp_path / "run" / "checkpoints" / "last.ckpt"
    )
    assert resumed.best_model_score == 1.0 and names(tmp_path / "run") == ["epoch=0.ckpt", "last.ckpt"]
    assert not [str(w.message) for w in recwarn if "callbacks used to create the checkpoint" in str(w.message)]


def test_lightnings_own_checkpoint_loses_the_record_of_a_moved_folder(tmp_path):
    """What the class is for: Lightning's ModelCheckpoint, resumed in the moved folder, takes a
    worse epoch for the best and keeps two "best" files."""
    fit(tmp_path / "run", epochs=1, checkpoint_class=ModelCheckpoint)
    shutil.move(tmp_path / "run", tmp_path / "there")
    with pytest.warns(UserWarning, match="dirpath has changed"):
        resumed = fit(
            tmp_path / "there",
            epochs=4,
            checkpoint_class=ModelCheckpoint,
            ckpt_path=tmp_path / "there" / "checkpoints" / "last.ckpt",
        )
    assert resumed.best_model_score == 2.0
    assert names(tmp_path / "there") == ["epoch=0.ckpt", "epoch=2.ckpt", "last.ckpt"]


def test_another_runs_checkpoint_starts_a_new_record_and_leaves_that_run_alone(tmp_path):
    fit(tmp_path / "other", epochs=1)
    before = {path.name: path.stat().st_mtime_ns for path in (tmp_path / "other" / "checkpoints").iterdir()}

    with pytest.warns(UserWarning, match="dirpath has changed"):
        resumed = fit(tmp_path / "new", epochs=3, ckpt_path=tmp_path / "other" / "checkpoints" / "last.ckpt")
    new = tmp_path / "new" / "checkpoints"
    # a new record: epoch 2 (2.0) is the best of this folder's epochs 1 and 2
    assert names(tmp_path / "new") == ["epoch=2.ckpt", "last.ckpt"]
    assert resumed.best_model_path == str(new / "epoch=2.ckpt")
    after = {path.name: path.stat().st_mtime_ns for path in (tmp_path / "other" / "checkpoints").iterdir()}
    assert after == before


def test_a_record_naming_a_file_the_folder_lacks_is_not_carried_over(tmp_path):
    fit(tmp_path / "run", epochs=1)
    shutil.move(tmp_path / "run", tmp_path / "there")
    (tmp_path / "there" / "checkpoints" / "epoch=0.ckpt").unlink()  # the best, removed by hand

    with pytest.warns(UserWarning, match="dirpath has changed"):
        resumed = fit(tmp_path / "there", epochs=3, ckpt_path=tmp_path / "there" / "checkpoints" / "last.ckpt")
    assert resumed.best_model_path == str(tmp_path / "there" / "checkpoints" / "epoch=2.ckpt")
    assert names(tmp_path / "there") == ["epoch=2.ckpt", "last.ckpt"]


@pytest.mark.parametrize(
    "settings",
    [{}, {"monitor": "score", "mode": "min"}, {"every_n_train_steps": 5, "save_on_train_epoch_end": True}],
)
def test_the_record_is_saved_under_lightnings_key(tmp_path, settings):
    """The same key as ModelCheckpoint with the same settings, so either class finds the other's record."""
    ours = FolderModelCheckpoint(dirpath=tmp_path, **settings)
    assert ours.state_key == ModelCheckpoint(dirpath=tmp_path, **settings).state_key
    assert ours.state_key.startswith("ModelCheckpoint{")
