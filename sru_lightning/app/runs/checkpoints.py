"""Which checkpoint a run starts from, and which model a checkpoint was trained as.

* `ckpt_path` may be null, a `.ckpt` file, a run directory or `last`. `last` only takes
  checkpoints that hold at least one optimizer step, of runs that did not fail: a run that
  crashed before training, or stopped on a NaN loss, is never picked up by a requeue.
* Every checkpoint carries its model's constructor arguments (Lightning's
  `hyper_parameters`); `validate`/`test` rebuild the model from them rather than from the
  current config, so evaluating an `lstm` run needs no `model=lstm`.

Checkpoints are untrusted input: they are read with `weights_only=True`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .records import run_status

log = logging.getLogger("sru_lightning")

CHECKPOINT_NAME = "last.ckpt"
INTERRUPTED_NAME = "interrupted.ckpt"
# What a run leaves to continue from: the last epoch-end/periodic save, and the checkpoint
# written when a fit is interrupted (conf/callbacks/fault_tolerance.yaml). The newer one wins.
RESUMABLE_NAMES = (CHECKPOINT_NAME, INTERRUPTED_NAME)


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
        if command == "fit" else ""
    )
    return CheckpointError(
        f"{str(path)!r} is a DeepSpeed checkpoint folder (one shard file per rank), which `{command}` cannot "
        f"read as it is: {resume}consolidate it into one file and pass that: python -c "
        "\"from lightning.pytorch.utilities.deepspeed import convert_zero_checkpoint_to_fp32_state_dict as c; "
        f"c('{path}', 'consolidated.ckpt')\" (DeepSpeed reads its shards with weights_only=False: only for "
        "folders you trust)"
    )


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """The checkpoint's contents, loaded safely (`weights_only=True`, memory-mapped). For a
    DeepSpeed folder: Lightning's state (no weights), from its client-state file."""
    import torch

    client_state = deepspeed_client_state(path)
    if client_state is not None:
        path = client_state
    try:
        return torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
    except Exception as error:
        raise CheckpointError(f"cannot read the checkpoint {str(path)!r}: {type(error).__name__}: {error}") from error


def checkpoint_step(path: str | Path) -> int:
    """Optimizer steps the checkpoint holds (0 for a model that never trained)."""
    return int(read_checkpoint(path).get("global_step", 0) or 0)


def newest_resumable(folder: Path) -> Path | None:
    """The most recently written of `folder`'s resumable checkpoints, or None."""
    found = [folder / name for name in RESUMABLE_NAMES
             if (folder / name).is_file() or is_deepspeed_folder(folder / name)]
    return max(found, key=lambda path: path.stat().st_mtime) if found else None


def _why_not_resumable(checkpoint: Path) -> str | None:
    """None when `ckpt_path=last` may continue from `checkpoint`, else the reason it may not."""
    run_dir = checkpoint.parent.parent
    status = run_status(run_dir)
    if status == "failed":
        return f"the run in {str(run_dir)!r} failed"
    try:
        steps = checkpoint_step(checkpoint)
    except CheckpointError as error:
        return str(error)
    if steps < 1:
        return f"{str(checkpoint)!r} holds no optimizer step"
    return None


def resolve_checkpoint(cfg, command: str, output_dir: Path) -> str | None:
    """Turn the `ckpt_path` setting into a checkpoint file (or None for a fresh start)."""
    from omegaconf import OmegaConf

    setting = cfg.get("ckpt_path")
    if setting is None or str(setting).strip() == "":
        if command != "fit":
            log.warning("%s without ckpt_path: evaluating freshly initialised weights", command)
        return None
    setting = str(setting)
    if setting != "last":
        return str(named_checkpoint(setting))

    resume_dir = Path(str(cfg.get("resume_dir") or "outputs")).expanduser()
    if cfg.get("resume_dir") is not None and str(cfg.get("resume_dir")) != "outputs" and not resume_dir.is_dir():
        # A mistyped folder would otherwise mean a silent fresh start.
        raise CheckpointError(
            f"`resume_dir` must be a folder of earlier runs for ckpt_path=last, got {str(resume_dir)!r}, "
            "which does not exist"
        )
    own = newest_resumable(output_dir / "checkpoints")
    if own is not None:
        reason = _why_not_resumable(own)
        if reason is None:
            return str(own.absolute())
        if run_status(output_dir) == "failed":
            raise CheckpointError(
                f"`ckpt_path=last`: {reason}, so its checkpoints are not resumed automatically; pass "
                f"ckpt_path=<one of its .ckpt files> to continue from it anyway, or choose another hydra.run.dir"
            )
        log.info("ckpt_path=last: not resuming %s: %s", own, reason)
    found = find_last_checkpoint(
        resume_dir,
        OmegaConf.to_container(cfg.model, resolve=True),
        OmegaConf.to_container(cfg.data, resolve=True),
        exclude=output_dir,
    )
    if found is not None:
        log.info("ckpt_path=last: resuming from %s", found)
        return str(found)
    if command != "fit":
        raise CheckpointError(
            f"`ckpt_path=last` found no {CHECKPOINT_NAME} of a run with this model and data config "
            f"under resume_dir={cfg.get('resume_dir')!r}; pass ckpt_path=/path/to/file.ckpt"
        )
    log.warning("ckpt_path=last: no earlier checkpoint for this model/data config; starting from scratch")
    return None


