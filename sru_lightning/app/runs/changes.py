"""One rule for settings that differ from the run a command continues or evaluates.

A command that starts from a run's checkpoint (`fit` resuming it, `validate`, `test`) takes
the run's own configuration (the one saved with the checkpoint, :mod:`.folder`) and puts on
top only what the command line sets. Every setting the command line changes against the run
is looked up in :data:`RULES`, in order, first match wins:

* ``apply``: the setting takes effect and the attempt records it as a change (`changes` in
  result.json and history.jsonl, and one line on the console);
* ``refuse``: the command stops before it starts, in one line naming the setting and both
  values;
* ``unused``: (evaluation only) accepted and said to take no part (training-only settings).

The callbacks, the loggers and the thread count are the attempt's own (:data:`PER_ATTEMPT`):
they watch and record an attempt rather than define the run, so each attempt takes them from
its command line as composed. A resumed `fit` keeps the run's callbacks that hold part of its
state in the checkpoint (:data:`RUN_CALLBACKS`, the weight average) when its command line
leaves them out, and changes to their settings are judged like any other setting.

`fit` applies what Lightning rebuilds from the config anyway (Trainer arguments, callbacks,
loggers, dropout) and, through :class:`ApplyResumeChanges`, what a restored optimizer state
would otherwise overwrite (the learning rate and weight decay, the schedule's length). It
refuses what the checkpoint's state cannot follow: the architecture, the schedule's shape,
and the data (its token stream and batch layout are the data position being resumed).
"""

from __future__ import annotations

import fnmatch
import logging
from dataclasses import dataclass
from typing import Any

from lightning.pytorch.callbacks import Callback

from sru_lightning.app.usage import UsageError

log = logging.getLogger("sru_lightning")

APPLY, REFUSE, UNUSED = "apply", "refuse", "unused"


@dataclass(frozen=True)
class Rule:
    """What happens to a setting matching `pattern` (fnmatch on its dotted key)."""

    pattern: str
    on_fit: str
    on_evaluate: str
    why: str = ""


# Settings whose change moves the end of the learning-rate schedule.
SCHEDULE_LENGTH_KEYS = (
    "trainer.max_steps",
    "trainer.max_epochs",
    "trainer.limit_train_batches",
    "trainer.accumulate_grad_batches",
)
# Optimizer settings that are a number in each parameter group.
OPTIMIZER_GROUP_KEYS = ("lr", "weight_decay")

RULES: tuple[Rule, ...] = (
    Rule("model.optimizer.lr", APPLY, UNUSED),
    Rule("model.optimizer.weight_decay", APPLY, UNUSED),
    Rule(
        "model.optimizer*", REFUSE, UNUSED, "the checkpoint's optimizer state belongs to the optimizer it trained with"
    ),
    Rule(
        "model.lr_scheduler*", REFUSE, UNUSED, "the checkpoint's schedule state belongs to the schedule it trained with"
    ),
    Rule("model.net.dropout", APPLY, UNUSED),
    Rule("model.net.rnn_dropout", APPLY, UNUSED),
    Rule("model.net.time_shared_dropout", APPLY, UNUSED),
    Rule("model.net.sru_options.attn_dropout", APPLY, UNUSED),
    # How the model runs, not what it computes: the same weights train and evaluate either way.
    Rule("model.compile", APPLY, APPLY),
    Rule("model*", REFUSE, REFUSE, "the weights belong to the model they were trained as"),
    Rule("data.eval_batch_size", APPLY, APPLY),
    Rule("data*", REFUSE, APPLY, "a resumed fit continues the run's token stream at its saved position"),
    Rule("trainer*", APPLY, APPLY),
    # The average's settings: how later steps are averaged; the checkpoint's average goes on.
    Rule("callbacks.weight_average*", APPLY, UNUSED),
    Rule("seed", APPLY, APPLY),
)
_UNLISTED = Rule("*", REFUSE, REFUSE, "the package has no rule for changing it")


def rule_for(key: str) -> Rule:
    return next((rule for rule in RULES if fnmatch.fnmatchcase(key, rule.pattern)), _UNLISTED)


