"""Each use of Lightning's private API (sru_lightning._lightning_compat) against the installed
Lightning: a release that renames, removes or reshapes one fails here, naming the attribute."""

from __future__ import annotations

import inspect
import pickle

import lightning
import pytest
import torch
from helpers.tiny_trainer import tiny_trainer

from sru_lightning import _lightning_compat as compat


def require(owner, name: str, parameters: tuple[str, ...] | None = None, used_by=None):
    """`owner.name` exists (with these parameters after `self`, when given); else one line
    naming the Lightning attribute, the installed version and the function that relies on it."""
    where = f"{getattr(owner, '__module__', '')}.{getattr(owner, '__qualname__', owner.__class__.__qualname__)}"
    user = f"sru_lightning._lightning_compat.{used_by.__name__}" if used_by is not None else "sru_lightning"
    assert hasattr(owner, name), f"Lightning {lightning.__version__} has no `{where}.{name}` ({user} relies on it)"
    attribute = getattr(owner, name)
    if parameters is not None:
        found = tuple(p for p in inspect.signature(attribute).parameters if p != "self")
        assert found == parameters, (
            f"Lightning {lightning.__version__} changed the signature of `{where}.{name}`: "
            f"expected parameters {parameters}, found {found} ({user} relies on it)"
        )
    return attribute


def cpu_trainer():
    return tiny_trainer()


def test_set_received_sigterm_sets_what_the_trainer_reads():
    trainer = cpu_trainer()
    connector = require(trainer, "_signal_connector", used_by=compat.set_received_sigterm)
    require(connector, "received_sigterm", used_by=compat.set_received_sigterm)
    compat.set_received_sigterm(trainer, True)
    assert trainer.received_sigterm is True, "`Trainer.received_sigterm` no longer reads `_signal_connector`"
    compat.set_received_sigterm(trainer, False)
    assert trainer.received_sigterm is False


def test_the_loggers_write_the_steps_the_logger_connector_names():
    trainer = cpu_trainer()
    connector = require(trainer, "_logger_connector", used_by=compat.loggers_write_this_step)
    require(type(connector), "should_update_logs", used_by=compat.loggers_write_this_step)
    assert compat.loggers_write_this_step(trainer) is True  # outside a loop: every call writes
    trainer.log_every_n_steps = 0
    assert compat.loggers_write_this_step(trainer) is False


def test_the_trainer_call_frame_is_recognised():
    from lightning.pytorch.trainer import call

    function = require(call, "_call_and_handle_interrupt", used_by=compat.is_trainer_call_frame)
    assert compat.is_trainer_call_frame(function.__code__), (
        f"`lightning.pytorch.trainer.call._call_and_handle_interrupt` is no longer defined in "
        f"{compat.TRAINER_CALL_FILE}: {function.__code__.co_filename}"
    )
    assert not compat.is_trainer_call_frame(test_the_trainer_call_frame_is_recognised.__code__)


def test_skipped_dataloader_states_are_loaded_through_the_fit_loop():
    from lightning.pytorch.loops.fit_loop import _FitLoop

    require(_FitLoop, "_load_combined_loader_states", (), used_by=compat.load_skipped_dataloader_states)
    fit_loop = cpu_trainer().fit_loop
    states = require(fit_loop, "_combined_loader_states_to_load", used_by=compat.load_skipped_dataloader_states)
    assert states == [], "`_FitLoop._combined_loader_states_to_load` is no longer a list of saved states"
    compat.load_skipped_dataloader_states(fit_loop)  # nothing saved: nothing happens


@pytest.mark.parametrize("loop_name", ["fit_loop", "validate_loop", "test_loop"])
def test_a_loop_data_setup_runs_inside_the_wrapper_and_stays_picklable(loop_name):
    trainer = cpu_trainer()
    loop = getattr(trainer, loop_name)
    require(type(loop), "setup_data", (), used_by=compat.around_loop_setup_data)
    _SEEN.clear()
    with compat.around_loop_setup_data(loop, _record_around):
        pickle.dumps(loop.setup_data)  # spawn-based strategies pickle the trainer and its loops
        loop.setup_data()
    assert _SEEN == [type(loop).__name__], "the loop's `setup_data` did not run through the wrapper"
    assert "setup_data" not in loop.__dict__, "the loop keeps the wrapper after the context"


_SEEN: list[str] = []


def _record_around(loop, setup_data) -> None:
    assert callable(setup_data)
    _SEEN.append(type(loop).__name__)


def test_compiled_modules_are_told_by_the_compiler_context():
    module = lightning.pytorch.LightningModule()
    assert require(module, "_compiler_ctx", used_by=compat.compiled_by_lightning) is None
    assert not compat.compiled_by_lightning(module)
    from lightning.pytorch.utilities.compile import from_compiled

    compiled = torch.compile(lightning.pytorch.LightningModule())
    assert compat.compiled_by_lightning(from_compiled(compiled)), "`from_compiled` no longer sets `_compiler_ctx`"


def test_deepspeed_distributed_setup_of_the_trainer():
    from lightning.pytorch.strategies import DeepSpeedStrategy

    require(DeepSpeedStrategy, "_init_deepspeed_distributed", (), used_by=compat.init_deepspeed_distributed)


