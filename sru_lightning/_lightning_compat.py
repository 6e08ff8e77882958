"""Every use of Lightning's private API in the package, one small function (or one-method mixin) each.

Lightning keeps no promise about names with a leading underscore, so each use lives here, with
what it relies on, and ``tests/test_lightning_compat.py`` checks each against the installed
Lightning: a release that renames or removes one fails there, naming the attribute, instead of
deep inside a fit. Where a public hook can do the job the package uses that instead (the
checkpoint's state key is :attr:`~lightning.pytorch.callbacks.Callback.state_key`; DeepSpeed's
engine is set up inside ``init_deepspeed`` and ``setup_module[_and_optimizers]``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from types import CodeType
from typing import Any

__all__ = [
    "FSDPModelSetupHook",
    "around_loop_setup_data",
    "compiled_by_lightning",
    "fabric_deepspeed_setup_distributed_on_cpu",
    "fabric_fsdp_kwargs",
    "fsdp_state_dict_type",
    "give_the_launcher_time_after_a_lost_process",
    "full_state_dict_context_replaced",
    "init_deepspeed_distributed",
    "is_trainer_call_frame",
    "load_skipped_dataloader_states",
    "resolve_all_data_parallel",
    "set_received_sigterm",
    "loggers_write_this_step",
]

TRAINER_CALL_FUNCTION = "_call_and_handle_interrupt"
TRAINER_CALL_FILE = "lightning/pytorch/trainer/call.py"


def set_received_sigterm(trainer: Any, received: bool) -> None:
    """Set what ``trainer.received_sigterm`` reads. Relies on the Trainer's private
    ``_signal_connector`` (a ``_SignalConnector``) and its ``received_sigterm`` attribute, which
    the public property returns and the training loop checks after each batch."""
    trainer._signal_connector.received_sigterm = received


def loggers_write_this_step(trainer: Any) -> bool:
    """Whether the loggers receive the training step's logged values once the step ends: every
    ``log_every_n_steps``-th step, the step a stop was requested at, or any step of a
    ``fast_dev_run``. Relies on the Trainer's private ``_logger_connector`` (a
    ``_LoggerConnector``) and its ``should_update_logs`` property, the test the training loop
    applies after ``on_train_batch_end``."""
    return bool(trainer._logger_connector.should_update_logs or trainer.fast_dev_run)


def is_trainer_call_frame(code: CodeType) -> bool:
    """Whether `code` is the function every Trainer entry point (fit, validate, test, predict)
    runs through, with its exception handling: ``_call_and_handle_interrupt`` in
    ``lightning/pytorch/trainer/call.py`` (a private function, recognised by name and file)."""
    return code.co_name == TRAINER_CALL_FUNCTION and code.co_filename.replace("\\", "/").endswith(TRAINER_CALL_FILE)


def load_skipped_dataloader_states(fit_loop: Any) -> None:
    """Hand the checkpointed states of the training dataloaders to them if Lightning has not.
    Relies on ``_FitLoop._combined_loader_states_to_load`` (the states read from the checkpoint,
    emptied once applied) and ``_FitLoop._load_combined_loader_states()``, which applies them."""
    if fit_loop.restarting and getattr(fit_loop, "_combined_loader_states_to_load", None):
        fit_loop._load_combined_loader_states()


@contextlib.contextmanager
def around_loop_setup_data(loop: Any, around: Callable[[Any, Callable[[], None]], None]) -> Iterator[None]:
    """Within the context, `loop`'s ``setup_data()`` runs as ``around(loop, setup_data)``.
    Relies on the loops' (``_FitLoop``, ``_EvaluationLoop``) undocumented ``setup_data()``
    method, where the loaders are requested and the loop settings are checked against them, and
    on the Trainer calling it on the loop instance. `around` must be picklable (spawn-based
    strategies pickle the trainer and its loops)."""
    loop.setup_data = _SetupDataAround(loop, around)
    try:
        yield
    finally:
        loop.__dict__.pop("setup_data", None)


class _SetupDataAround:
    """A class rather than a closure, so the trainer stays picklable."""

    def __init__(self, loop: Any, around: Callable[[Any, Callable[[], None]], None]) -> None:
        self.loop = loop
        self.around = around

    def __call__(self) -> None:
        loop = self.loop
        self.around(loop, lambda: type(loop).setup_data(loop))


def compiled_by_lightning(pl_module: Any) -> bool:
    """Whether `pl_module` was compiled with ``torch.compile`` and handed to the Trainer (which
    unwraps it). Relies on ``LightningModule._compiler_ctx``, set by Lightning when it unwraps."""
    return getattr(pl_module, "_compiler_ctx", None) is not None


def init_deepspeed_distributed(strategy: Any) -> None:
    """Start DeepSpeed's process group as ``DeepSpeedStrategy.setup_distributed`` does, without
    its CUDA device-index check. Relies on the Trainer's ``DeepSpeedStrategy._init_deepspeed_distributed()``."""
    strategy._init_deepspeed_distributed()


