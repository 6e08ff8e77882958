"""The Trainer of a run: its loggers, the plugins every run has, the checks of the model and the
optimizer against the strategy, and the thread count, all before Lightning launches a rank."""

from __future__ import annotations

from typing import Any

from sru_lightning._lightning_compat import give_the_launcher_time_after_a_lost_process
from sru_lightning.app.usage import UsageError

from .folder import RunFolder
from .interfaces import ChecksSizes, provides
from .refusals import data_setting, instantiate_setting
from .threads import set_thread_count

__all__ = ["LOST_PROCESS_GRACE_S", "build_loggers", "build_trainer"]

#: Seconds the launching process has to report a rank that died before Lightning's launcher
#: kills it (it still ends a launching process that hangs).
LOST_PROCESS_GRACE_S = 20


def build_loggers(cfg) -> list:
    return [instantiate_setting(node) for node in (cfg.get("logger") or {}).values() if node is not None]


def build_trainer(cfg, command: str, model, datamodule, callbacks: list, loggers: list):
    """The Trainer of `cfg.trainer` with `callbacks` and `loggers`; what it cannot run is refused here."""
    # A rank that dies is reported by this process in one line (runs/outcomes.py): Lightning's
    # launcher kills it only if it has not ended by itself this long after.
    give_the_launcher_time_after_a_lost_process(LOST_PROCESS_GRACE_S)
    trainer = instantiate_setting(
        cfg.trainer, cfg=cfg, callbacks=callbacks, logger=loggers or False, **_run_plugins(cfg)
    )
    _check_compile_fits_strategy(model, trainer)
    if command == "fit":
        _check_optimizer_fits_strategy(cfg.model.get("optimizer"), trainer)
    set_thread_count(cfg.get("threads"), trainer.num_devices)  # before Lightning launches the other ranks
    if provides(datamodule, ChecksSizes):  # too little text for the batch layout: say so before training
        with data_setting():
            datamodule.check_sizes(world_size=trainer.world_size)
    return trainer


def _check_optimizer_fits_strategy(optimizer_config, trainer) -> None:
    """An optimizer that runs under some engines only (its class has ``refuse_strategy``, like
    MuonAdamW) refuses the others before the run starts, in the user's terms."""
    if not hasattr(optimizer_config, "get") or not optimizer_config.get("_target_"):
        return
    from hydra.utils import get_object

    try:
        refuse = getattr(get_object(str(optimizer_config["_target_"])), "refuse_strategy", None)
    except Exception:  # an unknown target: the model's instantiation reports it in its own words
        return
    if callable(refuse):
        try:
            refuse(trainer.strategy)
        except ValueError as error:
            raise UsageError(str(error)) from None


def _check_compile_fits_strategy(model, trainer) -> None:
    """`model.compile` under a strategy Lightning runs no compiled model with is refused before the
    run starts; Lightning's own check comes inside the Trainer call, where it would be a failure."""
    from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy, FSDPStrategy, SingleDeviceStrategy

    setting = (getattr(model, "hparams", None) or {}).get("compile", False)
    strategy = trainer.strategy
    # Lightning's rule (lightning.pytorch.utilities.compile): these strategies, DeepSpeed excepted.
    supported = isinstance(strategy, (SingleDeviceStrategy, DDPStrategy, FSDPStrategy))
    if setting is False or (supported and not isinstance(strategy, DeepSpeedStrategy)):
        return
    raise UsageError(
        f"`model.compile` must be false with trainer.strategy={type(strategy).__name__} (Lightning runs compiled "
        f"models only with a single-device, DDP or FSDP strategy), got model.compile={setting!r}; set "
        "model.compile=false or choose another trainer"
    )


def _run_plugins(cfg) -> dict[str, Any]:
    """The Trainer plugins every run has (unless the config names its own `trainer.plugins`):

    * checkpoint files that are complete or absent, and a write failure naming its file, each
      noted in the run's index (`IndexedCheckpointIO`; DeepSpeed writes its shard folders itself);
    * under SLURM, Lightning's own SIGUSR1 handling off: it saves a checkpoint inside the signal
      handler (a collective there can hang DDP) and restores its own `hpc_ckpt` files on a
      requeue, outside the run's checkpoints. The run's GracefulInterrupt stops on SIGUSR1 at an
      agreed batch boundary instead, and the run requeues the job (:func:`.jobs.requeue_own_job`).
    """
    from lightning.fabric.plugins.environments import SLURMEnvironment

    from .checkpoint_index import IndexedCheckpointIO

    if "plugins" in cfg.trainer:
        return {}
    plugins: list[Any] = []
    if "DeepSpeed" not in _strategy_name(cfg):
        plugins.append(IndexedCheckpointIO(RunFolder.index_of))
    if SLURMEnvironment.detect():
        try:
            plugins.append(SLURMEnvironment(auto_requeue=False))
        except RuntimeError as error:  # Lightning's check of the srun layout (`srun -n 2`)
            raise UsageError(
                f"the SLURM task layout does not fit a Lightning run: {str(error).strip()} (start one task per "
                "process with `srun --ntasks-per-node=N` and trainer.devices=N)"
            ) from None
    return {"plugins": plugins} if plugins else {}


def _strategy_name(cfg) -> str:
    strategy = cfg.trainer.get("strategy")
    return str(strategy.get("_target_", "")) if hasattr(strategy, "get") else str(strategy or "")
