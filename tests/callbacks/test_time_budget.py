"""TimeBudget: a `max_time` fit whose learning rate decays over the budget and whose last
validation, after its last training step, lands inside the budget."""

from __future__ import annotations

import json
import math
import sys
import time

import lightning.pytorch as pl
import pytest
import torch
from helpers.budget_trace import BudgetTrace
from torch.utils.data import DataLoader, TensorDataset

from sru_lightning.callbacks import TimeBudget
from sru_lightning.models.schedules import WarmupCosineLR

PEAK = 0.1
FLOOR = 0.04


class SleepyRegression(pl.LightningModule):
    """Steps and validations of known length (sleeps), so a budget of seconds holds many steps."""

    def __init__(self, step_seconds: float = 0.01, validation_batch_seconds: float = 0.005, **schedule) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.step_seconds = step_seconds
        self.validation_batch_seconds = validation_batch_seconds
        self.schedule = schedule

    def training_step(self, batch, batch_idx):
        time.sleep(self.step_seconds)
        inputs, targets = batch
        return torch.nn.functional.mse_loss(self.layer(inputs), targets)

    def validation_step(self, batch, batch_idx):
        time.sleep(self.validation_batch_seconds)
        inputs, targets = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.layer(inputs), targets))

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=PEAK)
        # as the language model fills it in: the step count where the trainer knows it
        estimate = self.trainer.estimated_stepping_batches
        total_steps = int(estimate) if math.isfinite(estimate) else None
        scheduler = WarmupCosineLR(optimizer, total_steps, final_lr_fraction=FLOOR, **self.schedule)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    @staticmethod
    def _loader(count: int) -> DataLoader:
        generator = torch.Generator().manual_seed(count)
        return DataLoader(
            TensorDataset(torch.randn(count, 4, generator=generator), torch.randn(count, 1)), batch_size=4
        )

    def train_dataloader(self):
        return self._loader(64)  # 16 steps an epoch: the stop lands inside an epoch or at its end

    def val_dataloader(self):
        return self._loader(80)


def fit(tmp_path, callbacks, ckpt_path=None, model=None, **trainer_settings):
    trainer = pl.Trainer(
        max_epochs=-1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=tmp_path,
        callbacks=callbacks,
        **trainer_settings,
    )
    trainer.fit(model or SleepyRegression(), ckpt_path=ckpt_path)
    return trainer


def assert_decays_to_the_floor_and_validates_last_in_budget(trace: BudgetTrace, budget: float, warms_up=True) -> None:
    rates = [rate for _, rate in trace.lrs]
    peak_at = rates.index(max(rates))
    if warms_up:
        # (a validation due after a step moves the progress on by its time: here up to 7% of
        # the budget, so the step nearest the peak may be past it)
        assert max(rates) == pytest.approx(PEAK, rel=0.15), "the peak is reached"
        assert 0 < peak_at < len(rates) - 1
    after_peak = rates[peak_at:]
    assert all(later <= earlier for earlier, later in zip(after_peak, after_peak[1:])), "no rise after the warm-up"
    # The last step runs near the floor: in the last quarter of the decay (on a busy machine a
    # step that takes longer than the ones before it rightly ends the fit some steps before the
    # schedule's end, to leave time for the last validation; without TimeBudget it stays at PEAK).
    assert FLOOR * PEAK * (1 - 1e-9) <= rates[-1] <= FLOOR * PEAK + 0.25 * (PEAK - FLOOR * PEAK), rates[-5:]
    last_step, last_step_end = trace.step_ends[-1]
    last_validation_step, last_validation_end = trace.validation_ends[-1]
    assert last_validation_step == last_step, "the last validation saw the final weights"
    assert last_step_end <= last_validation_end <= budget, "and ended within the budget"


