"""Reading checkpoints: safely, with one set of error texts, and what each engine can read.

Checkpoints are untrusted input: they are read with `weights_only=True`. Which checkpoint a
command uses is decided by :mod:`.ckpt_path` (the run, its newest checkpoint by recorded step)
without reading any: a command reads the one it uses once (:func:`load_checkpoint`) and passes
that :class:`LoadedCheckpoint` down (Lightning's own restore is the only other read).
Every checkpoint carries its model's constructor arguments (Lightning's `hyper_parameters`):
`validate`/`test` rebuild the model from them, so evaluating an `lstm` run needs no `model=lstm`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sru_lightning.models.checkpoint_format import CheckpointFormatError, check_format

log = logging.getLogger("sru_lightning")

#: The name Lightning's checkpoint callback gives the run's latest checkpoint (the newest of a
#: run is found by the step recorded inside, whatever the name; see :mod:`.folder`).
CHECKPOINT_NAME = "last.ckpt"
_NOT_ARCHITECTURE = ("optimizer", "lr_scheduler")
#: The key of a checkpoint that holds the run's configuration (unresolved, as Hydra composed it).
RUN_CONFIG_KEY = "sru_lightning_run_config"
#: The key of a checkpoint that names the job owning the run (see :mod:`.jobs`).
RUN_OWNER_KEY = "sru_lightning_run_owner"
#: The key of a checkpoint that holds the identity of the run that wrote it (see :mod:`.identity`).
RUN_ID_KEY = "sru_lightning_run_id"


class CheckpointError(ValueError):
    """A checkpoint setting that cannot be honoured; reported as a usage error."""


def is_deepspeed_folder(path: str | Path) -> bool:
    """A DeepSpeed checkpoint: a folder (named like a .ckpt file) of per-rank shard files."""
    return deepspeed_client_state(path) is not None


def deepspeed_client_state(path: str | Path) -> Path | None:
    """The file of a DeepSpeed checkpoint folder that holds Lightning's own state (step
    counters, hyperparameters, the vocabulary) beside the engine's shards: rank 0's model-state
    file (ZeRO-1/2 write one for all ranks, ZeRO-3 one per rank). It loads with weights_only=True."""
    folder = Path(path) / "checkpoint"
    if not folder.is_dir():
        return None
    for name in ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_model_states.pt"):
        if (folder / name).is_file():
            return folder / name
    return None


def deepspeed_folder_elsewhere(path: str | Path, command: str) -> CheckpointError:
    """The error for a DeepSpeed folder given where only one-file checkpoints work."""
    resume = (
        "resume it with the DeepSpeed trainer that wrote it (trainer=deepspeed_stage_2 or _3), "
        if command == "fit"
        else ""
    )
    return CheckpointError(
        f"{str(path)!r} is a DeepSpeed checkpoint folder (one shard file per rank), which `{command}` cannot "
        f"read as it is: {resume}consolidate it into one file and pass that: python -c "
        '"from lightning.pytorch.utilities.deepspeed import convert_zero_checkpoint_to_fp32_state_dict as c; '
        f"c('{path}', 'consolidated.ckpt')\" (DeepSpeed reads its shards with weights_only=False: only for "
        "folders you trust)"
    )


@dataclass(frozen=True)
class LoadedCheckpoint:
    """One checkpoint, read once: where it is, what it holds, and the facts a command asks of it
    (its step, the run's configuration, identity and owner, the model's constructor arguments).
    For a DeepSpeed folder `contents` is Lightning's state from its client-state file (no weights)."""

    path: Path
    contents: Mapping[str, Any]

    @property
    def deepspeed(self) -> bool:
        return is_deepspeed_folder(self.path)

    @property
    def step(self) -> int:
        """The optimizer step it was saved at."""
        return int(self.contents.get("global_step", 0) or 0)

    @property
    def run_config(self) -> Mapping[str, Any] | None:
        """The configuration of the run that wrote it; None for a checkpoint written outside a run."""
        saved = self.contents.get(RUN_CONFIG_KEY)
        return saved if isinstance(saved, Mapping) else None

    @property
    def run_id(self) -> str | None:
        """The identity of the run that wrote it (see :mod:`.identity`)."""
        saved = self.contents.get(RUN_ID_KEY)
        return saved if isinstance(saved, str) and saved else None

    @property
    def owner(self) -> dict[str, Any] | None:
        """The job that owned the run when it was written (see :mod:`.jobs`)."""
        saved = self.contents.get(RUN_OWNER_KEY)
        return dict(saved) if isinstance(saved, Mapping) else None

    @property
    def hyper_parameters(self) -> dict[str, Any]:
        """The model's constructor arguments (Lightning's `hyper_parameters`)."""
        saved = self.contents.get("hyper_parameters")
        return dict(saved) if isinstance(saved, Mapping) else {}