def test_deepspeed_distributed_setup_of_fabric():
    pytest.importorskip("deepspeed", reason="Fabric's DeepSpeedStrategy needs deepspeed")
    from lightning.fabric.strategies import DeepSpeedStrategy

    used_by = compat.fabric_deepspeed_setup_distributed_on_cpu
    for name in ("_set_world_ranks", "_init_deepspeed_distributed", "_format_config"):
        require(DeepSpeedStrategy, name, (), used_by=used_by)
    assert require(DeepSpeedStrategy(), "_config_initialized", used_by=used_by) is False


def test_the_trainer_fsdp_strategy_wraps_its_model_in_setup_model():
    from lightning.pytorch.strategies import FSDPStrategy

    require(FSDPStrategy, "_setup_model", ("model",), used_by=compat.FSDPModelSetupHook)
    assert "self._setup_model(" in inspect.getsource(FSDPStrategy.setup), (
        "`FSDPStrategy.setup` no longer wraps the model through `_setup_model` "
        "(sru_lightning._lightning_compat.FSDPModelSetupHook relies on it)"
    )


def test_the_trainer_fsdp_state_dict_type():
    from lightning.pytorch.strategies import FSDPStrategy

    for kind in ("full", "sharded"):
        strategy = FSDPStrategy(state_dict_type=kind)
        require(strategy, "_state_dict_type", used_by=compat.fsdp_state_dict_type)
        assert compat.fsdp_state_dict_type(strategy) == kind


def test_the_trainer_fsdp_full_state_dict_context_is_looked_up_at_call_time():
    import lightning.pytorch.strategies.fsdp as lightning_fsdp

    used_by = compat.full_state_dict_context_replaced
    original = require(lightning_fsdp, "_get_full_state_dict_context", used_by=used_by)
    parameters = tuple(inspect.signature(original).parameters)
    assert parameters[:2] == ("module", "world_size"), (
        f"`lightning.pytorch.strategies.fsdp._get_full_state_dict_context` takes {parameters}, "
        "expected (module, world_size, ...)"
    )
    strategy = lightning_fsdp.FSDPStrategy
    for method in (strategy.lightning_module_state_dict, strategy.optimizer_state):
        assert "_get_full_state_dict_context(" in inspect.getsource(method), (
            f"`FSDPStrategy.{method.__name__}` no longer calls `_get_full_state_dict_context` ({used_by.__name__})"
        )
    with compat.full_state_dict_context_replaced(_factory):
        assert lightning_fsdp._get_full_state_dict_context is _factory
    assert lightning_fsdp._get_full_state_dict_context is original


def _factory(*args, **kwargs):
    raise AssertionError("not called")


def test_fabric_fsdp_keeps_its_wrapper_arguments():
    from lightning.fabric.strategies import FSDPStrategy

    policy = {torch.nn.Linear}
    strategy = FSDPStrategy(auto_wrap_policy=policy, use_orig_params=True)
    kwargs = require(strategy, "_fsdp_kwargs", used_by=compat.fabric_fsdp_kwargs)
    assert compat.fabric_fsdp_kwargs(strategy) is kwargs
    assert kwargs.get("use_orig_params") is True and "auto_wrap_policy" in kwargs, (
        f"`lightning.fabric.strategies.FSDPStrategy._fsdp_kwargs` no longer holds the wrapper arguments: {kwargs}"
    )


@pytest.mark.parametrize("package", ["lightning.pytorch.strategies", "lightning.fabric.strategies"])
def test_all_data_parallel_becomes_every_process(package):
    import importlib

    strategy_class = importlib.import_module(package).ModelParallelStrategy
    # Fabric's class requires the function that parallelizes the module; the Trainer's has a hook.
    needs_function = "parallelize_fn" in inspect.signature(strategy_class).parameters
    strategy = strategy_class(
        **({"parallelize_fn": lambda module, mesh: module} if needs_function else {}), data_parallel_size="all"
    )
    assert require(strategy, "_data_parallel_size", used_by=compat.resolve_all_data_parallel) == "all"
    strategy.parallel_devices = [torch.device("cpu")] * 3
    strategy.num_nodes = 2
    compat.resolve_all_data_parallel(strategy)
    assert strategy._data_parallel_size == 6


def test_the_launchers_watcher_waits_after_a_lost_process_then_kills(monkeypatch):
    from lightning.fabric.strategies.launchers import subprocess_script

    observer = subprocess_script._ChildProcessObserver
    init = require(observer, "__init__", ("main_pid", "child_processes", "sleep_period"))
    require(observer, "_run", (), used_by=compat.give_the_launcher_time_after_a_lost_process)
    require(observer, "_terminate_all", (), used_by=compat.give_the_launcher_time_after_a_lost_process)
    assert init is not None
    monkeypatch.setattr(observer, "_run", observer._run)  # undone after the test
    compat.give_the_launcher_time_after_a_lost_process(0.2)

    class Process:
        returncode = -9
        pid = 123

        def poll(self):
            return self.returncode

    watcher = observer(main_pid=0, child_processes=[Process()])
    assert "_child_processes" in vars(watcher)
    killed = []
    monkeypatch.setattr(watcher, "_terminate_all", lambda: killed.append(True))
    assert watcher._run() is False and not killed, "the first sight of a failed process waits"
    import time

    time.sleep(0.25)
    assert watcher._run() is True and killed == [True], "after the grace period it kills as before"