def named_checkpoint(setting: str) -> Path:
    """A `ckpt_path` other than `last` as an absolute checkpoint path: the file itself, a
    DeepSpeed checkpoint folder, or a run directory's newest resumable checkpoint."""
    path = Path(setting).expanduser()
    if is_deepspeed_folder(path):
        return path.absolute()
    if path.is_dir():
        for folder in (path / "checkpoints", path):
            candidate = newest_resumable(folder)
            if candidate is not None:
                return candidate.absolute()
        raise CheckpointError(
            f"`ckpt_path` is the directory {setting!r}, which holds no checkpoints/{CHECKPOINT_NAME} "
            f"or checkpoints/{INTERRUPTED_NAME}; point ckpt_path at a .ckpt file"
        )
    if not path.is_file():
        raise CheckpointError(
            f"`ckpt_path` must be a checkpoint file, a run directory or 'last', got {setting!r}, which does not exist"
        )
    return path.absolute()


def model_checkpoint(setting: str, resume_dir: str) -> Path:
    """The checkpoint a command that reads a trained model (generate, export) is pointed at:
    `ckpt_path` as for a run, except that `last` is the newest resumable checkpoint under
    `resume_dir` of any trained run that did not fail, whatever its model or data."""
    if setting != "last":
        return named_checkpoint(setting)
    found = find_last_checkpoint(Path(resume_dir).expanduser())
    if found is None:
        raise CheckpointError(
            f"`ckpt_path=last` found no checkpoints/{CHECKPOINT_NAME} of a trained run under "
            f"resume_dir={resume_dir!r}; pass ckpt_path=<run directory or .ckpt file>"
        )
    return found


def read_model_checkpoint(path: Path, command: str) -> dict[str, Any]:
    """The contents of a one-file checkpoint of the language model, for `command` (generate,
    export): its weights (`state_dict`) and constructor arguments (`hyper_parameters`)."""
    if is_deepspeed_folder(path):
        raise deepspeed_folder_elsewhere(path, command)
    checkpoint = read_checkpoint(path)
    if not isinstance(checkpoint, Mapping) or "state_dict" not in checkpoint or "hyper_parameters" not in checkpoint:
        raise CheckpointError(
            f"{str(path)!r} is not a checkpoint of sru_lightning's language model (no state_dict / hyper_parameters)"
        )
    return checkpoint


def find_last_checkpoint(root: Path, model_config: dict | None = None, data_config: dict | None = None,
                         exclude: Path | None = None) -> Path | None:
    """Newest resumable checkpoint (`last.ckpt` or `interrupted.ckpt`) under `root` that holds at
    least one optimizer step, of a run that did not fail and, when `model_config` and
    `data_config` are given, used that model and data config."""
    if not root.is_dir():
        return None
    candidates = []
    for checkpoint in (found for name in RESUMABLE_NAMES for found in root.rglob(f"checkpoints/{name}")):
        run_dir = checkpoint.parent.parent
        if exclude is not None and run_dir.resolve() == exclude.resolve():
            continue
        if model_config is None or _same_configs(run_dir, model_config, data_config):
            candidates.append((checkpoint.stat().st_mtime, checkpoint))
    for _, checkpoint in sorted(candidates, reverse=True):
        reason = _why_not_resumable(checkpoint)
        if reason is None:
            return checkpoint.absolute()
        log.info("ckpt_path=last: skipping %s: %s", checkpoint, reason)
    return None


def _same_configs(run_dir: Path, model_config: dict, data_config: dict | None) -> bool:
    """Whether the run in `run_dir` was configured (its `.hydra/config.yaml`) with this model and data."""
    from omegaconf import OmegaConf

    saved = run_dir / ".hydra" / "config.yaml"
    if not saved.is_file():
        return False
    try:
        config = OmegaConf.load(saved)
        return (
            OmegaConf.to_container(config.model, resolve=True) == model_config
            and OmegaConf.to_container(config.data, resolve=True) == data_config
        )
    except Exception:  # an unreadable or foreign config is simply not a match
        return False


