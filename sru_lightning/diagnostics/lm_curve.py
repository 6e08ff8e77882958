"""`python -m sru_lightning bench lm curve=true budget=S [runs=...] [seeds=...] [target=X] [plot=FILE]`:
validation bits per character against wall-clock seconds.

Fits of S seconds each (``trainer.max_time``, ``data=pydoc``) of ``model=sru`` (today's default),
``model=srupp``, ``model=lstm`` and a recipe (``recipe``, default
``experiment=speedrun_10min``), or those named by ``runs``, once per seed of ``seeds``, each
through the command line into its own run folder under ``out``; :class:`WallClock` logs the
seconds since training started beside every validation's metrics, from which the table and the
plot are read. The table gives each run's mean over its seeds and their spread, and the seconds
by which every seed of a run was as low as the default's mean final value, or as `target`.
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
from omegaconf import OmegaConf

from sru_lightning.app.runs.folder import RunFolder
from sru_lightning.diagnostics.lm_bench import LMBenchConfig
from sru_lightning.diagnostics.tables import fixed_width_lines

#: The curve's runs: name -> the overrides that make it (the recipe's come from `recipe`).
CURVE_RUNS = {"sru": ["model=sru"], "srupp": ["model=srupp"], "lstm": ["model=lstm"], "recipe": []}
#: The run the others are measured against: the default model.
REFERENCE_RUN = "sru"
WALL_SECONDS = "wall_seconds"
#: The curve's fits validate four times an epoch (data=pydoc's epoch is ~400 steps), for points
#: between the epochs; extra="trainer.val_check_interval=..." overrides it.
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


def run_names(config: LMBenchConfig) -> list[str]:
    """`runs` as a list of names (the bench command checks each is one of CURVE_RUNS)."""
    return [name.strip() for name in config.runs.split(",") if name.strip()]


def seeds(config: LMBenchConfig) -> list[int | None]:
    """`seeds` as a list of integers; [None] (the config's own seed) when it is empty."""
    return [int(seed) for seed in config.seeds.split(",") if seed.strip()] or [None]


def curve_runs(config: LMBenchConfig) -> dict[str, list[str]]:
    """The curve's runs: name -> overrides (the shared ones from `extra` last)."""
    extra = shlex.split(config.extra)
    made = {**CURVE_RUNS, "recipe": shlex.split(config.recipe)}
    return {name: [*made[name], *extra] for name in run_names(config)}


def fit_folder(out: Path, name: str, seed: int | None) -> Path:
    """A fit's run folder: `<out>/<name>`, or `<out>/<name>-seed<seed>` when `seeds` is given."""
    return out / (name if seed is None else f"{name}-seed{seed}")


def max_time(seconds: int) -> str:
    """`trainer.max_time` as Lightning reads it, DD:HH:MM:SS."""
    minutes, seconds = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    return f"{days:02d}:{hours:02d}:{minutes:02d}:{seconds:02d}"


def run_curve(config: LMBenchConfig) -> dict[str, list[Path]]:
    """One fit per run and seed, one after another, each in its own folder under `config.out`:
    every run's fit of the first seed, then of the next (a comparison cut short is still one)."""
    out = Path(config.out).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    runs = curve_runs(config)
    folders: dict[str, list[Path]] = {name: [] for name in runs}
    for seed in seeds(config):
        for name, overrides in runs.items():
            folder = fit_folder(out, name, seed)
            argv = [
                sys.executable, "-m", "sru_lightning", "fit", "data=pydoc",
                f"trainer.max_time={max_time(config.budget)}", "trainer.max_epochs=-1",
                f"trainer.val_check_interval={VALIDATION_INTERVAL}", *overrides,
                *([] if seed is None else [f"seed={seed}"]),
                f"+callbacks.wall_clock._target_={WallClock.__module__}.{WallClock.__qualname__}",
                f"hydra.run.dir={folder}",
            ]  # fmt: skip
            label = name if seed is None else f"{name} seed {seed}"
            folders[name].append(folder)
            if completed_with(folder, argv[4:-1]):
                print(f"{label}: completed earlier with the same overrides in {folder}; read, not run", flush=True)
                continue
            print(f"{label}: {shlex.join(argv[2:])}", flush=True)
            done = subprocess.run(argv, capture_output=True, text=True)
            if done.returncode != 0:
                last = done.stderr.strip().splitlines()[-1:]
                print(f"{label}: exited with status {done.returncode}: {last}", flush=True)
    return folders


def completed_with(folder: Path, overrides: list[str]) -> bool:
    """Whether `folder` holds a completed fit made with these overrides (in any order), so that a
    curve stopped part-way, or drawn again, reruns none of the fits it has."""
    run = RunFolder(folder)
    result_file, overrides_file = run.result_file, run.directory / run.HYDRA_DIR / run.OVERRIDES_FILE
    if not (result_file.is_file() and overrides_file.is_file()):
        return False
    try:
        status = json.loads(result_file.read_text()).get("status")
        made = [str(item) for item in OmegaConf.load(overrides_file)]
    except (ValueError, OSError, AttributeError, TypeError):
        return False
    return status == "completed" and sorted(made) == sorted(overrides)


def read_curve(folder: Path) -> dict[str, Any]:
    """A run folder's validations, (seconds, bits) pairs, and its result record (empty if none)."""
    result_file = RunFolder(folder).result_file
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
    ("fits", ">5"),
    ("steps", ">7"),
    ("final", ">9"),
    ("spread", ">8"),
    ("best", ">9"),
    ("tok/s", ">9"),
    ("reach s", ">9"),
    ("  overrides", "<"),
)


