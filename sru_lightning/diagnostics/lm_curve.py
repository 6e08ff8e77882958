"""`python -m sru_lightning bench lm --curve --budget S [--plot FILE]`: validation bits per
character against wall-clock seconds.

Fits of S seconds each (``trainer.max_time``, ``data=pydoc``) of ``model=sru``, ``model=srupp``,
``model=lstm`` and a recipe (``--recipe``), each through the command line into its own run folder
under ``--out``; :class:`WallClock` logs the seconds since training started beside every
validation's metrics, from which the table and the plot are read.
"""

from __future__ import annotations

import csv
import json
import math
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import Callback

from sru_lightning.diagnostics.lm_bench import LMBenchConfig
from sru_lightning.diagnostics.tables import fixed_width_lines

#: The curve's runs: name -> the overrides that make it (the recipe's come from --recipe).
CURVE_RUNS = {"sru": ["model=sru"], "srupp": ["model=srupp"], "lstm": ["model=lstm"]}
WALL_SECONDS = "wall_seconds"
#: The curve's fits validate four times an epoch (data=pydoc's epoch is ~400 steps), for points
#: between the epochs; --extra "trainer.val_check_interval=..." overrides it.
VALIDATION_INTERVAL = 0.25


class WallClock(Callback):
    """Logs `wall_seconds`, the seconds since training started, with every validation of a fit."""

    def __init__(self) -> None:
        self.started: float | None = None

    def on_train_start(self, trainer, pl_module) -> None:
        self.started = time.perf_counter()

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if self.started is not None and trainer.state.fn == "fit":
            pl_module.log(WALL_SECONDS, time.perf_counter() - self.started)


def curve_runs(config: LMBenchConfig) -> dict[str, list[str]]:
    """The curve's runs: name -> overrides (the shared ones from --extra last)."""
    extra = shlex.split(config.extra)
    runs = {name: [*made, *extra] for name, made in CURVE_RUNS.items()}
    return {**runs, "recipe": [*shlex.split(config.recipe), *extra]}


def max_time(seconds: int) -> str:
    """`trainer.max_time` as Lightning reads it, DD:HH:MM:SS."""
    minutes, seconds = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    return f"{days:02d}:{hours:02d}:{minutes:02d}:{seconds:02d}"


def run_curve(config: LMBenchConfig) -> dict[str, Path]:
    """One fit per run, one after another, each in its own folder under `config.out`."""
    out = Path(config.out).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    folders = {}
    for name, overrides in curve_runs(config).items():
        folder = out / name
        argv = [
            sys.executable, "-m", "sru_lightning", "fit", "data=pydoc",
            f"trainer.max_time={max_time(config.budget)}", "trainer.max_epochs=-1",
            f"trainer.val_check_interval={VALIDATION_INTERVAL}", *overrides,
            f"+callbacks.wall_clock._target_={WallClock.__module__}.{WallClock.__qualname__}",
            f"hydra.run.dir={folder}",
        ]  # fmt: skip
        print(f"{name}: {shlex.join(argv[2:])}", flush=True)
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode != 0:
            print(f"{name}: exited with status {done.returncode}: {done.stderr.strip().splitlines()[-1:]}", flush=True)
        folders[name] = folder
    return folders


def read_curve(folder: Path) -> dict[str, Any]:
    """A run folder's validations, (seconds, bits) pairs, and its result record (empty if none)."""
    result_file = folder / "result.json"
    record = json.loads(result_file.read_text()) if result_file.is_file() else {}
    monitor = record.get("monitor", "val_bpc")
    points = []
    metrics = folder / "csv" / "metrics.csv"
    if metrics.is_file():
        with open(metrics, newline="") as rows:
            for row in csv.DictReader(rows):
                if row.get(WALL_SECONDS) and row.get(monitor):
                    points.append((float(row[WALL_SECONDS]), float(row[monitor])))
    return {"record": record, "monitor": monitor, "points": points}


CURVE_COLUMNS = (
    ("run", "<8"),
    ("status", "<11"),
    ("steps", ">7"),
    ("final", ">9"),
    ("best", ">9"),
    ("tok/s", ">9"),
    ("  overrides", "<"),
)


def format_curve(curves: dict[str, dict[str, Any]], runs: dict[str, list[str]], budget: int) -> str:
    rows = []
    for name, curve in curves.items():
        record, points = curve["record"], curve["points"]
        final = record.get("metrics", {}).get(curve["monitor"], math.nan)
        best = min((bits for _, bits in points), default=math.nan)
        rows.append((
            name, str(record.get("status", "no result")), str(record.get("optimizer_steps", "-")),
            f"{final:.4f}", f"{best:.4f}", f"{record.get('tokens_per_second', math.nan):.0f}",
            "  " + " ".join(runs.get(name, [])),
        ))  # fmt: skip
    monitor = next((curve["monitor"] for curve in curves.values()), "val_bpc")
    return "\n".join([f"Curve: {budget} s fits, final and best {monitor}", *fixed_width_lines(CURVE_COLUMNS, rows)])


def plot_curve(curves: dict[str, dict[str, Any]], path: str, budget: int) -> None:
    try:
        import matplotlib
    except ImportError as missing:
        raise RuntimeError("--plot needs matplotlib (pip install 'sru_lightning[bench]')") from missing
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4.5))
    for name, curve in curves.items():
        if curve["points"]:
            seconds, bits = zip(*curve["points"])
            axis.plot(seconds, bits, marker="o", markersize=3, label=name)
    monitor = next((curve["monitor"] for curve in curves.values()), "val_bpc")
    axis.set_xlabel("wall-clock seconds since training started")
    axis.set_ylabel(f"{monitor} (validation bits per character)")
    axis.set_title(f"{budget} s fits on data=pydoc")
    axis.grid(alpha=0.3)
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main_curve(config: LMBenchConfig) -> None:
    folders = run_curve(config)
    curves = {name: read_curve(folder) for name, folder in folders.items()}
    print(format_curve(curves, curve_runs(config), config.budget))
    if config.plot:
        plot_curve(curves, config.plot, config.budget)
        print(f"chart written to {config.plot}")
