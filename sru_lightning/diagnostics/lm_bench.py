"""Language-model benchmark (`python -m sru_lightning bench lm`): what the training loop costs.

``bench lm [model=sru] [extra="k=v ..."]``: the run `fit` builds (the application's own
:func:`sru_lightning.app.runs.building.build`, with its callbacks, logger and progress bar) is
timed step by step in steady state against the same network's forward, loss, backward, gradient
clipping and optimizer step on one fixed batch in a plain loop (the optimizer and schedule of
:func:`sru_lightning.models.optimization.configure_optimizers`). One plain step runs after every
step of the fit, in the same process, so the ratio holds on a busy machine. The ratio comes from
`repeats` steps that run as a user's fit does, with the profiler off; the `repeats` steps after
them are profiled with Lightning's ``SimpleProfiler`` (the :class:`StepProfiler` below also keeps
each action's own time, less the actions inside it), which says where the difference goes: data
loading, logging, our callbacks, Lightning's, the LightningModule's hooks and the loop itself.
The profiler's own work (a few microseconds for each of the ~70 actions of a step) is printed
beside the table, not counted in the ratio. Two blocks rather than alternate steps, so that
work done every n-th step (the loggers' writes) falls into both alike.

``bench lm curve=true`` (validation bits per character against wall-clock seconds) is
:mod:`sru_lightning.diagnostics.lm_curve`.
"""

from __future__ import annotations

import copy
import shlex
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.profilers import SimpleProfiler

from sru_lightning.app.key_value import setting
from sru_lightning.diagnostics.tables import (
    STATISTIC_NAMES,
    count_setting,
    fixed_width_lines,
    repeats_setting,
    statistic_of,
    statistic_setting,
    warmup_setting,
)


@dataclass
class LMBenchConfig:
    model: str = setting("sru", "the model config (conf/model/) of the timed fit")
    extra: str = setting("", "Hydra overrides of every fit, in one quoted string")
    repeats: int = repeats_setting(30, "timed training steps of each kind (profiled and not)")
    warmup: int = warmup_setting(5, "training steps before them")
    statistic: str = statistic_setting("median")
    curve: bool = setting(False, "run the curve: one fit per run of `budget` seconds each")
    budget: int = count_setting(60, "seconds of each fit of the curve (trainer.max_time)")
    recipe: str = setting(
        "experiment=speedrun_10min", "the overrides of the curve's run `recipe`, in one quoted string"
    )
    runs: str = setting(
        "sru,srupp,lstm,recipe", "the curve's runs, comma-separated, of sru (the default model), srupp, lstm, recipe"
    )
    seeds: str = setting(
        "", "comma-separated seeds: one fit per run and seed (mean and spread); empty: the config's seed"
    )
    target: float = setting(
        0.0,
        "the val_bpc the curve's `reach s` column times (the seconds by which every seed of a run was at or"
        " below it); 0: the default run's (sru's) mean final value",
        at_least=0.0,
    )
    out: str = setting("outputs/bench_lm", "folder of the curve's run folders")
    plot: str = setting("", "with curve=true: draw validation bits per character against seconds into this image file")