def _final(curve: dict[str, Any]) -> float:
    return curve["record"].get("metrics", {}).get(curve["monitor"], math.nan)


def seconds_to_reach(curve: dict[str, Any], target: float) -> float:
    """The wall-clock seconds of the fit's first validation at or below `target` (inf: none)."""
    return next((seconds for seconds, bits in curve["points"] if bits <= target), math.inf)


def summarize(curves: list[dict[str, Any]], target: float) -> dict[str, Any]:
    """A run's seeds in one row: the mean final value, its spread (max - min), the mean best,
    steps and tokens per second, and the seconds by which every seed reached `target`."""
    finals = [_final(curve) for curve in curves]
    statuses = {str(curve["record"].get("status", "no result")) for curve in curves}
    mean = lambda values: sum(values) / len(values) if values else math.nan  # noqa: E731
    return {
        "status": statuses.pop() if len(statuses) == 1 else "mixed",
        "fits": len(curves),
        "steps": mean([curve["record"].get("optimizer_steps", math.nan) for curve in curves]),
        "final": mean(finals),
        "spread": max(finals) - min(finals) if finals else math.nan,
        "best": mean([min((bits for _, bits in curve["points"]), default=math.nan) for curve in curves]),
        "tokens_per_second": mean([curve["record"].get("tokens_per_second", math.nan) for curve in curves]),
        "reach": max((seconds_to_reach(curve, target) for curve in curves), default=math.nan),
    }


def format_curve(
    curves: dict[str, list[dict[str, Any]]], runs: dict[str, list[str]], budget: int, target: float | None = None
) -> str:
    """The table: a row per run over its seeds; `reach s` is the seconds by which every seed of
    the run was at or below `target`, or, without one, the default run's (sru's) mean final value."""
    reference = curves.get(REFERENCE_RUN)
    given = target is not None
    if not given:
        target = summarize(reference, math.nan)["final"] if reference else math.nan
    rows = []
    for name, run in curves.items():
        row = summarize(run, target)
        reach = row["reach"]
        measured = given or name != REFERENCE_RUN
        reach = "-" if not measured or math.isnan(reach) else "never" if math.isinf(reach) else f"{reach:.0f}"
        steps = "-" if math.isnan(row["steps"]) else f"{row['steps']:.0f}"
        rows.append((
            name, row["status"], str(row["fits"]), steps, f"{row['final']:.4f}", f"{row['spread']:.4f}",
            f"{row['best']:.4f}", f"{row['tokens_per_second']:.0f}", reach, "  " + " ".join(runs.get(name, [])),
        ))  # fmt: skip
    monitor = next((run[0]["monitor"] for run in curves.values() if run), "val_bpc")
    title = f"Curve: {budget} s fits, final and best {monitor} (means over each run's fits)"
    if not math.isnan(target):
        whose = "given" if given else f"{REFERENCE_RUN}'s mean final value"
        title += f"; reach s: seconds to {monitor} <= {target:.4f} ({whose})"
    return "\n".join([title, *fixed_width_lines(CURVE_COLUMNS, rows)])


def plot_curve(curves: dict[str, list[dict[str, Any]]], path: str, budget: int, target: float | None = None) -> None:
    try:
        import matplotlib
    except ImportError as missing:
        raise RuntimeError("`plot` needs matplotlib (pip install 'sru_lightning[bench]')") from missing
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4.5))
    for index, (name, run) in enumerate(curves.items()):
        drawn = [curve for curve in run if curve["points"]]
        for number, curve in enumerate(drawn):  # one colour a run, a line a seed
            seconds, bits = zip(*curve["points"])
            marker = {"marker": "o", "markersize": 3} if len(drawn) == 1 else {"linewidth": 1}
            axis.plot(seconds, bits, color=f"C{index}", label=name if number == 0 else None, **marker)
    monitor = next((run[0]["monitor"] for run in curves.values() if run), "val_bpc")
    finals = [curve["points"][-1][1] for run in curves.values() for curve in run if curve["points"]]
    if finals:  # the first validations sit far above where the runs end: keep the ends apart
        lowest = min(bits for run in curves.values() for curve in run for _, bits in curve["points"])
        axis.set_ylim(lowest - 0.05, max(finals) * 1.5)
    if target is not None:
        axis.axhline(target, color="grey", linestyle="--", linewidth=1, label=f"target {target:g}")
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
    curves = {name: [read_curve(folder) for folder in run] for name, run in folders.items()}
    target = config.target or None
    print(format_curve(curves, curve_runs(config), config.budget, target))
    if config.plot:
        plot_curve(curves, config.plot, config.budget, target)
        print(f"chart written to {config.plot}")
