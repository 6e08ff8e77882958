"""The helpers `prepare` spreads its work with: worker processes in order (`ordered_map`) and a
thread one step ahead (`read_ahead`)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading

import pytest

from sru_lightning.data import piece_encoding
from sru_lightning.data.piece_encoding import ordered_map, read_ahead

_STATE = {}


def _remember(offset: int) -> None:
    _STATE["offset"] = offset


def _shifted(item: int) -> tuple[int, str | None]:
    return item + _STATE["offset"], os.environ.get("PREPARE_TEST_VARIABLE")


@pytest.mark.parametrize("workers", [1, 2])
def test_ordered_map_runs_the_initializer_in_each_worker_and_keeps_the_order(workers, monkeypatch):
    monkeypatch.delenv("PREPARE_TEST_VARIABLE", raising=False)
    results = list(
        ordered_map(
            _shifted,
            iter(range(50)),
            workers,
            initializer=_remember,
            initargs=(1000,),
            child_environment={"PREPARE_TEST_VARIABLE": "set"},
        )
    )
    assert [value for value, _ in results] == list(range(1000, 1050))
    if workers > 1:  # the workers started with the variable; this process has it back as it was
        assert {seen for _, seen in results} == {"set"}
    assert "PREPARE_TEST_VARIABLE" not in os.environ


def _interrupt_handler(_: int) -> object:
    return signal.getsignal(signal.SIGINT)


def test_workers_leave_ctrl_c_to_the_preparing_process():
    assert list(ordered_map(_interrupt_handler, range(4), 2)) == [signal.SIG_IGN] * 4


def _slow_identity(item: int) -> int:
    return item


def test_workers_end_on_sigterm_whatever_handler_the_parent_has(monkeypatch):
    # A parent whose SIGTERM handler only takes note (as a fit's does): its pool's terminate, on
    # an iterator dropped half way, must still end the workers instead of waiting for them.
    noted = []
    previous = signal.signal(signal.SIGTERM, lambda number, frame: noted.append(number))
    try:
        results = ordered_map(_slow_identity, iter(range(100)), 2)
        assert [next(results) for _ in range(3)] == [0, 1, 2]
        finished = threading.Event()
        closer = threading.Thread(target=lambda: (results.close(), finished.set()), daemon=True)
        closer.start()
        assert finished.wait(timeout=60), "the pool's workers did not end on SIGTERM"
        assert list(ordered_map(_slow_identity, range(10), 2)) == list(range(10))  # run to its end
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert noted == []  # the parent itself received nothing


def _one_worker_hangs_deaf_to_sigterm(marker: str) -> None:
    # As a worker forked while another thread held a lock: stuck before it could take SIGTERM's
    # default action, the parent's noting handler still its own (only the first worker to start).
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return
    signal.signal(signal.SIGTERM, lambda number, frame: None)
    threading.Event().wait()


def test_an_abandoned_map_kills_a_worker_that_sigterm_does_not_end(monkeypatch, tmp_path):
    monkeypatch.setattr(piece_encoding, "TERMINATE_GRACE_S", 1.0)
    marker = tmp_path / "hung"
    results = ordered_map(_slow_identity, iter(range(100)), 2, _one_worker_hangs_deaf_to_sigterm, (str(marker),))
    assert [next(results) for _ in range(3)] == [0, 1, 2]  # the other worker does them
    assert marker.exists()
    finished = threading.Event()
    closer = threading.Thread(target=lambda: (results.close(), finished.set()), daemon=True)
    closer.start()
    assert finished.wait(timeout=60), "terminate waited for a worker that SIGTERM does not end"


_STARTED_BY = "the module as imported"


def _started_by(_: int) -> str:
    return _STARTED_BY


def test_workers_are_forked_whatever_start_method_the_process_has(monkeypatch):
    # LitData's optimize sets the process-wide start method to spawn: the workers are still forked,
    # so they have this module's globals as the parent set them (a spawned one imports it afresh)
    previous = multiprocessing.get_start_method(allow_none=True)
    multiprocessing.set_start_method("spawn", force=True)
    try:
        monkeypatch.setattr(sys.modules[__name__], "_STARTED_BY", "set in the parent")
        assert list(ordered_map(_started_by, range(4), 2)) == ["set in the parent"] * 4
    finally:
        multiprocessing.set_start_method(previous, force=True)


def test_read_ahead_gives_every_item_in_order_from_another_thread():
    producers = set()

    def items():
        for item in range(100):
            producers.add(threading.current_thread().name)
            yield item

    assert list(read_ahead(items())) == list(range(100))
    assert producers == {"read-ahead"}


def test_read_ahead_raises_the_producers_error_and_stops_when_left():
    def failing():
        yield 1
        raise ValueError("TextDataModule: a binary file")

    ahead = read_ahead(failing())
    assert next(ahead) == 1
    with pytest.raises(ValueError, match="a binary file"):
        next(ahead)

    produced = []

    def endless():
        while True:
            produced.append(len(produced))
            yield produced[-1]

    ahead = read_ahead(endless(), depth=2)
    assert [next(ahead) for _ in range(3)] == [0, 1, 2]
    ahead.close()  # the consumer stops early: the thread ends, having made at most a few more
    count = len(produced)
    assert count <= 3 + 2 + 2
    assert not any(thread.name == "read-ahead" and thread.is_alive() for thread in threading.enumerate())
