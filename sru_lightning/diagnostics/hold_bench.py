"""`bench hold`: what holding a run folder costs a fit's start, and whether two fits started at
the same moment into one folder always end with one run in it (sru_lightning/app/runs/hold.py).

The cost is timed in this process: taking a free folder's hold, the check a second command
makes and is refused by, and giving the hold back. The double starts are real: `pairs` times,
two `fit debug=tiny` with different settings (hidden size, seed) start together into a new
folder; each pair counts as clean when exactly one trained, the other exited with status 2 and
one error line naming the holder, and the folder's config, checkpoints and history are all of
the run that trained.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from sru_lightning.app.key_value import setting
from sru_lightning.app.runs.folder import RunFolder
from sru_lightning.app.runs.hold import FolderHeld, take_hold
from sru_lightning.diagnostics.tables import repeats_setting, threads_setting


@dataclass
class HoldBenchConfig:
    repeats: int = repeats_setting(200, "timed takes of a hold")
    pairs: int = setting(
        20, "double starts: two fits started together into one new folder, this many times", at_least=0
    )
    threads: int = threads_setting(1, "threads of each fit of a double start")


@dataclass
class HoldTimes:
    take_ms: float
    refused_ms: float
    release_ms: float


def time_hold(repeats: int) -> HoldTimes:
    """Median milliseconds to take a free folder's hold, to be refused by a held one, to give one back."""
    take, refused, release = [], [], []
    with tempfile.TemporaryDirectory(prefix="sru-hold-bench-") as root:
        held = Path(root) / "held"
        held.mkdir()
        holder = subprocess.Popen(
            [sys.executable, "-c", _HOLD_AND_WAIT, str(held)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        try:
            holder.stdout.readline()  # it holds the folder now
            for index in range(repeats):
                folder = Path(root) / f"free-{index}"
                folder.mkdir()
                start = time.perf_counter()
                taken = take_hold(folder, "fit")
                take.append(time.perf_counter() - start)
                start = time.perf_counter()
                try:
                    take_hold(held, "fit")
                except FolderHeld:
                    refused.append(time.perf_counter() - start)
                start = time.perf_counter()
                taken.release()
                release.append(time.perf_counter() - start)
        finally:
            holder.stdin.close()
            holder.wait(timeout=60)
    if len(refused) != repeats:
        raise RuntimeError(f"a held folder was taken {repeats - len(refused)} times of {repeats}")
    return HoldTimes(*(1000 * statistics.median(times) for times in (take, refused, release)))


_HOLD_AND_WAIT = (
    "import sys\n"
    "from sru_lightning.app.runs.hold import take_hold\n"
    "hold = take_hold(sys.argv[1], 'fit')\n"
    "print('held', flush=True)\n"
    "sys.stdin.read()\n"
    "hold.release()\n"
)

_FIT = ["-m", "sru_lightning", "fit", "debug=tiny", "logger=none", "callbacks.rich_progress_bar=null"]
_SETTINGS = (["trainer.max_steps=3"], ["trainer.max_steps=3", "model.net.hidden_size=24", "seed=7"])


#: The refusals a second fit into the folder may meet: the first's hold while it runs, or, when
#: the machine started the second only after the first had ended, the first's checkpoints.
REFUSALS = {"held": "no other run is writing", "after": "already holds checkpoints of an earlier run"}


def double_start(folder: Path, threads: int) -> str:
    """Two fits into `folder` at once; `held` or `after` (:data:`REFUSALS`) when exactly one run is
    in it afterwards and the other was refused in one line, else what went wrong."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    processes = [
        subprocess.Popen(
            [sys.executable, *_FIT, *settings, f"hydra.run.dir={folder}"],
            env=env,
            cwd=folder.parent,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for settings in _SETTINGS
    ]
    ended = [(process.wait(timeout=600), process.stderr.read()) for process in processes]
    statuses = sorted(status for status, _ in ended)
    if statuses != [0, 2]:
        failed = [err.strip().splitlines()[-1] for status, err in ended if status not in (0, 2) and err.strip()]
        return f"exit statuses {statuses}" + (f" ({failed[0][-200:]})" if failed else "")
    trained, (_, refused_err) = (0, ended[1]) if ended[0][0] == 0 else (1, ended[0])
    errors = [line for line in refused_err.splitlines() if "error:" in line]
    kinds = [kind for kind, text in REFUSALS.items() if len(errors) == 1 and text in errors[0]]
    if not kinds or "Traceback" in refused_err:
        return f"the refusal was not one line: {refused_err[-300:]!r}"
    hidden = 24 if trained == 1 else 16
    config_text = (folder / RunFolder.HYDRA_DIR / RunFolder.CONFIG_FILE).read_text()
    index = json.loads((folder / RunFolder.INDEX_FILE).read_text())["checkpoints"]
    history = (folder / RunFolder.HISTORY_FILE).read_text().splitlines()
    if f"hidden_size: {hidden}\n" not in config_text:
        return "the folder's config is not the trained run's"
    if {entry["config"]["model"]["net"]["hidden_size"] for entry in index.values()} != {hidden}:
        return "a checkpoint is not the trained run's"
    if len(history) != 1 or (folder / RunFolder.HOLD_FILE).exists():
        return f"history holds {len(history)} attempts" if len(history) != 1 else "the hold was left behind"
    return kinds[0]


def run_hold_benchmark(config: HoldBenchConfig) -> tuple[HoldTimes, list[str]]:
    times = time_hold(config.repeats)
    problems = []
    with tempfile.TemporaryDirectory(prefix="sru-hold-pairs-") as root:
        for pair in range(config.pairs):
            problems.append(double_start(Path(root) / f"pair-{pair}", config.threads))
    return times, problems


def failed_pairs(problems: list[str]) -> int:
    return sum(1 for problem in problems if problem not in REFUSALS)


def format_table(config: HoldBenchConfig, times: HoldTimes, problems: list[str]) -> str:
    held, after = (sum(1 for problem in problems if problem == kind) for kind in REFUSALS)
    lines = [
        f"holding a run folder (median of {config.repeats}):",
        f"  take a free folder        {times.take_ms:8.3f} ms",
        f"  refused by a held folder  {times.refused_ms:8.3f} ms",
        f"  give it back              {times.release_ms:8.3f} ms",
        f"  a fit's start pays        {times.take_ms + times.release_ms:8.3f} ms (take + give back)",
    ]
    if problems:
        lines.append(
            f"two fits started together into one folder: {held + after} of {len(problems)} pairs left one run, "
            f"the other refused in one line ({held} by the first's hold, {after} after the first had ended)"
        )
        lines += [f"  pair {index}: {problem}" for index, problem in enumerate(problems) if problem not in REFUSALS]
    return "\n".join(lines)
