"""One run per folder (sru_lightning/app/runs/hold.py): who holds a run folder, and when a hold
that was left behind may be taken over. The holders here are real processes (`sleep`, forked
Python processes); the commands that take holds are in test_simultaneous_runs.py."""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from sru_lightning.app.runs import hold
from sru_lightning.app.runs.folder import RunFolder
from sru_lightning.app.runs.hold import FolderHeld, HeldFolders, Holder, holder_of, take_hold


@pytest.fixture(autouse=True)
def _no_holds_left(monkeypatch):
    for name in ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_RESTART_COUNT"):
        monkeypatch.delenv(name, raising=False)
    for name in ("RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "SLURM_PROCID", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    for name in ("TORCHELASTIC_RUN_ID", hold.HOLD_ENV):
        monkeypatch.delenv(name, raising=False)
    yield


@pytest.fixture
def holds():
    """The folders a test holds, given back at its end as a command's are."""
    folders = HeldFolders()
    yield folders
    folders.release_all()


@pytest.fixture
def sleeper():
    process = subprocess.Popen(["sleep", "120"])
    yield process
    process.kill()
    process.wait()


def place_hold(folder: Path, **fields) -> Holder:
    """Write a hold file into `folder` as another process would have (fields override this process's)."""
    holder = dataclasses.replace(Holder.of_this_process("fit", folder, "python -m sru_lightning fit seed=3"), **fields)
    (folder / RunFolder.HOLD_FILE).write_text(holder.to_json())
    return holder


def holder_token(folder: Path) -> str:
    return Holder.from_json((folder / RunFolder.HOLD_FILE).read_text()).token


def test_a_hold_is_a_file_in_the_folder_given_back_when_released(holds, tmp_path):
    taken = holds.take(tmp_path, "fit", ["seed=1"])
    record = Holder.from_json((tmp_path / RunFolder.HOLD_FILE).read_text())
    assert record.pid == os.getpid() and record.host == socket.gethostname()
    assert record.command_line == "python -m sru_lightning fit seed=1" and taken.owned and taken.note is None
    assert holds.take(tmp_path, "fit") is taken  # the same process asks again: the same hold
    taken.release()
    assert sorted(os.listdir(tmp_path)) == []  # nothing left: no hold, no file of its own beside


def test_a_live_process_holds_its_folder_and_the_refusal_names_it(holds, tmp_path, sleeper):
    placed = place_hold(tmp_path, pid=sleeper.pid, process_start=hold._process_start(sleeper.pid))
    with pytest.raises(FolderHeld) as refused:
        holds.take(tmp_path, "fit")
    message = str(refused.value)
    assert f"process {sleeper.pid} on host {placed.host}" in message
    assert "python -m sru_lightning fit seed=3" in message and "UTC" in message and "\n" not in message
    assert holder_of(tmp_path) == placed
    assert holder_token(tmp_path) == placed.token  # the refused caller changed nothing


def test_a_dead_holders_hold_is_taken_over_with_a_line_saying_whose(holds, tmp_path, sleeper):
    placed = place_hold(tmp_path, pid=sleeper.pid, process_start=hold._process_start(sleeper.pid))
    sleeper.kill()
    sleeper.wait()
    assert holder_of(tmp_path) is None
    taken = holds.take(tmp_path, "fit")
    assert taken.owned and holder_token(tmp_path) == taken.holder.token != placed.token
    assert f"from fit (process {sleeper.pid} on host {placed.host}" in taken.note
    assert taken.note.endswith("its process is gone")


def test_a_reused_process_id_does_not_hold(holds, tmp_path, sleeper):
    place_hold(tmp_path, pid=sleeper.pid, process_start=hold._process_start(sleeper.pid) - 1)
    taken = holds.take(tmp_path, "fit")
    assert "the process id now belongs to another" in taken.note


def test_a_hold_copied_with_its_folder_holds_nothing_in_the_copy(holds, tmp_path, sleeper):
    run = tmp_path / "run"
    run.mkdir()
    placed = place_hold(run, pid=sleeper.pid, process_start=hold._process_start(sleeper.pid))
    shutil.copytree(run, tmp_path / "copy")
    with pytest.raises(FolderHeld):
        holds.take(run, "fit")
    taken = holds.take(tmp_path / "copy", "fit")
    assert "copied from another folder" in taken.note
    assert holder_token(run) == placed.token  # the original is still held


def test_another_hosts_hold_lasts_while_its_heartbeat_is_fresh(holds, tmp_path, monkeypatch):
    monkeypatch.setattr(hold.shutil, "which", lambda name: None)  # no SLURM to ask
    place_hold(tmp_path, host="another-node", pid=1)
    with pytest.raises(FolderHeld, match="on host another-node"):
        holds.take(tmp_path, "fit")
    old = time.time() - hold.STALE_S - 5
    os.utime(tmp_path / RunFolder.HOLD_FILE, (old, old))
    taken = holds.take(tmp_path, "fit")
    assert "its heartbeat stopped" in taken.note and f"more than {hold.STALE_S:.0f} s" in taken.note


def test_another_hosts_slurm_job_holds_while_slurm_knows_it_unfinished(holds, tmp_path, monkeypatch):
    states = {"41": "RUNNING", "42": "PENDING", "43": "CANCELLED", "44": ""}
    monkeypatch.setattr(hold, "slurm_job_state", states.get)
    old = time.time() - hold.STALE_S - 5  # a stale heartbeat does not matter while SLURM answers
    for job, held in (("41", True), ("42", True), ("43", False), ("44", False)):
        folder = tmp_path / job
        folder.mkdir()
        place_hold(folder, host="another-node", pid=1, slurm_job=job)
        os.utime(folder / RunFolder.HOLD_FILE, (old, old))
        if held:
            with pytest.raises(FolderHeld, match=f"SLURM job {job}"):
                holds.take(folder, "fit")
        else:
            assert f"job {job}" in holds.take(folder, "fit").note


def test_a_slurm_jobs_tasks_share_its_hold_and_a_requeue_takes_it_over(holds, tmp_path, monkeypatch, sleeper):
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    live = {"pid": sleeper.pid, "process_start": hold._process_start(sleeper.pid)}
    placed = place_hold(tmp_path, slurm_job="77", slurm_restart=0, **live)
    with pytest.raises(FolderHeld):  # a second fit of the job's first task: another run
        holds.take(tmp_path, "fit")
    monkeypatch.setenv("SLURM_PROCID", "1")  # another task of the job goes ahead under its hold
    joined = holds.take(tmp_path, "fit")
    assert not joined.owned and joined.holder == placed
    joined.release()
    assert holder_token(tmp_path) == placed.token  # a task that joined gives back nothing

    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")  # the job again, after a requeue
    taken = holds.take(tmp_path, "fit")
    assert taken.owned and holder_token(tmp_path) == taken.holder.token
    assert taken.note.endswith("SLURM job 77 before its requeue")


def test_a_rank_launched_by_the_holder_goes_ahead_under_its_hold(holds, tmp_path, monkeypatch, sleeper):
    placed = place_hold(tmp_path, pid=sleeper.pid, process_start=hold._process_start(sleeper.pid))
    monkeypatch.setenv("LOCAL_RANK", "1")
    with pytest.raises(FolderHeld):  # a rank of another job
        holds.take(tmp_path, "fit")
    monkeypatch.setenv(hold.HOLD_ENV, placed.token)  # what the holder's launched ranks inherit
    joined = holds.take(tmp_path, "fit")
    assert not joined.owned and joined.holder == placed


def test_the_ranks_of_one_rendezvous_share_the_hold_of_its_first(holds, tmp_path, monkeypatch, sleeper):
    for name, value in (("MASTER_ADDR", "10.0.0.1"), ("MASTER_PORT", "29500"), ("TORCHELASTIC_RUN_ID", "none")):
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("RANK", "0")
    live = {"pid": sleeper.pid, "process_start": hold._process_start(sleeper.pid)}
    place_hold(tmp_path, rendezvous="10.0.0.1:29500/none", **live)
    with pytest.raises(FolderHeld):  # another first rank, of the same address: another fit
        holds.take(tmp_path, "fit")
    monkeypatch.setenv("RANK", "1")
    assert not holds.take(tmp_path, "fit").owned
    monkeypatch.setenv("MASTER_PORT", "29501")  # a rank of another job
    with pytest.raises(FolderHeld):
        holds.take(tmp_path, "fit")


def test_a_rank_other_than_the_first_takes_no_hold(holds, tmp_path, monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert not holds.take(tmp_path, "fit").owned
    assert os.listdir(tmp_path) == []


def test_release_leaves_a_hold_that_is_no_longer_its_own(holds, tmp_path, sleeper):
    taken = holds.take(tmp_path, "fit")
    replaced = place_hold(tmp_path, pid=sleeper.pid, process_start=hold._process_start(sleeper.pid))
    taken.release()
    assert holder_token(tmp_path) == replaced.token


def test_the_holder_beats_while_it_holds(holds, tmp_path, monkeypatch):
    monkeypatch.setattr(hold, "HEARTBEAT_S", 0.05)
    taken = holds.take(tmp_path, "fit")
    path = tmp_path / RunFolder.HOLD_FILE
    os.utime(path, (1.0, 1.0))
    deadline = time.time() + 10
    while path.stat().st_mtime < 2 and time.time() < deadline:
        time.sleep(0.02)
    assert path.stat().st_mtime > time.time() - 10
    taken.release()


def _race(folder: str, start: float, results) -> None:
    time.sleep(max(0.0, start - time.time()))
    try:
        taken = take_hold(folder, "fit")
        results.put(("took", os.getpid(), taken.note))
        time.sleep(1.0)  # hold it while the others decide
        taken.release()  # a forked process ends without running atexit
    except FolderHeld as held:
        results.put(("refused", os.getpid(), str(held)))


@pytest.mark.slow  # starts processes
@pytest.mark.parametrize("left_behind", [False, True], ids=["free folder", "dead holder's hold"])
def test_of_processes_starting_at_one_moment_exactly_one_holds(tmp_path, left_behind):
    if left_behind:
        dead = subprocess.Popen(["true"])
        dead.wait()
        place_hold(tmp_path, pid=dead.pid, process_start=None)
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    start = time.time() + 0.5
    racers = [context.Process(target=_race, args=(str(tmp_path), start, results)) for _ in range(8)]
    for racer in racers:
        racer.start()
    outcomes = [results.get(timeout=60) for _ in racers]
    for racer in racers:
        racer.join(timeout=60)
    took = [outcome for outcome in outcomes if outcome[0] == "took"]
    assert len(took) == 1, outcomes
    winner = took[0][1]
    assert all(f"process {winner} on host" in text for kind, _, text in outcomes if kind == "refused")
    assert (took[0][2] is not None) == left_behind  # a takeover says so; a free folder has nothing to say
    assert sorted(os.listdir(tmp_path)) == []  # the winner gave it back; no racer left a file


@pytest.mark.parametrize("kind", ["a sweep into a run's folder", "a run into a sweep's folder"])
def test_a_run_and_a_sweep_never_share_a_folder(tmp_path, capsys, monkeypatch, kind):
    from sru_lightning.app import cli

    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "folder"
    if kind == "a sweep into a run's folder":
        (folder / RunFolder.CHECKPOINTS_DIR).mkdir(parents=True)
        words, says = ["fit", "-m", "debug=tiny", "seed=1,2", f"hydra.sweep.dir={folder}"], "which holds a run"
    else:
        (folder / "0" / RunFolder.HYDRA_DIR).mkdir(parents=True)
        words, says = ["fit", "debug=tiny", f"hydra.run.dir={folder}"], "which holds the jobs of a sweep (0)"
    before = sorted(path.relative_to(folder) for path in folder.rglob("*"))
    assert cli.main(words) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 1 and says in errors[0], errors
    assert sorted(path.relative_to(folder) for path in folder.rglob("*")) == before  # nothing written, no hold left
