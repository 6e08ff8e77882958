"""Every config file composes; each group option instantiates the class it names."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from hydra.utils import get_class, instantiate
from omegaconf import OmegaConf, open_dict

from sru_lightning._resources import conf_dir
from sru_lightning.app.cli import config_groups
from sru_lightning.app.runs.init_from import without_init_from

CONF = conf_dir()
# Groups whose options are picked as `group=option`; callbacks/logger files are also
# composed one by one through their `default` / single-entry files.
OPTIONS = [(group, option) for group, options in config_groups().items() for option in options]


def compose_with(overrides, tmp_path):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=overrides, return_hydra_config=True)
    with open_dict(cfg):
        cfg.hydra.runtime.output_dir = str(tmp_path)
    HydraConfig.instance().set_config(cfg)
    return cfg


def test_the_config_tree_has_the_documented_groups():
    groups = config_groups()
    assert set(groups["model"]) >= {"sru", "srupp", "lstm", "sru_large"}
    assert set(groups["data"]) >= {"pydoc", "stdlib", "enwik8", "text", "documents"}
    assert set(groups["trainer"]) >= {
        "default",
        "cpu",
        "gpu",
        "ddp",
        "ddp_cpu",
        "deepspeed_stage_2",
        "deepspeed_stage_3",
        "fsdp",
    }
    assert set(groups["logger"]) >= {"csv", "tensorboard"}
    assert "enwik8" in groups["experiment"]
    assert (CONF / "hydra" / "default.yaml").is_file()


def test_every_yaml_file_belongs_to_a_group_that_composes():
    files = {p.relative_to(CONF) for p in CONF.rglob("*.yaml")}
    covered = {Path("config.yaml"), Path("hydra/default.yaml")}
    covered |= {Path(group) / f"{option}.yaml" for group, option in OPTIONS}
    covered |= {Path("hydra/launcher") / f"{option}.yaml" for option in HYDRA_LAUNCHERS}
    covered |= {Path("hydra/sweeper") / f"{option}.yaml" for option in HYDRA_SWEEPERS}
    assert files == covered


# Ready launcher configs (conf/hydra/launcher/), picked as `hydra/launcher=<option>`.
HYDRA_LAUNCHERS = sorted(p.stem for p in (CONF / "hydra" / "launcher").glob("*.yaml"))
# The package's own sweepers (conf/hydra/sweeper/), picked as `hydra/sweeper=<option>`.
HYDRA_SWEEPERS = sorted(p.stem for p in (CONF / "hydra" / "sweeper").glob("*.yaml"))


@pytest.mark.parametrize("option", HYDRA_SWEEPERS)
def test_each_sweeper_config_composes_and_names_a_registered_plugin(option, tmp_path):
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper", reason="needs the `sweepers` extra")
    from hydra.core.plugins import Plugins
    from hydra.plugins.sweeper import Sweeper

    from sru_lightning.app.search import register_sweeper

    cfg = compose_with([f"hydra/sweeper={option}"], tmp_path)
    register_sweeper()
    assert cfg.hydra.sweeper._target_.startswith("hydra_plugins.")  # where Hydra accepts plugins from
    assert issubclass(Plugins.instance().class_name_to_class[cfg.hydra.sweeper._target_], Sweeper)


@pytest.mark.parametrize("option", HYDRA_LAUNCHERS)
def test_each_launcher_config_composes_and_names_its_launcher(option, tmp_path):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="needs hydra-submitit-launcher")
    cfg = compose_with([f"hydra/launcher={option}", "hydra.launcher.partition=debug"], tmp_path)
    launcher = cfg.hydra.launcher
    assert launcher.partition == "debug"
    assert get_class(launcher._target_).__name__ == "SlurmLauncher"
    # a real cluster's defaults, and the sbatch options submitit passes through
    assert launcher.timeout_min > 10 and launcher.cpus_per_task >= 1 and launcher.mem_gb >= 1
    assert launcher.additional_parameters.requeue is True


@pytest.mark.parametrize("group,option", OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_each_option_composes_and_names_an_importable_class(group, option, tmp_path):
    override = f"{group}={option}"
    cfg = compose_with([override], tmp_path)
    # global packages; a group inside a group (model/optimizer) sits at its dotted path
    node = cfg if group in ("experiment", "hparams_search", "debug") else OmegaConf.select(cfg, group.replace("/", "."))
    # every interpolation of the job config resolves
    OmegaConf.to_container(OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]), resolve=True)
    if group in ("callbacks", "logger"):
        targets = [entry["_target_"] for entry in (node or {}).values()]
    elif group in ("experiment", "debug"):
        targets = [cfg.model._target_, cfg.data._target_, cfg.trainer._target_]
    elif group == "hparams_search":  # Optuna's (the `sweepers` extra) with its sampler, or Hydra's basic sweeper
        sweeper = cfg.hydra.sweeper
        if "optuna" in sweeper._target_:
            pytest.importorskip("hydra_plugins.hydra_optuna_sweeper", reason="needs the `sweepers` extra")
        targets = [sweeper._target_, *([sweeper.sampler._target_] if "sampler" in sweeper else [])]
    else:
        targets = [node._target_]
    for target in targets:
        assert get_class(target) is not None


def test_default_config_instantiates_data_model_callbacks_logger_and_trainer(tmp_path):
    cfg = compose_with(["trainer.max_epochs=1"], tmp_path)
    data = instantiate(cfg.data)
    # `init_from` is the run's setting (where the network's weights start), not the module's argument
    model = instantiate(without_init_from(cfg.model), net=instantiate(cfg.model.net, vocab_size=data.vocab_size))
    assert type(model).__name__ == "SRULanguageModel" and model.net.rnn_type == "sru"
    callbacks = [instantiate(node) for node in cfg.callbacks.values()]
    names = {type(c).__name__ for c in callbacks}
    assert names == {
        "SRUPrecisionCallback",
        "FolderModelCheckpoint",
        "LearningRateMonitor",
        "PacedRichProgressBar",
        # fault tolerance: an interrupted fit leaves a checkpoint and resumes exactly
        "InterruptionCheckpoint",
        "GracefulInterrupt",
        "RestoreDataPosition",
        "SeedEveryBatch",
        # honest runs: a NaN loss stops the run
        "StopOnNonFiniteLoss",
        # a max_time fit: the schedule decays over the budget, the last validation fits in it
        "TimeBudget",
    }
    checkpoint = next(c for c in callbacks if type(c).__name__ == "FolderModelCheckpoint")
    assert checkpoint.save_last and Path(checkpoint.dirpath) == tmp_path / "checkpoints"
    loggers = [instantiate(node) for node in cfg.logger.values()]
    trainer = instantiate(cfg.trainer, callbacks=callbacks, logger=loggers)
    assert trainer.max_epochs == 1 and Path(trainer.logger.log_dir).parent == tmp_path


def test_ddp_cpu_is_two_gloo_processes_on_cpu(tmp_path):
    cfg = compose_with(["trainer=ddp_cpu"], tmp_path)
    assert cfg.trainer.accelerator == "cpu" and cfg.trainer.devices == 2
    strategy = instantiate(cfg.trainer.strategy)
    assert type(strategy).__name__ == "DDPStrategy" and strategy._process_group_backend == "gloo"


def test_deepspeed_configs_pick_their_zero_stage(tmp_path):
    for stage in (2, 3):
        cfg = compose_with([f"trainer=deepspeed_stage_{stage}", "data.batch_size=12"], tmp_path)
        assert cfg.trainer.strategy.stage == stage
        # the train loader has no batch sampler, so DeepSpeed must be told the micro-batch size
        assert cfg.trainer.strategy.logging_batch_size_per_gpu == 12


def test_enwik8_experiment_follows_the_paper_setup(tmp_path):
    cfg = compose_with(["experiment=enwik8", "data.path=/data/enwik8"], tmp_path)
    assert cfg.data._target_.endswith("Enwik8DataModule")
    assert (cfg.data.train_bytes, cfg.data.val_bytes, cfg.data.test_bytes) == (90_000_000, 5_000_000, 5_000_000)
    assert (cfg.data.batch_size, cfg.data.seq_len) == (128, 100)
    assert cfg.model.net.rnn == "sru" and cfg.model.net.num_layers == 10
    assert cfg.model.carry_hidden is True


def test_run_and_sweep_dirs_are_unique_per_run_and_job(tmp_path):
    hydra_node = OmegaConf.to_container(compose_with([], tmp_path).hydra, resolve=False)
    assert hydra_node["run"]["dir"].startswith("${sru_run_dir:") and "${now:%H-%M-%S-%f}" in hydra_node["run"]["dir"]
    assert hydra_node["sweep"]["subdir"] == "${hydra.job.num}"
    assert hydra_node["callbacks"]["sweep_summary"]["_target_"] == "sru_lightning.app.sweep.SweepSummary"


def test_a_slurm_job_owns_its_run_directory(monkeypatch):
    from sru_lightning.app.runs.jobs import default_run_dir

    for name in ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID"):
        monkeypatch.delenv(name, raising=False)
    node = OmegaConf.create({"dir": "${sru_run_dir:'outputs/${now:%Y}/x'}"})
    assert node.dir.startswith("outputs/2") and node.dir.endswith("/x")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    assert node.dir == "outputs/slurm-4242" == default_run_dir("elsewhere")
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "4240")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "3")
    assert node.dir == "outputs/slurm-4240_3"


@pytest.mark.parametrize("choice", ["model=sru", "model=srupp", "model=lstm", "model=sru_large", "experiment=enwik8"])
def test_every_model_config_builds_and_runs_when_shrunk(choice, tmp_path):
    import torch

    shrink = ["model.net.hidden_size=16", "model.net.embedding_dim=8", "model.net.num_layers=2"]
    if choice in ("model=sru_large", "experiment=enwik8"):
        shrink.append("model.net.sru_options.projection_size=4")
    if choice == "model=srupp":
        shrink.append("model.net.sru_options.proj_size=4")
    cfg = compose_with([choice, *shrink], tmp_path)
    model = instantiate(without_init_from(cfg.model), net=instantiate(cfg.model.net, vocab_size=7))
    logits, _ = model(torch.randint(0, 7, (2, 5)))
    assert logits.shape == (2, 5, 7)
    optimizer = model.configure_optimizers()["optimizer"] if cfg.model.lr_scheduler is None else None
    assert optimizer is None or isinstance(optimizer, torch.optim.Optimizer)
