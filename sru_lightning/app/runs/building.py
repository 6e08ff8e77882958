"""Build one run from its Hydra config: where it starts, its data, model, callbacks, loggers and
Trainer, and the names of the metrics it reports.

Every call that applies one of the user's settings goes through :mod:`.refusals`, so that its
refusal is a usage error; anything else that goes wrong here is a failure of the run.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from sru_lightning._lightning_compat import give_the_launcher_time_after_a_lost_process
from sru_lightning.app.usage import UsageError

from .checkpoints import check_fits_model, saved_codec
from .folder import RunFolder
from .init_from import init_from_setting, load_initial_weights, put_initial_weights, without_init_from
from .refusals import check_config_resolves, checkpoint_setting, data_setting, instantiate_setting
from .run_callbacks import AnnounceRunDirectory, LastValidation
from .save_run_config import SaveRunConfig, plain_config
from .starting_point import StartingPoint, starting_point
from .threads import set_thread_count, thread_setting_problem
from .trainer_args import check_trainer_settings

log = logging.getLogger("sru_lightning")
#: Seconds the launching process has to report a rank that died before Lightning's launcher
#: kills it (it still ends a launching process that hangs).
LOST_PROCESS_GRACE_S = 20


def build(cfg, command: str, output_dir: Path, overrides: list[str], owner: dict[str, str] | None = None):
    """Instantiate data, model, callbacks, loggers and trainer from `cfg`; `owner` is the job
    the run belongs to (:func:`.jobs.attempt_owner`). Returns the trainer, the model, the data
    module and the :class:`~.starting_point.StartingPoint`."""
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import (
        Checkpoint,
        LearningRateMonitor,
        ModelCheckpoint,
        ModelSummary,
        ProgressBar,
        RichModelSummary,
        RichProgressBar,
    )
    from omegaconf import OmegaConf

    from sru_lightning.callbacks import (
        FolderModelCheckpoint,
        SRUPrecisionCallback,
        TrainingThroughput,
        ValidateBeforeStop,
    )
    from sru_lightning.nn.policy import iter_sru_cells

    from .directories import evaluated_run

    check_config_resolves(cfg)
    with checkpoint_setting():
        start = starting_point(cfg, command, output_dir, overrides, evaluated_run(output_dir), owner)
    cfg = start.cfg
    check_config_resolves(cfg)
    if start.checkpoint is not None:
        _say_where_it_starts(command, start)
        if start.config_source == "the settings saved with the checkpoint":
            _record_attempt_config(cfg, output_dir)
    seed = cfg.get("seed")
    if seed is not None:
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise UsageError(f"`seed` must be an integer or null, got {seed!r}")
        pl.seed_everything(seed, workers=True, verbose=False)
    if thread_setting_problem(cfg.get("threads")):
        raise UsageError(thread_setting_problem(cfg.get("threads")))
    trainer_settings = OmegaConf.to_container(cfg.trainer, resolve=True)
    check_trainer_settings(trainer_settings)
    ckpt_path = start.checkpoint
    model_config, data_config = cfg.model, cfg.data
    datamodule = instantiate_setting(data_config)
    if ckpt_path is not None and (command != "fit" or getattr(datamodule, "tokenizer", None) is not None):
        # Token ids mean what they meant in training; a resumed fit with a learned subword
        # vocabulary takes the checkpoint's rather than learning it again.
        _encode_with_the_checkpoints_vocabulary(datamodule, start.loaded)
    # A new fit may start its network from trained weights, with their vocabulary (runs/init_from.py).
    initial = None
    if command == "fit" and ckpt_path is None and init_from_setting(model_config) is not None:
        initial = load_initial_weights(init_from_setting(model_config), str(cfg.get("resume_dir", "outputs")))
        _adopt_vocabulary(datamodule, initial.codec, f"the vocabulary of {initial.source!r}")
    with data_setting():  # the data module reads its text on first use
        vocab_size = datamodule.vocab_size
    model = _build_model(without_init_from(model_config), command, vocab_size, getattr(datamodule, "token_unit", None))
    if initial is not None:
        put_initial_weights(model.net, initial)
    if getattr(datamodule, "packs_documents", False) and not getattr(model, "accepts_document_boundaries", True):
        raise UsageError(
            f"data ({data_config.get('_target_')}) packs documents with their boundaries, which "
            f"model.net.rnn={getattr(model.net, 'rnn_type', None)!r} cannot keep apart: use model=sru or model=srupp"
        )
    if command == "fit" and ckpt_path is not None:
        with checkpoint_setting():
            check_fits_model(start.loaded, model)
    if getattr(model.net, "vocab_size", vocab_size) != vocab_size:
        raise UsageError(
            f"the checkpoint {ckpt_path!r} was trained with a vocabulary of {model.net.vocab_size} tokens, but "
            f"the data ({data_config.get('_target_')}) has {vocab_size}; evaluate it on the data it was "
            f"trained on (see data: in its run directory's {RunFolder.HYDRA_DIR}/{RunFolder.CONFIG_FILE})"
        )
    callbacks = [
        instantiate_setting(node, **metric_names_followed(node, model))
        for node in (cfg.get("callbacks") or {}).values()
        if node is not None
    ]
    if not any(True for _ in iter_sru_cells(model)):
        # An LSTM baseline has no SRU layer by design: the precision callback has nothing to do or say.
        callbacks = [cb for cb in callbacks if not isinstance(cb, SRUPrecisionCallback)]
    loggers = [instantiate_setting(node) for node in (cfg.get("logger") or {}).values() if node is not None]
    if not loggers:
        monitors = [cb for cb in callbacks if isinstance(cb, LearningRateMonitor)]
        if monitors:
            log.info("logger=none: the learning-rate monitor has nowhere to log and is left out")
            callbacks = [cb for cb in callbacks if not isinstance(cb, LearningRateMonitor)]
    if trainer_settings.get("enable_progress_bar", True) is False:
        # +trainer.enable_progress_bar=false wins over the progress bar among the callbacks.
        callbacks = [cb for cb in callbacks if not isinstance(cb, ProgressBar)]
    if trainer_settings.get("enable_model_summary", True) is False:
        callbacks = [cb for cb in callbacks if not isinstance(cb, ModelSummary)]
    elif not any(isinstance(cb, ModelSummary) for cb in callbacks):
        # The network is one attribute of the model (`net`): show its layers too, not just `net`.
        rich = any(isinstance(cb, RichProgressBar) for cb in callbacks)
        callbacks.append(RichModelSummary(max_depth=2) if rich else ModelSummary(max_depth=2))
    if trainer_settings.get("enable_checkpointing", True) is False:
        # +trainer.enable_checkpointing=false wins over the checkpoint callbacks among the callbacks
        # (the interruption checkpoint too: such a run writes none).
        callbacks = [cb for cb in callbacks if not isinstance(cb, Checkpoint)]
    elif not any(isinstance(cb, ModelCheckpoint) for cb in callbacks):
        # Lightning's default would write under the logger's folder (csv/...); keep them in the run's.
        callbacks.append(
            FolderModelCheckpoint(
                dirpath=output_dir / RunFolder.CHECKPOINTS_DIR, save_last=True, enable_version_counter=False
            )
        )
    # Part of every run: validating the final weights of a max_steps stop, throughput, freshness.
    if not any(isinstance(cb, ValidateBeforeStop) for cb in callbacks):
        callbacks.append(ValidateBeforeStop())
    callbacks += [
        TrainingThroughput(),
        LastValidation(),
        AnnounceRunDirectory(output_dir),
        SaveRunConfig(plain_config(cfg), owner, start.run_id),
        *start.callbacks(),
    ]
    # A rank that dies is reported by this process in one line (runs/outcomes.py): Lightning's
    # launcher kills it only if it has not ended by itself this long after.
    give_the_launcher_time_after_a_lost_process(LOST_PROCESS_GRACE_S)
    trainer = instantiate_setting(
        cfg.trainer, cfg=cfg, callbacks=callbacks, logger=loggers or False, **_run_plugins(cfg)
    )
    _check_compile_fits_strategy(model, trainer)
    if command == "fit":
        _check_optimizer_fits_strategy(model_config.get("optimizer"), trainer)
    set_thread_count(cfg.get("threads"), trainer.num_devices)  # before Lightning launches the other ranks
    check_sizes = getattr(datamodule, "check_sizes", None)
    if check_sizes is not None:  # too little text for the batch layout: say so before training
        with data_setting():
            check_sizes(world_size=trainer.world_size)
    return trainer, model, datamodule, start


def _build_model(model_config, command: str, vocab_size: int, token_unit: str | None):
    """The network from `model.net` (its vocabulary the data's, unless an evaluated checkpoint's
    config names the one it was trained with), then the LightningModule that trains it."""
    from omegaconf import OmegaConf

    net_config = model_config.get("net")
    if not OmegaConf.is_dict(net_config):
        raise UsageError(
            f"`model.net` must be a mapping whose `_target_` names the network (e.g. sru_lightning.nn.LanguageNet), "
            f"got {net_config!r}"
        )
    if "_target_" not in net_config:  # a checkpoint's saved arguments of the default network
        net_config = OmegaConf.merge({"_target_": "sru_lightning.nn.LanguageNet"}, net_config)
    net_kwargs = {} if "vocab_size" in net_config and command != "fit" else {"vocab_size": vocab_size}
    net = instantiate_setting(net_config, **net_kwargs)
    model_kwargs: dict[str, Any] = {"net": net}
    if token_unit is not None:  # the data decides what a token is, and so the metric names
        model_kwargs["token_unit"] = token_unit
    return instantiate_setting(model_config, **model_kwargs)


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


def _say_where_it_starts(command: str, start: StartingPoint) -> None:
    """Which checkpoint the attempt starts from, and every setting it changes against the run."""
    verb = "resuming" if command == "fit" else "evaluating"
    log.info("%s %s (step %d) with %s", verb, start.checkpoint, start.step, start.config_source)
    for change in start.changes:
        how = "not used by evaluation" if change.action == "unused" else "applied"
        log.info("changed setting: %s (%s)", change, how)


def _record_attempt_config(cfg, output_dir: Path) -> None:
    """`.hydra/config.yaml` of this attempt says what it runs with: the run's own settings and
    the command line's on top (Hydra wrote the composed config before the run was known)."""
    from omegaconf import OmegaConf

    from .directories import attempt_config_path

    path = attempt_config_path(output_dir)
    if path is not None and path.is_file():
        OmegaConf.save(cfg, path)