# --------------------------------------------------------------------------------------------
# the model a checkpoint was trained as
_NOT_ARCHITECTURE = ("optimizer", "lr_scheduler")


def checkpoint_model_config(cfg, checkpoint: str | Path, user_overrides: list[str]):
    """The model config to evaluate `checkpoint` with: the checkpoint's own constructor
    arguments under the configured `_target_`.

    Raises CheckpointError when the user's `model...` overrides contradict the checkpoint.
    """
    from omegaconf import OmegaConf

    saved = read_checkpoint(checkpoint).get("hyper_parameters")
    if not isinstance(saved, dict) or not saved:
        return cfg.model  # saved by something else: trust the config
    configured = OmegaConf.to_container(cfg.model, resolve=True)
    asked = _overridden_model_keys(user_overrides, configured)
    differing = [
        key for key in sorted(asked, key=lambda key: (key != "rnn", key))
        if key in saved and key in configured and key not in _NOT_ARCHITECTURE and saved[key] != configured[key]
    ]
    if differing:
        trained = ", ".join(f"model.{key}={saved[key]!r}" for key in differing[:3])
        wanted = ", ".join(f"model.{key}={configured[key]!r}" for key in differing[:3])
        raise CheckpointError(
            f"the checkpoint {str(checkpoint)!r} was trained with {trained}, but the overrides ask for "
            f"{wanted}; the model is rebuilt from the checkpoint, so drop those model overrides"
        )
    rebuilt = {key: value for key, value in configured.items() if key.startswith("_")}
    rebuilt.update(saved)
    return OmegaConf.create(rebuilt)


def _overridden_model_keys(user_overrides: list[str], configured: dict) -> set[str]:
    """Top-level model keys the command line set: `model=NAME` sets them all."""
    keys: set[str] = set()
    for item in user_overrides:
        name = item.lstrip("+~").split("=", 1)[0]
        if name == "model":
            keys.update(configured)
        elif name.startswith("model."):
            keys.add(name.split(".")[1])
    return {key for key in keys if not key.startswith("_")}


def checkpoint_data_config(cfg, checkpoint: str | Path, user_overrides: list[str]):
    """The data config of the run that wrote `checkpoint` (its `.hydra/config.yaml`), unless
    the user chose the data on the command line or the run directory has no config."""
    from omegaconf import OmegaConf

    if any(item.lstrip("+~").startswith("data") for item in user_overrides):
        return cfg.data
    saved = Path(checkpoint).resolve().parent.parent / ".hydra" / "config.yaml"
    if not saved.is_file():
        return cfg.data
    try:
        return OmegaConf.load(saved).data
    except Exception:  # not our config: keep the current one
        return cfg.data


# --------------------------------------------------------------------------------------------
# which engine can read which checkpoint
def _strategy_target(cfg) -> str:
    strategy = cfg.trainer.get("strategy") if "trainer" in cfg else None
    if hasattr(strategy, "get"):
        return str(strategy.get("_target_", ""))
    return str(strategy or "")


def check_engine_reads(cfg, command: str, checkpoint: str | Path) -> None:
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

def check_fits_model(checkpoint: str | Path, model) -> None:
    """Raise CheckpointError unless `checkpoint` can be loaded into `model` (a fit continuing it):
    same parameters, same shapes. Names the model settings that differ when it can."""
    contents = read_checkpoint(checkpoint)
    if is_deepspeed_folder(checkpoint):
        # Its weights are in the engine's shards: compare the settings the model was built with.
        saved = contents.get("hyper_parameters") or {}
        current = dict(getattr(model, "hparams", {}) or {})
        settings = [key for key in sorted(saved)
                    if key in current and key not in _NOT_ARCHITECTURE and saved[key] != current[key]]
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
        raise CheckpointError(f"cannot read the checkpoint {str(checkpoint)!r}: it holds no state_dict (not a fit's checkpoint)")
    own = model.state_dict()
    differing = sorted(
        name for name in set(own) | set(state)
        if name not in own or name not in state or tuple(own[name].shape) != tuple(state[name].shape)
    )
    if not differing:
        return
    saved = contents.get("hyper_parameters") or {}
    current = dict(getattr(model, "hparams", {}) or {})
    settings = [key for key in sorted(saved) if key in current and key not in _NOT_ARCHITECTURE and saved[key] != current[key]]
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


def saved_codec(checkpoint: str | Path):
    """The vocabulary the data module saved in `checkpoint` (a TokenCodec), or None when it has none."""
    from collections.abc import Mapping

    from sru_lightning.data import TokenCodec

    for entry in read_checkpoint(checkpoint).values():  # filed under the data module's class name
        if isinstance(entry, Mapping) and isinstance(entry.get("token_codec"), Mapping):
            return TokenCodec.from_state_dict(entry["token_codec"])
    return None