def load_checkpoint(path: str | Path) -> LoadedCheckpoint:
    """Read the checkpoint at `path` (a file or a DeepSpeed folder): safely (`weights_only=True`)
    and memory-mapped, so its weights are read only where used. CheckpointError when it cannot
    be read, is not a Lightning checkpoint, or is not of this sru_lightning's format
    (:mod:`sru_lightning.models.checkpoint_format`)."""
    import torch

    path = Path(path)
    source = deepspeed_client_state(path) or path
    try:
        contents = torch.load(str(source), map_location="cpu", weights_only=True, mmap=True)
    except Exception as error:
        raise CheckpointError(f"cannot read the checkpoint {str(source)!r}: {type(error).__name__}: {error}") from error
    if not isinstance(contents, Mapping):
        raise CheckpointError(f"{str(path)!r} is not a Lightning checkpoint (it holds a {type(contents).__name__})")
    step = contents.get("global_step", 0) or 0
    if isinstance(step, bool) or not isinstance(step, int):
        raise CheckpointError(f"{str(path)!r} is not a Lightning checkpoint (its global_step is {step!r})")
    try:
        check_format(contents, str(path))
    except CheckpointFormatError as error:
        raise CheckpointError(str(error)) from None
    return LoadedCheckpoint(path, contents)


def read_model_checkpoint(path: Path, command: str) -> dict[str, Any]:
    """The contents of a one-file checkpoint of the language model, for `command` (generate,
    export): its weights (`state_dict`) and constructor arguments (`hyper_parameters`)."""
    if is_deepspeed_folder(path):
        raise deepspeed_folder_elsewhere(path, command)
    checkpoint = load_checkpoint(path).contents
    if "state_dict" not in checkpoint or "hyper_parameters" not in checkpoint:
        raise CheckpointError(
            f"{str(path)!r} is not a checkpoint of sru_lightning's language model (no state_dict / hyper_parameters)"
        )
    return dict(checkpoint)


# --------------------------------------------------------------------------------------------
# which engine can read which checkpoint
def _strategy_target(cfg) -> str:
    strategy = cfg.trainer.get("strategy") if "trainer" in cfg else None
    if hasattr(strategy, "get"):
        return str(strategy.get("_target_", ""))
    return str(strategy or "")


def check_engine_reads(cfg, command: str, checkpoint: str | Path, loaded: LoadedCheckpoint | None = None) -> None:
    """Refuse, in one sentence, a checkpoint the configured engine cannot read.

    DeepSpeed writes (and reads) folders of per-rank shards; every other engine here writes and
    reads one file (FSDP and FSDP2 gather the full state on rank 0), so those files move
    freely between DDP, FSDP, FSDP2 and one process, for fit and for validate/test.
    """
    deepspeed_trainer = "DeepSpeed" in _strategy_target(cfg)
    folder = is_deepspeed_folder(checkpoint)
    if folder and (command != "fit" or not deepspeed_trainer):
        # DeepSpeed's own evaluation loading of ZeRO-3 folders fails inside the engine, so
        # evaluation always goes through a consolidated file.
        raise deepspeed_folder_elsewhere(checkpoint, command)
    if deepspeed_trainer and not folder:
        raise CheckpointError(
            f"{str(checkpoint)!r} is a one-file checkpoint, and a DeepSpeed trainer resumes only DeepSpeed "
            "checkpoint folders: continue it with trainer=ddp_cpu, ddp, fsdp or fsdp2 (or one process), or "
            "start a fresh DeepSpeed run"
        )
    if folder:
        _check_deepspeed_layout(cfg, Path(checkpoint), loaded)


def deepspeed_layout(folder: Path, loaded: LoadedCheckpoint | None = None) -> tuple[int | None, int | None]:
    """(ZeRO stage, number of data-parallel processes) a DeepSpeed checkpoint folder was written
    with, each None when the folder does not say; `loaded`: the folder as already read."""
    if loaded is not None:
        state = loaded.contents
    else:
        try:
            state = load_checkpoint(folder).contents
        except CheckpointError:  # unreadable here: the engine says why when it loads it
            state = {}
    config = state.get("ds_config") if isinstance(state, Mapping) else None
    stage = None
    if isinstance(config, Mapping) and isinstance(config.get("zero_optimization"), Mapping):
        stage = config["zero_optimization"].get("stage")
    if stage is None:  # ZeRO-3 writes one model-state file per rank, ZeRO-1/2 one for all
        stage = 3 if (folder / "checkpoint" / "zero_pp_rank_0_mp_rank_00_model_states.pt").is_file() else None
    processes = state.get("dp_world_size") if isinstance(state, Mapping) else None
    if not isinstance(processes, int):
        shards = list((folder / "checkpoint").glob("*_optim_states.pt"))
        processes = len(shards) or None
    return (int(stage) if isinstance(stage, int) else None), processes


