"""Where a run applies one of the user's settings, its refusal is a usage error.

A run applies the user's settings at a few known calls: reading the config's values, resolving
and reading `ckpt_path`, Hydra's `instantiate` of a config node (the data, the model, the
callbacks, the loggers and Lightning's Trainer, whose constructor checks its arguments), the
data module reading its text, and, inside the Trainer call before the first optimizer step,
the optimizer and schedule the model builds from its config and Lightning's check of the loop
settings against the data. Each is wrapped here so that its refusal becomes a
:class:`~sru_lightning.app.usage.UsageError`: one line naming the setting, exit status 2.

Anything raised anywhere else, whatever its class, is a failure of the run (exit status 1, its
traceback in the run's log): a bug of the package is never told as the user's mistake.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from sru_lightning._lightning_compat import around_loop_setup_data
from sru_lightning.app.usage import UsageError

from .checkpoints import CheckpointError
from .console import describe

__all__ = [
    "check_config_resolves",
    "checkpoint_setting",
    "data_setting",
    "instantiate_setting",
    "trainer_call_settings",
]


def check_config_resolves(cfg) -> None:
    """Every value of `cfg` can be read: an interpolation naming no key, or a resolver that fails,
    is refused here rather than failing wherever the value is first read."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as error:
        raise UsageError(describe(error, as_usage=True)) from error


def instantiate_setting(node, cfg=None, **kwargs: Any) -> Any:
    """Hydra's instantiate of the user's config `node`. Hydra wraps whatever the class raised
    when it refused its arguments (an unknown key, a bad value) or could not be found in an
    InstantiationException; that, or a value of the node that cannot be read, is a usage error
    naming the class. `cfg` (the whole config) lets the message say what to use instead of a
    GPU the machine lacks."""
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate
    from omegaconf.errors import OmegaConfBaseException

    try:
        return instantiate(node, **kwargs)
    except (InstantiationException, OmegaConfBaseException) as error:
        raise UsageError(describe(error, as_usage=True, cfg=cfg)) from error


@contextlib.contextmanager
def checkpoint_setting() -> Iterator[None]:
    """`ckpt_path` resolved and its checkpoint read: a CheckpointError says why it cannot serve."""
    try:
        yield
    except CheckpointError as error:
        raise UsageError(str(error)) from error


@contextlib.contextmanager
def data_setting() -> Iterator[None]:
    """The data module reads the user's text and checks it against the data settings. It says what
    is wrong with a ValueError (a missing or empty file, too little text for the batch layout,
    characters a checkpoint's vocabulary lacks), or the file system with an OSError."""
    try:
        yield
    except (ValueError, OSError) as error:
        raise UsageError(describe(error, as_usage=True)) from error


@contextlib.contextmanager
def trainer_call_settings(trainer, loop) -> Iterator[None]:
    """A Trainer call (fit, validate, test) whose main loop is `loop`.

    Before its first optimizer step the call applies two of the user's settings: the model
    builds `model.optimizer` and `model.lr_scheduler` with Hydra's instantiate (in
    `configure_optimizers`), and Lightning checks the loop settings against the data when the
    loop sets its data up (a `val_check_interval` longer than the epoch). Their refusals are
    usage errors while the trainer is at step 0; past it (a resumed fit included) they are
    failures, since the run already holds trained state.
    """
    from hydra.errors import InstantiationException

    try:
        with around_loop_setup_data(loop, _data_setup_checked):
            yield
    except InstantiationException as error:
        if trainer.global_step > 0:
            raise
        raise UsageError(describe(error, as_usage=True)) from error


def _data_setup_checked(loop, setup_data) -> None:
    """The loop's data setup, which asks the data module for the loop's loaders and where
    Lightning checks the trainer's loop settings against them (a ValueError or
    MisconfigurationException), with that refusal told as a usage error."""
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    try:
        setup_data()
    except (ValueError, MisconfigurationException) as error:
        if loop.trainer.global_step > 0:
            raise
        raise UsageError(describe(error, as_usage=True)) from error
