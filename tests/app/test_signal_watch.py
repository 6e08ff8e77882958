"""The signal watch of a multi-process run, on rank 0's side of Lightning's launcher.

Each case runs in its own process: the watch signals this process's children (the test worker
has others) and Lightning's watcher thread may SIGKILL the process it runs in.
"""

from __future__ import annotations

import signal
import sys

import pytest
from helpers import preloaded

LAUNCHED_RANK_EXITS_WITH_1 = """
import subprocess, sys, time
from types import SimpleNamespace
from lightning.fabric.strategies.launchers.subprocess_script import _ChildProcessObserver
from sru_lightning.app.signal_watch import SignalWatch

procs = [subprocess.Popen(["sh", "-c", "exit 1"])]  # a rank that stopped on a signal exits with 1
procs[0].wait()
watch = SignalWatch()
watch.follow(SimpleNamespace(strategy=SimpleNamespace(launcher=SimpleNamespace(procs=procs))))
_ChildProcessObserver(main_pid=__import__("os").getpid(), child_processes=procs, sleep_period=0.2).start()
if sys.argv[1] == "release":
    watch.release_launched_ranks()
time.sleep(1.5)  # rank 0 writing its record and message
print("rank 0 ended on its own")
"""

SIGNAL_BEFORE_TRAINING = """
import signal, subprocess, sys
from types import SimpleNamespace
from sru_lightning.app import signal_watch
from sru_lightning.callbacks import GracefulInterrupt

rank = subprocess.Popen(["sleep", "60"])
ended = []
signal_watch._exit = lambda message, status: ended.append((message, status))
watch = signal_watch.SignalWatch()
launcher = SimpleNamespace(procs=[rank])
watch.follow(SimpleNamespace(callbacks=[GracefulInterrupt()], strategy=SimpleNamespace(launcher=launcher)))
watch._on_signal(int(sys.argv[1]))
print(rank.wait(timeout=30), ended[0][1])
"""

# The watch finds the trainer's callbacks that stop the fit on a signal themselves and becomes
# their supervisor; each hands over from its `setup`, once its own handlers are in place.
SUPERVISES_THE_CALLBACK = """
from types import SimpleNamespace
from sru_lightning.app.signal_watch import watching_signals
from sru_lightning.callbacks import GracefulInterrupt

graceful = GracefulInterrupt()
with watching_signals() as watch:
    watch.follow(SimpleNamespace(callbacks=[graceful], strategy=None))
    assert graceful.supervisor is watch and watch._owner is None
    graceful.setup(SimpleNamespace(global_rank=0, world_size=1), None, "fit")
    assert watch._owner is graceful
    graceful.teardown(None, None, "fit")
assert graceful.supervisor is None, "a later fit in this process is not supervised by a stopped watch"
print("handed over")
"""


@pytest.mark.slow  # starts a process: the watch sets this process's signal handlers
def test_the_watch_supervises_the_trainers_stopping_callback_until_it_stops():
    ended = preloaded.run([sys.executable, "-c", SUPERVISES_THE_CALLBACK], capture_output=True, text=True, timeout=120)
    assert ended.returncode == 0 and "handed over" in ended.stdout, ended.stderr[-2000:]


@pytest.mark.slow  # starts processes
@pytest.mark.parametrize("release", [True, False])
def test_released_ranks_do_not_get_rank_0_killed_while_it_ends(release):
    ended = preloaded.run(
        [sys.executable, "-c", LAUNCHED_RANK_EXITS_WITH_1, "release" if release else "keep"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if release:
        assert ended.returncode == 0 and "rank 0 ended on its own" in ended.stdout, ended.stderr[-2000:]
    else:  # what the release prevents: Lightning's watcher kills rank 0
        assert ended.returncode == -signal.SIGKILL, (ended.returncode, ended.stderr[-2000:])


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_before_training_ends_the_launched_ranks_with_sigterm(signum):
    """A rank still starting its interpreter would print a KeyboardInterrupt traceback on SIGINT."""
    ended = preloaded.run(
        [sys.executable, "-c", SIGNAL_BEFORE_TRAINING, str(int(signum))], capture_output=True, text=True, timeout=120
    )
    assert ended.returncode == 0, ended.stderr[-2000:]
    rank_status, exit_status = map(int, ended.stdout.split()[-2:])
    assert rank_status == -signal.SIGTERM
    assert exit_status == 128 + signum  # rank 0 itself reports the signal it received