def _encode_with_the_checkpoints_vocabulary(datamodule, loaded) -> None:
    """Token ids mean what they meant in training: evaluation data is encoded with the checkpoint's
    vocabulary (a character it lacks is an error; an unknown word is counted as the unknown word)."""
    with checkpoint_setting():
        codec = saved_codec(loaded)
    if codec is not None:
        _adopt_vocabulary(datamodule, codec, "the checkpoint's vocabulary")


def _adopt_vocabulary(datamodule, codec, whose: str) -> None:
    """Encode the data with `codec` (an unknown word counts as the unknown word, with a warning)."""
    adopt = getattr(datamodule, "adopt_vocabulary", None)
    if adopt is None:
        return
    with data_setting():
        unknown = adopt(codec)
    if unknown:
        log.warning(
            "%d words of the data are not in %s of %d words; each counts as %r",
            unknown,
            whose,
            codec.vocab_size,
            codec.unknown,
        )


# --------------------------------------------------------------------------------------------
# metric names
def bits_name(model, stage: str) -> str:
    """The model's bits-per-token metric of `stage`: `val_bpc`, or `val_bpw` for word-level data."""
    name = getattr(model, "bits_name", None)
    return name(stage) if callable(name) else f"{stage}_bpc"


def metric_names_followed(node, model) -> dict[str, str]:
    """A callback's `monitor` / `filename` settings that name the character-level metrics
    (conf/callbacks/model_checkpoint.yaml: val_bpc), renamed to the ones the model logs."""
    renamed = {}
    for key in ("monitor", "filename"):
        value = node.get(key) if hasattr(node, "get") else None
        if not isinstance(value, str):
            continue
        new = value
        for stage in ("train", "val", "test"):
            new = new.replace(f"{stage}_bpc", bits_name(model, stage))
        if new != value:
            renamed[key] = new
    return renamed


def optimized_metric_name(cfg, model) -> str:
    """The metric a sweep optimises: `optimized_metric`, else the checkpoint callback's monitor."""
    name = cfg.get("optimized_metric")
    if not name:
        checkpoint = (cfg.get("callbacks") or {}).get("model_checkpoint") or {}
        name = checkpoint.get("monitor") or "val_bpc"
    for stage in ("train", "val", "test"):  # val_bpc is val_bpw for word-level data
        name = name.replace(f"{stage}_bpc", bits_name(model, stage))
    return str(name)
