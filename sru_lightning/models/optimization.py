"""The optimizer and learning-rate schedule of a model, built in one place.

:func:`configure_optimizers` takes the network, the optimizer and scheduler settings (a
``_target_`` mapping as Hydra writes it, or a callable such as a ``functools.partial``) and the
trainer's estimate of the run's optimizer steps, and returns what Lightning's
``configure_optimizers`` returns. A plain torch optimizer receives ``params=``; an optimizer
factory whose signature names ``named_params`` receives the network's
``list(named_parameters())`` instead, so it can treat parameters by name (the embedding and the
output layer apart from the matrices inside).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import nn

__all__ = [
    "DEFAULT_OPTIMIZER",
    "FLOAT16_SAFE_EPS",
    "SCHEDULER_KEYS",
    "TOTAL_STEP_KEYS",
    "check_factory_setting",
    "configure_optimizers",
    "drop_filled_step_counts",
]

#: The optimizer of a model given none.
DEFAULT_OPTIMIZER = {"_target_": "torch.optim.Adam", "lr": 1e-3}
#: What each `_target_` setting builds, for the message that asks for one.
_TARGET_EXAMPLES = {
    "optimizer": {"_target_": "torch.optim.AdamW", "lr": 3e-3},
    "lr_scheduler": {"_target_": "torch.optim.lr_scheduler.StepLR", "step_size": 1000},
}
#: Keys of a scheduler mapping that are Lightning's (how often it steps), not the scheduler's.
SCHEDULER_KEYS = ("interval", "frequency", "monitor", "strict", "name")
#: Scheduler arguments that, set to null, are filled with the run's number of optimizer steps.
TOTAL_STEP_KEYS = ("total_steps", "T_max")
_DERIVED_FROM_TOTAL_STEPS = ("_schedule_phases",)  # OneCycleLR's phase boundaries


def check_factory_setting(owner: str, name: str, value: Any) -> None:
    """`value` is None, a callable, or a mapping whose `_target_` names what to build."""
    if value is None or callable(value) or (isinstance(value, Mapping) and "_target_" in value):
        return
    raise ValueError(
        f"{owner}: `model.{name}` must be a mapping whose `_target_` names the class to build "
        f"(e.g. {_TARGET_EXAMPLES[name]}) or a callable, got {value!r}"
    )


def _factory(config: Any) -> Callable | None:
    """The callable a setting calls: itself, or the class / function its `_target_` names."""
    if callable(config):
        return config
    from hydra.utils import get_object

    try:
        return get_object(str(config["_target_"]))
    except Exception:  # instantiate reports an unknown target in its own words
        return None


def _accepts(factory: Callable | None, name: str) -> bool:
    if factory is None:
        return False
    try:
        parameters = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # a builtin without a signature
        return False
    return name in parameters


def _build(config: Any, **bound) -> Any:
    """Instantiate a `_target_` mapping (Hydra style) or call a factory such as a partial.

    The bound arguments are passed to the factory as they are (Hydra would turn a list of
    ``(name, parameter)`` pairs into a config node of its own)."""
    if callable(config):
        return config(**bound)
    from hydra.utils import instantiate

    if "named_params" not in bound:
        return instantiate(config, **bound)
    factory = instantiate(config, _partial_=True)
    try:
        return factory(**bound)
    except Exception as error:  # told like instantiate's own errors: the target, then the cause
        from hydra.errors import InstantiationException

        raise InstantiationException(f"Error in call to target '{config['_target_']}':\n{error!r}") from error


def build_optimizer(network: nn.Module, config: Any) -> torch.optim.Optimizer:
    """The optimizer `config` builds over `network`'s parameters: ``named_params=`` (the network's
    named parameters) when its factory takes them, else ``params=``."""
    if _accepts(_factory(config), "named_params"):
        optimizer = _build(config, named_params=list(network.named_parameters()))
    else:
        optimizer = _build(config, params=network.parameters())
    make_eps_safe_for_float16(optimizer)
    return optimizer


def configure_optimizers(
    network: nn.Module,
    optimizer: Any = None,
    lr_scheduler: Any = None,
    step_estimate: float | Callable[[], float] = math.inf,
    strategy: Any = None,
) -> dict[str, Any]:
    """Lightning's ``configure_optimizers`` result: ``{"optimizer": ..., "lr_scheduler": {...}}``.

    Args:
        network: whose parameters are optimised.
        optimizer: a `_target_` mapping or a callable taking `params` (or `named_params`);
            None: :data:`DEFAULT_OPTIMIZER`.
        lr_scheduler: None, or a `_target_` mapping / callable taking `optimizer`; Lightning keys
            (:data:`SCHEDULER_KEYS`) may sit in the mapping. `total_steps` or `T_max` set to null
            are filled with `step_estimate`.
        step_estimate: the trainer's estimate of the run's optimizer steps
            (``trainer.estimated_stepping_batches``), or a callable giving it; infinite when the
            run has no step limit.
        strategy: the trainer's strategy; an optimizer that runs only under some engines (it
            has a ``refuse_strategy(strategy)`` method, like
            :class:`~sru_lightning.models.muon.MuonAdamW`) refuses the others here.
    """
    built = build_optimizer(network, optimizer if optimizer is not None else dict(DEFAULT_OPTIMIZER))
    refuse = getattr(built, "refuse_strategy", None)
    if strategy is not None and callable(refuse):
        refuse(strategy)
    if lr_scheduler is None:
        return {"optimizer": built}
    if callable(lr_scheduler):
        return {"optimizer": built, "lr_scheduler": lr_scheduler(optimizer=built)}
    settings = dict(lr_scheduler)
    lightning_keys = {key: settings.pop(key) for key in SCHEDULER_KEYS if key in settings}
    for key in TOTAL_STEP_KEYS:
        if key in settings and settings[key] is None:
            estimate = step_estimate() if callable(step_estimate) else step_estimate
            settings[key] = total_optimizer_steps(estimate, settings, key)
    scheduler = _build(settings, optimizer=built)
    return {"optimizer": built, "lr_scheduler": {"scheduler": scheduler, **lightning_keys}}


def total_optimizer_steps(estimate: float, settings: Mapping[str, Any], key: str) -> int | None:
    """The run's optimizer steps for the scheduler argument `key`; None (announced) when the run
    is unbounded and the schedule can do without (WarmupCosineLR), else refused."""
    if math.isfinite(estimate):
        return max(1, int(estimate))
    if str(settings.get("_target_")).endswith("WarmupCosineLR"):
        from .schedules import FALLBACK_WARMUP_STEPS

        warmup = settings.get("fallback_warmup_steps", FALLBACK_WARMUP_STEPS)
        rank_zero_info(
            "The number of optimizer steps is unknown (max_time or max_epochs=-1): with trainer.max_time "
            "and the TimeBudget callback (callbacks.time_budget, on by default) the learning rate warms up "
            f"and decays over the time budget; without them it warms up over {warmup} steps, then stays "
            "at its peak (set trainer.max_steps or trainer.max_epochs for a schedule over steps)"
        )
        return None
    raise ValueError(
        f"SRULanguageModel: `model.lr_scheduler.{key}` is null (fill in the run's step count), but "
        "the run has no step limit (max_time or max_epochs=-1); set trainer.max_steps, or set "
        f"model.lr_scheduler.{key} to a number, or use the default WarmupCosineLR schedule"
    )


def drop_filled_step_counts(lr_scheduler: Any, checkpoint: dict[str, Any]) -> None:
    """A step budget filled in from the trainer belongs to this run (a resumed fit may run more
    epochs): drop the checkpoint's, so the freshly computed one stays."""
    if not isinstance(lr_scheduler, Mapping):
        return
    filled = [key for key in TOTAL_STEP_KEYS if key in lr_scheduler and lr_scheduler[key] is None]
    if not filled:
        return
    for state in checkpoint.get("lr_schedulers", []):
        for key in (*filled, *_DERIVED_FROM_TOTAL_STEPS):
            state.pop(key, None)


#: Adam-style `eps` below this is zero (or subnormal) in float16, where `sqrt(v) + eps` of a
#: parameter whose squared gradient underflowed then divides by zero.
FLOAT16_SAFE_EPS = 1e-4


def make_eps_safe_for_float16(optimizer: torch.optim.Optimizer) -> None:
    """Raise `eps` of float16 parameter groups (`16-true`) to a value float16 represents."""
    for group in optimizer.param_groups:
        eps = group.get("eps")
        if not isinstance(eps, float) or eps >= FLOAT16_SAFE_EPS:
            continue
        if any(param.dtype == torch.float16 for param in group["params"]):
            group["eps"] = FLOAT16_SAFE_EPS
            rank_zero_info(
                f"{type(optimizer).__name__}: eps raised from {eps:g} to {FLOAT16_SAFE_EPS:g} for float16 "
                f"parameters ({eps:g} rounds to {float(torch.tensor(eps, dtype=torch.float16)):g} in float16, "
                "which turns the update of a parameter with a tiny gradient into inf/NaN)"
            )