def fabric_deepspeed_setup_distributed_on_cpu(strategy: Any) -> None:
    """Fabric's ``DeepSpeedStrategy._setup_distributed`` without its CUDA device-index check.
    Relies on Fabric's private ``_set_world_ranks()``, ``_init_deepspeed_distributed()``,
    ``_config_initialized`` and ``_format_config()``, in the order Fabric calls them."""
    strategy._set_world_ranks()
    strategy._init_deepspeed_distributed()
    if not strategy._config_initialized:
        strategy._format_config()
        strategy._config_initialized = True


class FSDPModelSetupHook:
    """Mixin before the Trainer's ``FSDPStrategy``: ``before_fsdp_wrap(model)`` and
    ``after_fsdp_wrap(model)`` run around Lightning's wrapping of the model. Relies on
    ``FSDPStrategy._setup_model(model)``, the one place Lightning wraps it (from ``setup``)."""

    def _setup_model(self, model: Any) -> Any:
        model = self.before_fsdp_wrap(model)
        return self.after_fsdp_wrap(super()._setup_model(model))

    def before_fsdp_wrap(self, model: Any) -> Any:
        return model

    def after_fsdp_wrap(self, model: Any) -> Any:
        return model


def fsdp_state_dict_type(strategy: Any) -> str:
    """The Trainer's ``FSDPStrategy(state_dict_type=...)`` ("full" or "sharded"). Relies on the
    private attribute ``FSDPStrategy._state_dict_type``, where the constructor keeps it."""
    return strategy._state_dict_type


@contextlib.contextmanager
def full_state_dict_context_replaced(factory: Callable[..., Any]) -> Iterator[None]:
    """Within the context, the Trainer's ``FSDPStrategy`` gathers a full state dict inside
    ``factory(module, world_size=...)`` rather than its own context. Relies on the private module
    function ``lightning.pytorch.strategies.fsdp._get_full_state_dict_context``, which the
    strategy's ``lightning_module_state_dict`` and ``optimizer_state`` look up at call time."""
    import lightning.pytorch.strategies.fsdp as lightning_fsdp

    original = lightning_fsdp._get_full_state_dict_context
    lightning_fsdp._get_full_state_dict_context = factory
    try:
        yield
    finally:
        lightning_fsdp._get_full_state_dict_context = original


def fabric_fsdp_kwargs(strategy: Any) -> dict[str, Any]:
    """The keyword arguments Fabric's ``FSDPStrategy`` passes to ``FullyShardedDataParallel``
    (the auto-wrap policy included). Relies on its private attribute ``_fsdp_kwargs``."""
    return strategy._fsdp_kwargs


def resolve_all_data_parallel(strategy: Any) -> None:
    """``data_parallel_size="all"`` of a ``ModelParallelStrategy`` (Trainer or Fabric) becomes
    every process. Relies on the private attribute ``_data_parallel_size``, where the
    constructor keeps the setting and ``setup_environment`` reads it to build the device mesh."""
    if strategy._data_parallel_size == "all":
        strategy._data_parallel_size = strategy.num_nodes * strategy.num_processes


def give_the_launcher_time_after_a_lost_process(grace_seconds: float) -> None:
    """Let the launching process report a rank that died before Lightning's watcher kills it.

    Lightning's script launcher (rank 0 starts the other ranks as subprocesses) runs a watcher
    thread, the private ``_ChildProcessObserver`` of
    ``lightning.fabric.strategies.launchers.subprocess_script``: every ``_sleep_period`` seconds
    its ``_run`` polls ``_child_processes``, and when one has exited with an error it sends
    SIGKILL to them and to the launching process at once. The launching process also learns of
    the loss from its next collective and ends with one line naming the rank, unless that kill
    comes first. After this call the watcher kills only once `grace_seconds` have passed since it
    first saw the failed process (it still ends a launching process that hangs). Idempotent."""
    from lightning.fabric.strategies.launchers import subprocess_script

    observer = subprocess_script._ChildProcessObserver
    if getattr(observer._run, "grace_seconds", None) is not None:
        observer._run.grace_seconds = grace_seconds
        return
    original = observer._run

    def _run(self) -> bool:
        for process in self._child_processes:
            process.poll()
        if any(process.returncode for process in self._child_processes):
            first_seen = self.__dict__.setdefault("failure_first_seen", time.monotonic())
            if time.monotonic() - first_seen < _run.grace_seconds:
                return False
        return original(self)

    _run.grace_seconds = grace_seconds
    observer._run = _run