@dataclass(frozen=True)
class Change:
    """A setting the command line changed against the run: dotted key, the run's value, the new one."""

    key: str
    before: Any
    after: Any
    action: str

    def as_record(self) -> dict[str, Any]:
        return {"from": self.before, "to": self.after, "action": self.action}

    def __str__(self) -> str:
        return f"{self.key}: {_shown(self.before)} -> {_shown(self.after)}"


_ABSENT = "<not set>"


def _shown(value: Any) -> str:
    return _ABSENT if value is _MISSING else repr(value)


_MISSING = object()


# --------------------------------------------------------------------------------------------
# the run's config with the command line on top
#: Config groups whose options write into other sections (`# @package _global_`).
GLOBAL_GROUPS = ("experiment", "hparams_search", "debug")


def keys_set_by(group: str, option: str) -> set[str]:
    """The dotted keys an option of a global group sets: the sections whose group it chooses in
    its defaults list (`override /model: sru_large`), and every key it writes; "*" when the
    option cannot be read."""
    from omegaconf import OmegaConf

    from sru_lightning._resources import conf_dir

    try:
        content = OmegaConf.to_container(OmegaConf.load(conf_dir() / group / f"{option}.yaml"), resolve=False)
    except Exception:  # unknown to us (a user's search path): everything may change
        return {"*"}
    keys = set()
    for entry in content.pop("defaults", None) or []:
        if isinstance(entry, dict):
            keys.update(name.split("/")[-1].strip() for name in entry if not name.startswith("_"))
    content.pop("hydra", None)
    keys.update(_leaves(content))
    return keys


def explicit_keys(overrides: list[str]) -> tuple[set[str], set[str]]:
    """(keys set or added, keys deleted) by the command line's overrides. A config group chosen
    by name (`model=lstm`) sets its whole section; an experiment sets everything."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    touched: set[str] = set()
    deleted: set[str] = set()
    for item in overrides:
        if item.startswith("-") or ("=" not in item and not item.startswith("~")):
            continue
        try:
            override = parser.parse_override(item)
        except Exception:  # refused by the CLI before Hydra composed anything
            continue
        key = override.key_or_group
        if key in GLOBAL_GROUPS:  # a group that sets keys all over: the keys its option sets
            touched |= keys_set_by(key, str(override.value()))
        elif override.is_delete():
            deleted.add(key)
        else:
            touched.add(key)
    return touched, deleted


#: Sections every attempt takes from its own command line, not from the run: the tools that
#: watch and record an attempt, and its process settings. They are applied as composed.
PER_ATTEMPT = ("callbacks", "logger", "threads", "ckpt_path", "resume_dir", "optimized_metric")

#: Callbacks (their keys under `callbacks:`) whose state is part of the run: its checkpoints hold
#: the weight average as the model and the trained weights for the callback to put back, so a
#: resumed fit without it would train on from the average. A resumed fit keeps them.
RUN_CALLBACKS = ("weight_average",)


def merged_config(saved, cfg, overrides: list[str], keep_run_callbacks: bool = False):
    """The run's saved config with the settings the command line names taken from `cfg`
    (and the per-attempt sections, :data:`PER_ATTEMPT`, taken from `cfg` whole). With
    `keep_run_callbacks` (a resumed fit), the run's :data:`RUN_CALLBACKS` that `cfg` leaves out
    are kept as the run had them."""
    from omegaconf import OmegaConf, open_dict

    touched, deleted = explicit_keys(overrides)
    if "*" in touched:
        return cfg
    merged = OmegaConf.create(OmegaConf.to_container(saved, resolve=False))
    for key in PER_ATTEMPT:
        with open_dict(merged):
            if key in cfg:
                merged[key] = (
                    OmegaConf.to_container(cfg[key], resolve=False) if OmegaConf.is_config(cfg[key]) else cfg[key]
                )
            elif key in merged:
                del merged[key]
    if keep_run_callbacks:
        _keep_run_callbacks(saved, merged)
    for key in sorted(touched):
        if key.split(".")[0] in PER_ATTEMPT:
            continue
        value = OmegaConf.select(cfg, key, default=_MISSING)
        if value is _MISSING:
            continue
        if OmegaConf.is_config(value):
            value = OmegaConf.to_container(value, resolve=False)
        with open_dict(merged):
            OmegaConf.update(merged, key, value, merge=False, force_add=True)
    for key in sorted(deleted):
        parent_key, _, leaf = key.rpartition(".")
        parent = OmegaConf.select(merged, parent_key) if parent_key else merged
        if parent is not None and OmegaConf.is_dict(parent) and leaf in parent:
            with open_dict(parent):
                del parent[leaf]
    return merged


def _keep_run_callbacks(saved, merged) -> None:
    from omegaconf import OmegaConf, open_dict

    for name in RUN_CALLBACKS:
        node = OmegaConf.select(saved, f"callbacks.{name}", default=None)
        if node is None or OmegaConf.select(merged, f"callbacks.{name}", default=None) is not None:
            continue
        with open_dict(merged):
            if not OmegaConf.is_dict(merged.get("callbacks")):
                merged.callbacks = {}
            merged.callbacks[name] = OmegaConf.to_container(node, resolve=False)


def kept_run_callbacks(cfg, merged) -> list[str]:
    """The :data:`RUN_CALLBACKS` that `merged` keeps from the run and the command line's `cfg` left out."""
    from omegaconf import OmegaConf

    return [
        name
        for name in RUN_CALLBACKS
        if OmegaConf.select(merged, f"callbacks.{name}", default=None) is not None
        and OmegaConf.select(cfg, f"callbacks.{name}", default=None) is None
    ]


