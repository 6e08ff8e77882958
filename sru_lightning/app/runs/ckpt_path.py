"""The `ckpt_path` setting turned into a checkpoint, by one set of rules for every command that
takes a run: `fit` starting or resuming (`ckpt_path=<run>`, `auto`, `last`), `validate`/`test`
(:func:`resolve_checkpoint`), `generate` and `export` (:func:`model_checkpoint`), and sweep
jobs continuing their runs. A run directory names its newest checkpoint, the one with the
highest step recorded inside (:class:`~.folder.RunFolder`); `last` is the newest run under
`resume_dir` that may be continued (:func:`latest_continuable`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .checkpoints import CheckpointError, is_deepspeed_folder, read_model_checkpoint
from .folder import RunFolder, runs_under, section

log = logging.getLogger("sru_lightning")

__all__ = [
    "latest_continuable",
    "model_checkpoint",
    "named_checkpoint",
    "read_trained_checkpoint",
    "resolve_checkpoint",
]


def latest_continuable(
    root: Path, accept: Callable[[RunFolder], str | None] | None = None, exclude: Path | None = None
) -> Path | None:
    """The latest checkpoint of the most recently written run under `root` that may be continued
    (`why_not_continued`) and that `accept` takes (it returns None, or why not). Runs are
    ordered by when their latest checkpoint was written; within a run, by recorded step."""
    candidates = []
    for run in runs_under(root):
        if exclude is not None and run.directory == Path(exclude).absolute():
            continue
        latest = run.latest
        if latest is not None:
            candidates.append((latest.written, run))
    for _, run in sorted(candidates, key=lambda item: item[0], reverse=True):
        reason = run.why_not_continued() or (accept(run) if accept is not None else None)
        if reason is None:
            return run.latest.path
        log.info("ckpt_path=last: skipping %s: %s", run.directory, reason)
    return None


def named_checkpoint(setting: str, choices: str = "a checkpoint file, a run directory or 'last'") -> Path:
    """A `ckpt_path` other than `last` as an absolute checkpoint path: the file itself, a
    DeepSpeed checkpoint folder, or a run directory's latest checkpoint (by recorded step).
    `choices`: what the command's `ckpt_path` may be, for the error."""
    path = Path(setting).expanduser()
    if is_deepspeed_folder(path):
        return path.absolute()
    if path.is_dir():
        if path.name == RunFolder.CHECKPOINTS_DIR and not (path / RunFolder.CHECKPOINTS_DIR).is_dir():
            path = path.parent  # the run's checkpoints folder names the run
        return RunFolder(path).latest_named()
    if not path.is_file():
        raise CheckpointError(f"`ckpt_path` must be {choices}, got {setting!r}, which does not exist")
    return path.absolute()