# -- the loop's cost ----------------------------------------------------------------------------
class StepProfiler(SimpleProfiler):
    """Lightning's SimpleProfiler that, while `recording`, also adds up each action's own seconds:
    its duration less that of the actions that ran inside it (the actions nest).

    While not `active` it starts nothing, as Lightning's PassThroughProfiler (a fit's default);
    an action started while active is still stopped after it turns off."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.recording = False
        self.active = True
        self.own_seconds: dict[str, float] = defaultdict(float)
        self._open: list[list] = []  # [action, seconds of the actions inside it]

    def start(self, action_name: str) -> None:
        if not self.active:
            return
        super().start(action_name)
        self._open.append([action_name, 0.0])

    def stop(self, action_name: str) -> None:
        if action_name not in self.current_actions:  # started while off
            return
        super().stop(action_name)
        duration = self.recorded_durations[action_name][-1]
        index = max((i for i, (name, _) in enumerate(self._open) if name == action_name), default=None)
        inner = self._open.pop(index)[1] if index is not None else 0.0
        if index is not None and index > 0:
            self._open[index - 1][1] += duration
        if self.recording:
            self.own_seconds[action_name] += duration - inner

    def describe(self) -> None:  # the benchmark prints its own table, not the report of every action
        self.teardown(stage=self._stage)


class _PlainStep:
    """Forward + loss, backward, gradient clipping and optimizer step of a copy of `model.net`
    on one fixed batch, each phase timed, in the fit's precision: the forward under the fit's
    precision plugin's autocast and, where the fit scales its loss (16-mixed), a gradient scaler
    of its own."""

    PHASES = ("forward + loss", "backward", "gradient clipping", "optimizer step")

    def __init__(self, trainer, model, batch) -> None:
        from sru_lightning.models.optimization import configure_optimizers

        self.net = copy.deepcopy(model.net).train()
        wiring = configure_optimizers(
            self.net, model.optimizer_config, model.lr_scheduler_config, trainer.estimated_stepping_batches
        )
        self.optimizer = wiring["optimizer"]
        scheduler = wiring.get("lr_scheduler")
        self.scheduler = scheduler["scheduler"] if isinstance(scheduler, dict) else scheduler
        self.clip = trainer.gradient_clip_val
        self.batch = [t.clone() for t in batch]
        self.precision = trainer.precision_plugin
        fits_scaler = getattr(self.precision, "scaler", None)
        self.scaler = None if fits_scaler is None else torch.amp.GradScaler(batch[0].device.type)

    def __call__(self) -> dict[str, float]:
        inputs, targets, *rest = self.batch
        times, began = {}, time.perf_counter()
        with self.precision.forward_context():
            logits, _ = self.net(inputs, None, rest[0]) if rest else self.net(inputs)
            loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1))
        times["forward + loss"], began = time.perf_counter() - began, time.perf_counter()
        (loss if self.scaler is None else self.scaler.scale(loss)).backward()
        times["backward"], began = time.perf_counter() - began, time.perf_counter()
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        if self.clip:
            torch.nn.utils.clip_grad_norm_(self.net.parameters(), self.clip)
        times["gradient clipping"], began = time.perf_counter() - began, time.perf_counter()
        if self.scaler is None:
            self.optimizer.step()
        else:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        if self.scheduler is not None:
            self.scheduler.step()
        times["optimizer step"] = time.perf_counter() - began
        return times


class LoopClock(Callback):
    """Times each step of the fit (from the end of one to the end of the next, the plain step
    left out) and runs one plain step after each. After `warmup` steps, `repeats` steps with the
    profiler off (as a user's fit runs), then `repeats` profiled ones."""

    def __init__(self, profiler: StepProfiler, warmup: int, repeats: int) -> None:
        self.profiler, self.warmup, self.repeats = profiler, warmup, repeats
        self.fit_seconds: list[float] = []  # the steps with the profiler off
        self.profiled_seconds: list[float] = []
        self.plain_seconds: dict[str, list[float]] = defaultdict(list)  # beside the steps with it off
        self.profiled_plain_seconds: dict[str, list[float]] = defaultdict(list)  # beside the profiled ones
        self.steps, self._last_end, self._plain = 0, None, None

    @property
    def total_steps(self) -> int:
        return self.warmup + 2 * self.repeats

    def _profiles(self, step: int) -> bool:
        """Whether the fit's `step` (counted from 1) is one of the profiled ones."""
        return self.warmup + self.repeats < step <= self.total_steps

    def on_train_start(self, trainer, pl_module) -> None:
        if trainer.num_training_batches < self.total_steps:
            raise ValueError(
                f"warmup + 2 x repeats: the fit's epoch has {trainer.num_training_batches} training batches, "
                f"fewer than the {self.total_steps} steps to time; lower them or use more data"
            )
        self.profiler.active = self.profiler.recording = self._profiles(1)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        now = time.perf_counter()
        self.steps += 1
        timed = self.warmup < self.steps <= self.total_steps
        profiled = self._profiles(self.steps)
        if timed:
            (self.profiled_seconds if profiled else self.fit_seconds).append(now - self._last_end)
        self.profiler.active = self.profiler.recording = False
        if self._plain is None:
            self._plain = _PlainStep(trainer, pl_module, batch)
        for phase, seconds in self._plain().items():
            if timed:
                (self.profiled_plain_seconds if profiled else self.plain_seconds)[phase].append(seconds)
        self.profiler.active = self.profiler.recording = self._profiles(self.steps + 1)
        self._last_end = time.perf_counter()


#: Group of the fit's work -> the plain loop's phase it is compared with (None: the plain loop has none).
GROUPS = {
    "model step: forward + loss, carried state, metrics": "forward + loss",
    "model step: backward": "backward",
    "model step: gradient clipping": "gradient clipping",
    "model step: optimizer step, zero_grad, lr schedule": "optimizer step",
    "data loading": None,
    "logging (loggers)": None,
    "callbacks: ours": None,
    "callbacks: Lightning's": None,
    "LightningModule hooks": None,
    "Lightning loop (unprofiled)": None,
}
_DATA_ACTIONS = ("train_dataloader_next", "batch_to_device", "transfer_batch_to_device", "batch_transfer")
_OPTIMIZER_ACTIONS = ("optimizer_step", "optimizer_zero_grad", "lr_scheduler_step", "run_training_batch")


def _is_lightnings(callback: Callback) -> bool:
    """A callback of Lightning's, or a subclass of one (our FolderModelCheckpoint is a ModelCheckpoint)."""
    return any(cls.__module__.startswith("lightning.") and cls is not Callback for cls in type(callback).__mro__)


def classify(action: str, callbacks: dict[str, Callback]) -> tuple[str, str] | None:
    """(group, item name) of a profiler action; None for the benchmark's own clock."""
    if action.startswith("[Callback]"):
        key, hook = action[len("[Callback]") :].rsplit(".", 1)
        callback = callbacks.get(key)
        if isinstance(callback, LoopClock):
            return None
        name = f"{type(callback).__name__ if callback is not None else key}.{hook}"
        return ("callbacks: Lightning's" if callback is None or _is_lightnings(callback) else "callbacks: ours"), name
    if action.startswith("[Logger]"):
        return "logging (loggers)", action
    if any(part in action for part in _DATA_ACTIONS):
        return "data loading", action
    if action.endswith(".training_step"):
        return "model step: forward + loss, carried state, metrics", action
    if action.endswith(".backward"):
        return "model step: backward", action
    if "gradient_clipping" in action or "clip_gradients" in action:
        return "model step: gradient clipping", action
    if any(action.endswith(part) for part in _OPTIMIZER_ACTIONS):
        return "model step: optimizer step, zero_grad, lr schedule", action
    if action.startswith("[LightningModule]"):
        return "LightningModule hooks", action
    return "Lightning loop (unprofiled)", action


@dataclass
class OverheadResult:
    config: LMBenchConfig
    description: str
    fit_ms: float  # per step, by the statistic, the profiler off
    plain_ms: float
    groups: dict[str, tuple[float, float]] = field(default_factory=dict)  # group -> (fit, plain) mean ms/step
    items: list[tuple[str, str, float]] = field(default_factory=list)  # (group, item, mean ms/step)
    profiled_ms: float = 0.0  # mean per profiled step
    unprofiled_ms: float = 0.0  # mean per step with the profiler off

    @property
    def ratio(self) -> float:
        return self.fit_ms / self.plain_ms


def _compose(overrides: list[str], output_dir: Path):
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    from sru_lightning._resources import conf_dir

    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = compose("config", overrides=overrides, return_hydra_config=True)
    with open_dict(cfg):
        cfg.hydra.runtime.output_dir = str(output_dir)
    HydraConfig.instance().set_config(cfg)  # ${hydra:runtime.output_dir} is the run folder
    with open_dict(cfg):
        del cfg["hydra"]  # as the command line's run sees its config
    return cfg


def _profiled(profiler, action: str, function):
    def call(*args, **kwargs):
        with profiler.profile(action):
            return function(*args, **kwargs)

    return call


def measure_overhead(config: LMBenchConfig) -> OverheadResult:
    """Fit `config.warmup + config.repeats` steps as `fit` builds the run, a plain step after each."""
    from sru_lightning.app.runs.building import build

    steps = config.warmup + 2 * config.repeats
    overrides = [
        f"model={config.model}",
        "data=pydoc",
        *shlex.split(config.extra),
        f"trainer.max_steps={steps}",
        "trainer.max_epochs=-1",
        "trainer.limit_val_batches=2",  # the one validation comes after the timed steps
        f"+trainer.profiler._target_={StepProfiler.__module__}.{StepProfiler.__qualname__}",
    ]
    with tempfile.TemporaryDirectory(prefix="bench-lm-") as folder:
        cfg = _compose(overrides, Path(folder))
        trainer, model, datamodule, _ = build(cfg, "fit", Path(folder), overrides)
        profiler = trainer.profiler
        for logger in trainer.loggers:  # Lightning does not profile the loggers' writes
            for method in ("log_metrics", "save"):
                action = f"[Logger]{type(logger).__name__}.{method}"
                setattr(logger, method, _profiled(profiler, action, getattr(logger, method)))
        clock = LoopClock(profiler, config.warmup, config.repeats)
        trainer.callbacks.append(clock)
        trainer.fit(model, datamodule=datamodule)
    pick = statistic_of(config.statistic)
    plain_steps = [sum(phases) for phases in zip(*clock.plain_seconds.values())]
    sizes = model.net.config
    description = (
        f"model={config.model} {config.extra}".strip()
        + f" (embedding {sizes.get('embedding_dim')}, hidden {sizes.get('hidden_size')}, {sizes.get('num_layers')}"
        + f" layers), batch {datamodule.batch_size} x {datamodule.seq_len}"
    )
    result = OverheadResult(config, description, pick(clock.fit_seconds) * 1e3, pick(plain_steps) * 1e3)
    result.profiled_ms = sum(clock.profiled_seconds) * 1e3 / len(clock.profiled_seconds)
    result.unprofiled_ms = sum(clock.fit_seconds) * 1e3 / len(clock.fit_seconds)
    callbacks = {callback.state_key: callback for callback in trainer.callbacks}
    per_step = 1e3 / config.repeats
    totals: dict[str, float] = defaultdict(float)
    for action, seconds in profiler.own_seconds.items():
        place = classify(action, callbacks)
        if place is None:
            continue
        totals[place[0]] += seconds * per_step
        result.items.append((place[0], place[1], seconds * per_step))
    # What the profiled actions leave of a profiled step is the loop's own work (and the profiler's).
    totals["Lightning loop (unprofiled)"] += result.profiled_ms - sum(totals.values())
    for group, phase in GROUPS.items():
        beside = clock.profiled_plain_seconds[phase] if phase else []
        plain = sum(beside) * 1e3 / len(beside) if beside else 0.0
        result.groups[group] = (totals.get(group, 0.0), plain)
    result.items.sort(key=lambda item: -item[2])
    return result


OVERHEAD_COLUMNS = (("", "<54"), ("fit ms", ">9"), ("plain ms", ">10"), ("fit - plain", ">13"))


def format_overhead(result: OverheadResult, goal: float = 0.10) -> str:
    cfg = result.config
    rows = [
        (group, f"{fit:.2f}", f"{plain:.2f}", f"{fit - plain:+.2f}") for group, (fit, plain) in result.groups.items()
    ]
    fit_total = sum(fit for fit, _ in result.groups.values())
    plain_total = sum(plain for _, plain in result.groups.values())
    rows.append(("total (mean per step)", f"{fit_total:.2f}", f"{plain_total:.2f}", f"{fit_total - plain_total:+.2f}"))
    compute = {group for group, phase in GROUPS.items() if phase}
    loop_items = [item for item in result.items if item[0] not in compute][:6]
    overhead = result.ratio - 1
    lines = [
        f"Training loop benchmark: {result.description}; {cfg.repeats} steps and {cfg.repeats} profiled ones "
        f"after {cfg.warmup}",
        f"fit step {result.fit_ms:.2f} ms, plain step {result.plain_ms:.2f} ms ({STATISTIC_NAMES[cfg.statistic]}): "
        f"fit/plain {result.ratio:.3f}, the loop adds {overhead:.1%} (goal: at most {goal:.0%})",
        *fixed_width_lines(OVERHEAD_COLUMNS, rows),
        f"the table is of the profiled steps, {result.profiled_ms:.2f} ms on average against "
        f"{result.unprofiled_ms:.2f} ms without the profiler: its own work, "
        f"{result.profiled_ms - result.unprofiled_ms:+.2f} ms a step, is in the rows above and not in the ratio",
        "largest items outside the model's step (ms per step):",
        *(f"  {ms:7.3f}  {item}  [{group}]" for group, item, ms in loop_items),
    ]
    if overhead > goal and loop_items:
        group, item, ms = max(loop_items, key=lambda entry: entry[2])
        lines.append(f"over the goal: the biggest item is {item} ({group}), {ms:.2f} ms per step")
    return "\n".join(lines)