@pytest.mark.slow  # trains against the wall clock for its whole budget
def test_a_time_budgeted_fit_decays_its_rate_and_validates_last_within_the_budget(tmp_path, caplog):
    trace = BudgetTrace()
    with caplog.at_level("INFO"):
        trainer = fit(tmp_path, [TimeBudget(), trace], max_time={"seconds": 3})
    assert "TimeBudget: the learning rate of WarmupCosineLR follows the 3 s time budget (0% used so far)" in caplog.text
    assert f"TimeBudget: stopping at step {trainer.global_step} to validate once more" in caplog.text
    assert trace.budget == 3.0 and len(trace.lrs) > 50
    assert trace.lrs[0][1] == 0.0, "the warm-up starts at 0% of the budget"
    assert_decays_to_the_floor_and_validates_last_in_budget(trace, budget=3.0)
    assert trainer.global_step == trace.step_ends[-1][0]


def test_a_step_budget_keeps_the_step_schedule(tmp_path):
    """max_steps, with or without a max_time: the step schedule's rate at every step."""
    total = 40
    unit = WarmupCosineLR(
        torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0), total_steps=total, final_lr_fraction=FLOOR
    )
    expected = [PEAK * unit.factor(step) for step in range(total)]
    for max_time in (None, {"hours": 1}):
        rates = _LearningRates()
        trainer = fit(tmp_path, [TimeBudget(), rates], max_steps=total, max_time=max_time)
        assert trainer.global_step == total
        assert [rate for _, rate in rates.lrs] == pytest.approx(expected, rel=1e-12)


class _LearningRates(pl.Callback):
    def __init__(self) -> None:
        self.lrs = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.lrs.append((trainer.global_step, trainer.optimizers[0].param_groups[0]["lr"]))


@pytest.mark.slow  # trains against the wall clock for its whole budget
def test_wsd_holds_the_peak_and_decays_at_the_end_of_the_budget(tmp_path):
    trace = BudgetTrace()
    fit(
        tmp_path,
        [TimeBudget(), trace],
        model=SleepyRegression(shape="wsd", decay_fraction=0.3),
        max_time={"seconds": 3},
    )
    rates = [rate for _, rate in trace.lrs]
    middle = rates[len(rates) // 3 : len(rates) // 2]
    assert middle == [pytest.approx(PEAK)] * len(middle), "stable at the peak in the middle of the budget"
    assert_decays_to_the_floor_and_validates_last_in_budget(trace, budget=3.0)


@pytest.mark.slow
def test_a_resumed_time_budgeted_fit_continues_its_schedule(tmp_path):
    first = BudgetTrace()
    trainer = fit(tmp_path, [TimeBudget(), first], max_time={"seconds": 2})
    checkpoint = tmp_path / "stopped.ckpt"
    trainer.save_checkpoint(checkpoint)
    stopped_at = trainer.global_step
    elapsed = first.step_ends[-1][1]

    budget = TimeBudget()
    resumed = BudgetTrace()
    fit(tmp_path, [budget, resumed], ckpt_path=str(checkpoint), max_time={"seconds": 4})
    assert resumed.lrs[0][0] == stopped_at
    # The Timer restored the 2 s used: the schedule goes on from half the 4 s budget, past the
    # warm-up and short of the floor, and decays to the floor by the new end.
    restart_rate = resumed.lrs[0][1]
    unit = WarmupCosineLR(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0), final_lr_fraction=FLOOR)
    expected = PEAK * unit.factor_at_progress(elapsed / 4.0)
    assert 0.2 * PEAK < restart_rate < 0.9 * PEAK
    assert restart_rate <= expected * 1.05, "at least as far along as the time used says"
    assert resumed.step_ends[0][1] > elapsed, "the Timer's clock went on"
    assert_decays_to_the_floor_and_validates_last_in_budget(resumed, budget=4.0, warms_up=False)