def _check_deepspeed_layout(cfg, folder: Path, loaded: LoadedCheckpoint | None) -> None:
    """A DeepSpeed folder resumes only under its own ZeRO stage and number of processes: DeepSpeed
    reads the shards of that layout (otherwise an AssertionError or ZeRORuntimeException after a
    full start). Refused in one line before anything starts."""
    stage, processes = deepspeed_layout(folder, loaded)
    strategy = cfg.trainer.get("strategy")
    configured_stage = strategy.get("stage") if hasattr(strategy, "get") else None
    if stage is not None and isinstance(configured_stage, int) and configured_stage != stage:
        raise CheckpointError(
            f"{str(folder)!r} was written by DeepSpeed ZeRO-{stage}, and this fit runs ZeRO-{configured_stage}: "
            f"resume it with trainer=deepspeed_stage_{stage}, or consolidate it into one file for another engine"
        )
    devices, nodes = cfg.trainer.get("devices"), cfg.trainer.get("num_nodes", 1) or 1
    if processes is not None and isinstance(devices, int) and devices > 0 and isinstance(nodes, int):
        if devices * nodes != processes:
            raise CheckpointError(
                f"{str(folder)!r} holds the shards of {processes} DeepSpeed processes, and this fit runs "
                f"{devices * nodes}: DeepSpeed resumes only on the number of processes that wrote it; set "
                f"trainer.devices (x trainer.num_nodes) to {processes}, or consolidate it into one file for "
                "another engine"
            )


def check_fits_model(loaded: LoadedCheckpoint, model) -> None:
    """Raise CheckpointError unless the checkpoint can be loaded into `model` (a fit continuing it):
    same parameters, same shapes. Names the model settings that differ when it can."""
    contents, checkpoint = loaded.contents, loaded.path
    if loaded.deepspeed:
        # Its weights are in the engine's shards: compare the settings the model was built with.
        saved = _settings(contents.get("hyper_parameters"))
        current = _settings(getattr(model, "hparams", None))
        settings = [
            key
            for key in sorted(saved)
            if key in current and key not in _NOT_ARCHITECTURE and saved[key] != current[key]
        ]
        if settings:
            trained = ", ".join(f"model.{key}={saved[key]!r}" for key in settings[:3])
            asked = ", ".join(f"model.{key}={current[key]!r}" for key in settings[:3])
            raise CheckpointError(
                f"the checkpoint {str(checkpoint)!r} was trained with {trained}, but this fit's model has {asked}; "
                "continue it with the settings it was trained with, or leave ckpt_path out to start a fresh run"
            )
        return
    state = contents.get("state_dict")
    if not isinstance(state, dict):
        raise CheckpointError(
            f"cannot read the checkpoint {str(checkpoint)!r}: it holds no state_dict (not a fit's checkpoint)"
        )
    own = model.state_dict()
    differing = sorted(
        name
        for name in set(own) | set(state)
        if name not in own or name not in state or tuple(own[name].shape) != tuple(state[name].shape)
    )
    if not differing:
        return
    saved = _settings(contents.get("hyper_parameters"))
    current = _settings(getattr(model, "hparams", None))
    settings = [
        key for key in sorted(saved) if key in current and key not in _NOT_ARCHITECTURE and saved[key] != current[key]
    ]
    if settings:
        trained = ", ".join(f"model.{key}={saved[key]!r}" for key in settings[:3])
        asked = ", ".join(f"model.{key}={current[key]!r}" for key in settings[:3])
        detail = f"was trained with {trained}, but this fit's model has {asked}"
    else:
        detail = f"does not fit this fit's model (parameter {differing[0]!r} differs)"
    raise CheckpointError(
        f"the checkpoint {str(checkpoint)!r} {detail}; continue it with the settings it was trained with, "
        "or leave ckpt_path out to start a fresh run"
    )


def _settings(hyper_parameters: Any) -> dict[str, Any]:
    """The model's constructor arguments by config key: the network's under `net.` (`net.hidden_size`),
    so a difference is named as the setting a user writes (`model.net.hidden_size`)."""
    found = dict(hyper_parameters or {})
    net = found.pop("net", None)
    if isinstance(net, Mapping):
        found.update({f"net.{key}": value for key, value in net.items() if key != "_target_"})
    elif net is not None:
        found["net"] = net
    return found


def saved_codec(loaded: LoadedCheckpoint):
    """The vocabulary the data module saved in the checkpoint (a TokenCodec), or None when it has none."""
    from sru_lightning.data import TokenCodec

    for entry in loaded.contents.values():  # filed under the data module's class name
        if isinstance(entry, Mapping) and isinstance(entry.get("token_codec"), Mapping):
            return TokenCodec.from_state_dict(entry["token_codec"])
    return None
