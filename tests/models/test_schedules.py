"""WarmupCosineLR: the step schedule, and the schedule that follows a reported progress (a time budget)."""

from __future__ import annotations

import math

import pytest
import torch

from sru_lightning.models.schedules import WarmupCosineLR


def optimizer(lr: float = 2.0) -> torch.optim.Optimizer:
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)


def step_factor_reference(step: int, total: int, warmup_fraction: float, floor: float) -> float:
    """The step schedule as the class documents it (linear warm-up, cosine to the floor)."""
    if total < 2:
        warmup = 0
    else:
        warmup = min(max(1, round(warmup_fraction * total)), total - 1) if warmup_fraction > 0 else 0
    if step < warmup:
        return (step + 1) / (warmup + 1)
    progress = min(1.0, (step - warmup) / max(1, total - 1 - warmup))
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def rates_over_steps(schedule: WarmupCosineLR, steps: int) -> list[float]:
    rates = []
    for _ in range(steps):
        rates.append(schedule.optimizer.param_groups[0]["lr"])
        schedule.optimizer.step()
        schedule.step()
    return rates


@pytest.mark.parametrize("total", [1, 2, 3, 10, 11, 257])
@pytest.mark.parametrize("warmup_fraction,floor", [(0.1, 0.04), (0.0, 0.0), (0.5, 0.2)])
def test_a_step_count_gives_the_same_rate_at_every_step_as_before(total, warmup_fraction, floor):
    schedule = WarmupCosineLR(optimizer(), total_steps=total, warmup_fraction=warmup_fraction, final_lr_fraction=floor)
    expected = [2.0 * step_factor_reference(step, total, warmup_fraction, floor) for step in range(total)]
    assert rates_over_steps(schedule, total) == expected


def test_a_step_count_wins_over_a_reported_progress():
    schedule = WarmupCosineLR(optimizer(), total_steps=20)
    schedule.set_progress(0.9)
    assert rates_over_steps(schedule, 20) == [2.0 * step_factor_reference(step, 20, 0.1, 0.04) for step in range(20)]


def test_with_progress_the_rate_warms_up_then_decays_over_the_fraction_of_the_run():
    schedule = WarmupCosineLR(optimizer(), total_steps=None, warmup_fraction=0.2, final_lr_fraction=0.1)
    rates = []
    for fraction in [0.0, 0.1, 0.2, 0.6, 1.0]:
        schedule.set_progress(fraction)
        # set_progress applies the rate at once; the step after the optimizer step keeps it
        rates.append(schedule.optimizer.param_groups[0]["lr"])
        schedule.optimizer.step()
        schedule.step()
        assert schedule.optimizer.param_groups[0]["lr"] == rates[-1]
    assert rates == pytest.approx([0.0, 1.0, 2.0, 2.0 * (0.1 + 0.9 * 0.5), 0.2])
    assert schedule.get_last_lr() == pytest.approx([0.2])


def test_with_progress_the_rate_never_rises_after_the_warm_up():
    schedule = WarmupCosineLR(optimizer(), total_steps=None)
    factors = [schedule.factor_at_progress(fraction / 1000) for fraction in range(100, 1001)]
    assert all(later <= earlier for earlier, later in zip(factors, factors[1:]))
    assert factors[0] == 1.0 and factors[-1] == pytest.approx(0.04)


def test_wsd_holds_the_peak_then_decays_linearly_over_the_last_decay_fraction():
    schedule = WarmupCosineLR(
        optimizer(), total_steps=None, warmup_fraction=0.1, final_lr_fraction=0.0, shape="wsd", decay_fraction=0.3
    )
    factor = schedule.factor_at_progress
    assert [factor(p) for p in (0.05, 0.1, 0.5, 0.7)] == pytest.approx([0.5, 1.0, 1.0, 1.0])
    assert [factor(p) for p in (0.8, 0.85, 1.0)] == pytest.approx([2 / 3, 0.5, 0.0])


def test_wsd_over_a_step_count_decays_over_its_last_steps():
    total = 21
    schedule = WarmupCosineLR(
        optimizer(1.0), total_steps=total, warmup_fraction=0.0, final_lr_fraction=0.0, shape="wsd", decay_fraction=0.5
    )
    rates = rates_over_steps(schedule, total)
    assert rates[:11] == [1.0] * 11
    assert rates[10:] == pytest.approx([1.0 - k / 10 for k in range(11)])


def test_without_step_count_or_progress_it_warms_up_then_holds_the_peak():
    schedule = WarmupCosineLR(optimizer(), total_steps=None, fallback_warmup_steps=4)
    assert rates_over_steps(schedule, 8) == pytest.approx([0.4, 0.8, 1.2, 1.6] + [2.0] * 4)


def test_the_progress_travels_in_the_state_dict():
    schedule = WarmupCosineLR(optimizer(), total_steps=None, shape="wsd")
    schedule.set_progress(0.95)
    resumed = WarmupCosineLR(optimizer(), total_steps=None)
    resumed.load_state_dict(schedule.state_dict())
    assert resumed.progress == 0.95 and resumed.shape == "wsd"
    assert resumed.get_lr() == schedule.get_lr() != [2.0]


@pytest.mark.parametrize(
    "settings,message",
    [
        ({"shape": "linear"}, "`shape` must be one of ('cosine', 'wsd'), got 'linear'"),
        ({"shape": "wsd", "decay_fraction": 0.95}, "`decay_fraction` must be in (0, 0.9], got 0.95"),
        ({"decay_fraction": 0.0}, "`decay_fraction` must be in (0, 1], got 0.0"),
    ],
)
def test_bad_settings_are_named(settings, message):
    with pytest.raises(ValueError) as error:
        WarmupCosineLR(optimizer(), **settings)
    assert message in str(error.value)


def test_a_progress_outside_zero_to_one_is_refused():
    with pytest.raises(ValueError, match=r"`fraction` must be in \[0, 1\], got 1.5"):
        WarmupCosineLR(optimizer()).set_progress(1.5)


def test_an_unknown_step_count_says_the_schedule_follows_a_time_budget(caplog):
    from sru_lightning.models.optimization import total_optimizer_steps

    settings = {"_target_": "sru_lightning.models.schedules.WarmupCosineLR", "fallback_warmup_steps": 7}
    with caplog.at_level("INFO"):
        assert total_optimizer_steps(math.inf, settings, "total_steps") is None
    assert "with trainer.max_time and the TimeBudget callback" in caplog.text
    assert "warms up and decays over the time budget; without them it warms up over 7 steps" in caplog.text