def test_a_stop_inside_an_epoch_leaves_the_epoch_running_in_the_checkpoint(tmp_path):
    from lightning.pytorch.callbacks import ModelCheckpoint

    # Validating once an epoch, ModelCheckpoint saves at the epoch's end, which Lightning counts
    # as processed even when the stop cut the epoch short.
    checkpoints = ModelCheckpoint(dirpath=tmp_path / "checkpoints", save_last=True)
    trainer = pl.Trainer(
        max_epochs=-1,
        max_time={"seconds": 2},
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        callbacks=[TimeBudget(), checkpoints],
    )
    trainer.fit(SleepyRegression())
    saved = torch.load(checkpoints.last_model_path, weights_only=True)
    assert saved["global_step"] == trainer.global_step
    cut_inside = trainer.global_step % 16 != 0  # 16 batches an epoch
    progress = saved["loops"]["fit_loop"]["epoch_progress"]["total"]
    assert progress["processed"] == progress["started"] - (1 if cut_inside else 0)


@pytest.mark.parametrize(
    "settings,message",
    [
        ({"validation_margin": 0.5}, "`validation_margin` must be a number >= 1, got 0.5"),
        ({"step_window": 0}, "`step_window` must be a positive integer, got 0"),
    ],
)
def test_bad_settings_are_named(settings, message):
    with pytest.raises(ValueError) as error:
        TimeBudget(**settings)
    assert message in str(error.value)


# --------------------------------------------------------------------------------------------
# through the command line


def budget_traces(run_dir) -> list[BudgetTrace]:
    traces = []
    for path in sorted(run_dir.glob("budget_trace_rank*.json")):
        record = json.loads(path.read_text())
        trace = BudgetTrace()
        trace.lrs, trace.step_ends, trace.validation_ends = (
            [tuple(item) for item in record[key]] for key in ("lrs", "step_ends", "validation_ends")
        )
        trace.budget = record["budget"]
        traces.append(trace)
    return traces


def trace_overrides(run_dir) -> list[str]:
    return [
        "+callbacks.budget_trace._target_=budget_trace.BudgetTrace",
        f"+callbacks.budget_trace.dirpath={run_dir}",
        # the model's schedule, peak and floor as this file expects them
        "model.optimizer.lr=0.1",
        f"model.lr_scheduler.final_lr_fraction={FLOOR}",
    ]


@pytest.mark.slow
def test_a_time_budgeted_cli_fit_decays_and_validates_last_within_the_budget(tmp_path):
    from helpers import distributed_fits

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    command = [sys.executable, "-m", "sru_lightning", "fit", f"hydra.run.dir={run_dir}", "debug=tiny"]
    overrides = ["trainer.max_time=00:00:00:08", "trainer.max_epochs=-1", *trace_overrides(run_dir)]
    ended = distributed_fits.finish(distributed_fits.start(run_dir, command=command + overrides), timeout=240)
    assert ended.returncode == 0, ended.stdout[-3000:]
    (trace,) = budget_traces(run_dir)
    assert trace.budget == 8.0
    assert_decays_to_the_floor_and_validates_last_in_budget(trace, budget=8.0)
    record = distributed_fits.result(run_dir)
    assert record["status"] == "completed" and record["optimizer_steps"] == trace.step_ends[-1][0]
    assert math.isfinite(record["metrics"]["val_bpc"])


@pytest.mark.slow
def test_every_process_of_a_ddp_fit_uses_rank_zeros_progress(tmp_path):
    from helpers import distributed_fits

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    ended = distributed_fits.run_fit(
        run_dir, "trainer.max_time=00:00:00:12", "trainer.max_epochs=-1", *trace_overrides(run_dir), timeout=300
    )
    assert ended.returncode == 0, ended.stdout[-3000:]
    rank0, rank1 = budget_traces(run_dir)
    # Each process reads its own clock; the rates agree to the last bit only because rank 0's
    # fraction reached both.
    assert rank0.lrs == rank1.lrs
    assert rank0.step_ends != rank1.step_ends
    assert [step for step, _ in rank0.validation_ends] == [step for step, _ in rank1.validation_ends]
    assert_decays_to_the_floor_and_validates_last_in_budget(rank0, budget=12.0)
