"""`threads`: one rule for the CPU thread count of every process, whatever started it."""

from __future__ import annotations

import os

import pytest
import torch

from sru_lightning.app.runs.threads import set_thread_count, thread_setting_problem


@pytest.fixture(autouse=True)
def _restore_threads(monkeypatch):
    before = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    yield
    torch.set_num_threads(before)
    os.environ.pop("OMP_NUM_THREADS", None)


def test_an_explicit_count_wins_and_reaches_launched_processes(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert set_thread_count(1, processes_per_machine=4) == 1
    assert torch.get_num_threads() == 1 and os.environ["OMP_NUM_THREADS"] == "1"


def test_null_takes_omp_num_threads(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert set_thread_count(None, processes_per_machine=1) == 1


def test_null_shares_the_cores_among_the_processes_of_a_machine(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    assert set_thread_count(None, processes_per_machine=2) == 4
    assert os.environ["OMP_NUM_THREADS"] == "4"  # what Lightning's launcher passes to the other ranks
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert set_thread_count(None, processes_per_machine=16) == 1


def test_null_leaves_one_process_alone():
    before = torch.get_num_threads()
    assert set_thread_count(None, processes_per_machine=1) is None
    assert torch.get_num_threads() == before and "OMP_NUM_THREADS" not in os.environ


@pytest.mark.parametrize("bad", [0, -2, 1.5, "two", True])
def test_bad_values_are_named(bad):
    assert thread_setting_problem(bad) == f"`threads` must be a positive integer or null, got {bad!r}"
    with pytest.raises(ValueError, match="`threads` must be a positive integer or null"):
        set_thread_count(bad, processes_per_machine=1)