def _leaves(container: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(container, dict):
        found: dict[str, Any] = {}
        for key, value in container.items():
            found.update(_leaves(value, f"{prefix}.{key}" if prefix else str(key)))
        if not container and prefix:
            found[prefix] = {}
        return found
    return {prefix: container}


def differences(saved, merged, run_callbacks: bool = False) -> list[tuple[str, Any, Any]]:
    """(key, saved value, new value) for every leaf setting that differs (unresolved values);
    with `run_callbacks`, the settings of :data:`RUN_CALLBACKS` too."""
    from omegaconf import OmegaConf

    before = _leaves(OmegaConf.to_container(saved, resolve=False))
    after = _leaves(OmegaConf.to_container(merged, resolve=False))
    kept = tuple(f"callbacks.{name}." for name in RUN_CALLBACKS) if run_callbacks else ()
    found = []
    for key in sorted(set(before) | set(after)):
        if key.split(".")[0] in (*PER_ATTEMPT, "hydra") and not key.startswith(kept):
            continue
        old, new = before.get(key, _MISSING), after.get(key, _MISSING)
        if old != new:
            found.append((key, old, new))
    return found


def judge(saved, merged, command: str, checkpoint: str, checkpoint_step: int) -> list[Change]:
    """The changes `merged` makes to the run's `saved` config, each applied or refused by its rule.

    Raises UsageError naming the first refused setting and both its values.
    """
    evaluating = command != "fit"
    changes = []
    for key, before, after in differences(saved, merged, run_callbacks=not evaluating):
        rule = rule_for(key)
        action = rule.on_evaluate if evaluating else rule.on_fit
        change = Change(key, before, after, action)
        if action == REFUSE:
            verb = "evaluated" if evaluating else "resumed"
            raise UsageError(
                f"`{key}` cannot change when a run is {verb}: {checkpoint!r} was trained with {key}="
                f"{_shown(before)}, this {command} asks for {key}={_shown(after)} ({rule.why}); leave it out, or "
                + (
                    "start a new run: another hydra.run.dir, without ckpt_path"
                    if not evaluating
                    else "evaluate a run trained with it"
                )
            )
        changes.append(change)
    if not evaluating:
        _check_step_limit(merged, checkpoint, checkpoint_step)
    return changes


def _check_step_limit(merged, checkpoint: str, checkpoint_step: int) -> None:
    from omegaconf import OmegaConf

    max_steps = OmegaConf.select(merged, "trainer.max_steps", default=-1)
    # Equal is a finished run started again (a requeue): it validates its final weights and ends.
    if isinstance(max_steps, int) and not isinstance(max_steps, bool) and 0 <= max_steps < checkpoint_step:
        raise UsageError(
            f"`trainer.max_steps` must be at least the step the run is resumed at, got {max_steps}, and "
            f"{checkpoint!r} holds step {checkpoint_step}: the run is already past it; raise trainer.max_steps "
            "(or evaluate the run with validate)"
        )


def schedule_can_follow(merged) -> bool:
    """True when the run's schedule can be stretched to a new length (none, or WarmupCosineLR)."""
    from omegaconf import OmegaConf

    target = OmegaConf.select(merged, "model.lr_scheduler._target_", default=None)
    return target is None or str(target).endswith("WarmupCosineLR")


def refuse_unfollowable(changes: list[Change], merged, checkpoint: str) -> None:
    """A change of the run's length under a schedule that cannot be stretched is refused."""
    for change in changes:
        if change.key in SCHEDULE_LENGTH_KEYS and not schedule_can_follow(merged):
            raise UsageError(
                f"`{change.key}` cannot change when {checkpoint!r} is resumed: its learning-rate schedule "
                f"({merged.model.lr_scheduler._target_}) cannot be stretched to a new length; leave it out"
            )


# --------------------------------------------------------------------------------------------
# applying what a restored optimizer state would overwrite
class ApplyResumeChanges(Callback):
    """After Lightning restored the optimizer and schedule from the checkpoint (before the first
    resumed step), put the changed optimizer settings into every parameter group and stretch
    the schedule to the resumed fit's length."""

    def __init__(self, optimizer_settings: dict[str, float], restretch: bool) -> None:
        super().__init__()
        self.optimizer_settings = optimizer_settings
        self.restretch = restretch

    def on_train_start(self, trainer, pl_module) -> None:
        import math

        for config in trainer.lr_scheduler_configs:
            scheduler = config.scheduler
            if self.restretch and hasattr(scheduler, "total_steps"):
                estimate = trainer.estimated_stepping_batches
                scheduler.total_steps = max(1, int(estimate)) if math.isfinite(estimate) else None
        for optimizer in trainer.optimizers:
            schedulers = [c.scheduler for c in trainer.lr_scheduler_configs if c.scheduler.optimizer is optimizer]
            peaks = [
                self.optimizer_settings.get("lr", group.get("initial_lr", group["lr"]))
                for group in optimizer.param_groups
            ]
            for group, peak in zip(optimizer.param_groups, peaks):
                for name, value in self.optimizer_settings.items():
                    group[name] = value
                group["initial_lr"] = peak
            for scheduler in schedulers:
                scheduler.base_lrs = list(peaks)
                factor = getattr(scheduler, "factor", None)  # WarmupCosineLR: the rate at any step
                if callable(factor):
                    scale = factor(max(0, scheduler.last_epoch))
                    for group, peak in zip(optimizer.param_groups, peaks):
                        group["lr"] = peak * scale
                scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]
        applied = [f"{name}={value:g}" for name, value in self.optimizer_settings.items()]
        if self.restretch:
            applied.append("the learning-rate schedule stretched to the new length")
        log.info("Resumed with changed settings applied to the restored optimizer: %s", ", ".join(applied))


def resume_callback(changes: list[Change]) -> ApplyResumeChanges | None:
    """The callback that applies `changes` to the restored state, None when none needs it."""
    settings = {}
    for change in changes:
        name = change.key.removeprefix("model.optimizer.")
        if change.key.startswith("model.optimizer.") and name in OPTIMIZER_GROUP_KEYS:
            settings[name] = float(change.after)
    restretch = any(change.key in SCHEDULE_LENGTH_KEYS for change in changes)
    if not settings and not restretch:
        return None
    return ApplyResumeChanges(settings, restretch)