def resolve_checkpoint(
    cfg, command: str, output_dir: Path, evaluated_run: Path | None = None, owner: Mapping[str, str] | None = None
) -> str | None:
    """Turn the `ckpt_path` setting of `fit`/`validate`/`test` into a checkpoint (or None for a
    fresh fit). `evaluated_run` is the run an evaluation was pointed at by `hydra.run.dir`;
    `owner` the job this attempt belongs to (:func:`.jobs.attempt_owner`).

    `auto` is this run directory's own newest checkpoint, else a fresh start; it is what an
    unset `ckpt_path` means inside a SLURM job, and what `last` means inside any job (a SLURM
    job or a sweep job): a job continues its own run, never another's."""
    setting = cfg.get("ckpt_path")
    unset = setting is None or str(setting).strip() == ""
    if unset and command == "fit" and owner and owner.get("slurm_job"):
        log.info(
            "ckpt_path: SLURM job %s continues its own run in %s, if it has one (ckpt_path=auto)",
            owner["slurm_job"],
            output_dir,
        )
        setting, unset = "auto", False
    if unset:
        if command == "fit":
            return None
        if evaluated_run is not None:
            return str(RunFolder(evaluated_run).latest_named())
        raise CheckpointError(
            f"`{command}` needs the weights to evaluate: pass ckpt_path=<run directory | .ckpt file | last>, "
            "got no ckpt_path (an untrained model's number means nothing)"
        )
    setting = str(setting)
    if setting == "last" and owner:
        log.info("ckpt_path=last in a job continues only the job's own run (%s)", output_dir)
        setting = "auto"
    if setting not in ("last", "auto"):
        return str(named_checkpoint(setting, "a checkpoint file, a run directory, 'auto' or 'last'"))

    own = RunFolder(evaluated_run or output_dir)
    if own.latest is not None:
        reason = own.why_not_continued()
        if reason is None:
            return str(own.latest.path)
        if own.status == "failed":
            raise CheckpointError(
                f"`ckpt_path={setting}`: {reason}, so its checkpoints are not resumed automatically; pass "
                f"ckpt_path=<one of its .ckpt files> to continue from it anyway, or choose another hydra.run.dir"
            )
        log.info("ckpt_path=%s: not resuming %s: %s", setting, own.directory, reason)
    if setting == "auto":
        if command != "fit":
            raise CheckpointError(
                f"`ckpt_path=auto`: {str(own.directory)!r} holds no checkpoint to evaluate; "
                "pass ckpt_path=<run or file>"
            )
        log.info("ckpt_path=auto: %s holds no checkpoint to continue; starting the run", own.directory)
        return None

    resume_dir = Path(str(cfg.get("resume_dir") or "outputs")).expanduser()
    if cfg.get("resume_dir") is not None and str(cfg.get("resume_dir")) != "outputs" and not resume_dir.is_dir():
        # A mistyped folder would otherwise mean a silent fresh start.
        raise CheckpointError(
            f"`resume_dir` must be a folder of earlier runs for ckpt_path=last, got {str(resume_dir)!r}, "
            "which does not exist"
        )
    found = latest_continuable(resume_dir, _same_run_settings(cfg, command), exclude=output_dir)
    if found is not None:
        log.info("ckpt_path=last: resuming from %s", found)
        return str(found)
    if command != "fit":
        raise CheckpointError(
            f"`ckpt_path=last` found no checkpoint of a run with this model and data config "
            f"under resume_dir={cfg.get('resume_dir')!r}; pass ckpt_path=/path/to/file.ckpt"
        )
    log.warning("ckpt_path=last: no earlier checkpoint for this model/data config; starting from scratch")
    return None


#: Model settings that say how the model runs or where its weights started, not what it is: a run
#: trained with another value is the same model (`model.compile`, `model.init_from`).
HOW_THE_MODEL_RUNS = ("compile", "init_from")


def _trained_model(model: Any) -> Any:
    if not isinstance(model, dict):
        return model
    return {key: value for key, value in model.items() if key not in HOW_THE_MODEL_RUNS}


def _same_run_settings(cfg, command: str) -> Callable[[RunFolder], str | None]:
    """For `ckpt_path=last`: a run qualifies when it trained this model on this data and the
    configured engine can read its latest checkpoint."""
    from omegaconf import OmegaConf

    from .checkpoints import check_engine_reads

    model = _trained_model(OmegaConf.to_container(cfg.model, resolve=True))
    data = OmegaConf.to_container(cfg.data, resolve=True)

    def accept(run: RunFolder) -> str | None:
        from .jobs import owned_elsewhere

        elsewhere = owned_elsewhere(run.owner(), run.directory)
        if elsewhere is not None:
            return elsewhere
        config = run.config()
        if _trained_model(section(config, "model")) != model or section(config, "data") != data:
            return "another model or data config"
        try:
            check_engine_reads(cfg, command, run.latest.path)
        except CheckpointError as error:
            return str(error)
        return None

    return accept


def model_checkpoint(setting: str, resume_dir: str) -> Path:
    """The checkpoint a command that reads a trained model (generate, export) is pointed at:
    `ckpt_path` as for a run, except that `last` is the latest checkpoint of the most recently
    written run under `resume_dir` that trained and did not fail, whatever its model or data."""
    if setting != "last":
        return named_checkpoint(setting)
    found = latest_continuable(Path(resume_dir).expanduser())
    if found is None:
        raise CheckpointError(
            f"`ckpt_path=last` found no checkpoint of a trained run under "
            f"resume_dir={resume_dir!r}; pass ckpt_path=<run directory or .ckpt file>"
        )
    return found


def read_trained_checkpoint(setting: str, resume_dir: str, command: str) -> tuple[Path, dict[str, Any]]:
    """The checkpoint a command that reads a trained model is pointed at (:func:`model_checkpoint`)
    and its contents. A run that a fit is writing never shows half a file (checkpoints are written
    beside and renamed), but it may delete the checkpoint just chosen (a top-k file rolled over):
    then the newest is chosen again, rather than failing or waiting for the fit."""
    for _ in range(4):
        path = model_checkpoint(setting, resume_dir)
        try:
            return path, read_model_checkpoint(path, command)
        except CheckpointError:
            if path.exists():
                raise
    path = model_checkpoint(setting, resume_dir)
    return path, read_model_checkpoint(path, command)
