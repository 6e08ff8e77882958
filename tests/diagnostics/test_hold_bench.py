"""`bench hold` (sru_lightning/diagnostics/hold_bench.py): the cost of holding a run folder, and
double starts of two fits into one folder."""

from __future__ import annotations

import pytest

from sru_lightning.diagnostics import bench, hold_bench


@pytest.mark.slow  # starts a process that holds a folder
def test_bench_hold_times_taking_refusing_and_giving_back(capsys):
    assert bench.main(["hold", "pairs=0", "repeats=5"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "holding a run folder (median of 5):"
    costs = {line.split("  ")[1].strip(): float(line.split()[-2]) for line in lines[1:4]}
    assert set(costs) == {"take a free folder", "refused by a held folder", "give it back"}
    assert all(0 < cost < 1000 for cost in costs.values()), costs
    assert not any("pairs" in line for line in lines)  # none asked for


def test_bench_hold_refuses_a_negative_count_of_pairs(capsys):
    assert bench.main(["hold", "pairs=-1"]) == 2
    assert "bench hold: error: `pairs` must be an integer >= 0, got -1" in capsys.readouterr().err


def _no_hold_timing(monkeypatch):
    # the pairs' report is what these tests read: the timing's holder process is left out
    monkeypatch.setattr(hold_bench, "time_hold", lambda repeats: hold_bench.HoldTimes(1.0, 2.0, 3.0))


def test_a_pair_that_left_two_runs_fails_the_benchmark(capsys, monkeypatch):
    _no_hold_timing(monkeypatch)
    monkeypatch.setattr(hold_bench, "double_start", lambda folder, threads: "exit statuses [0, 0]")
    assert bench.main(["hold", "pairs=2", "repeats=2"]) == 1
    out = capsys.readouterr().out
    assert "0 of 2 pairs left one run" in out and "pair 1: exit statuses [0, 0]" in out


def test_pairs_refused_by_the_hold_or_after_the_first_ended_both_left_one_run(capsys, monkeypatch):
    _no_hold_timing(monkeypatch)
    outcomes = iter(["held", "after", "held"])
    monkeypatch.setattr(hold_bench, "double_start", lambda folder, threads: next(outcomes))
    assert bench.main(["hold", "pairs=3", "repeats=2"]) == 0
    out = capsys.readouterr().out
    assert "3 of 3 pairs left one run, the other refused in one line (2 by the first's hold, 1 after" in out


@pytest.mark.slow
def test_a_double_start_leaves_one_run(tmp_path):
    assert hold_bench.double_start(tmp_path / "run", threads=1) in hold_bench.REFUSALS
