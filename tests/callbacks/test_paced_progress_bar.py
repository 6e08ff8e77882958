"""PacedRichProgressBar updates the training bar at most `refresh_rate` times a second, and shows
the same final count as Lightning's bar: at an epoch's end, at a `max_steps` stop mid-epoch."""

from __future__ import annotations

import pytest
from helpers.tiny_regression import Regression
from helpers.tiny_trainer import tiny_trainer
from lightning.pytorch.callbacks import Callback, RichProgressBar

from sru_lightning.callbacks import PacedRichProgressBar

pytest.importorskip("rich", reason="the Rich progress bar needs the rich package (a Lightning extra)")


class LoggedRegression(Regression):
    """64 samples in batches of 2, the loss on the progress bar."""

    def __init__(self) -> None:
        super().__init__(samples=64, batch_size=2)

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.log("loss", loss, prog_bar=True)
        return loss


class ShownCount(Callback):
    """The training bar's count when each epoch and the fit end (after the bar's own hooks)."""

    def __init__(self, bar: RichProgressBar) -> None:
        self.bar, self.counts = bar, []

    def _count(self) -> int:
        return int(self.bar.progress.tasks[self.bar.train_progress_bar_id].completed)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.counts.append(self._count())

    def on_train_end(self, trainer, pl_module) -> None:
        self.counts.append(self._count())


def _fit(bar: RichProgressBar, tmp_path, monkeypatch, **settings) -> tuple[list[int], int]:
    updates = []
    original = RichProgressBar.on_train_batch_end

    def counted(self, *args, **kwargs):
        updates.append(args[-1])
        return original(self, *args, **kwargs)

    monkeypatch.setattr(RichProgressBar, "on_train_batch_end", counted)
    shown = ShownCount(bar)
    trainer = tiny_trainer(default_root_dir=tmp_path, enable_progress_bar=True, callbacks=[bar, shown], **settings)
    trainer.fit(LoggedRegression())
    return shown.counts, len(updates)


def test_the_bar_updates_at_most_refresh_rate_times_a_second_and_ends_on_the_full_count(tmp_path, monkeypatch):
    counts, updates = _fit(PacedRichProgressBar(refresh_rate=1), tmp_path, monkeypatch, max_epochs=2)
    assert counts == [32, 32, 32]  # both epochs end full, and so does the fit
    # 64 batches of a few milliseconds: about the first and the last of each epoch
    assert updates <= 8, updates


def test_a_max_steps_stop_mid_epoch_shows_its_last_step(tmp_path, monkeypatch):
    counts, updates = _fit(PacedRichProgressBar(refresh_rate=1), tmp_path, monkeypatch, max_steps=21)
    assert counts == [21, 21]  # the epoch and the fit end at step 21 of 32, as shown
    assert updates <= 4, updates


def test_lightnings_bar_updates_after_every_batch(tmp_path, monkeypatch):
    # what the paced bar saves: Lightning's own updates the bar at each of the 64 batches
    counts, updates = _fit(RichProgressBar(refresh_rate=1), tmp_path, monkeypatch, max_epochs=2)
    assert counts[:2] == [32, 32] and updates == 64
