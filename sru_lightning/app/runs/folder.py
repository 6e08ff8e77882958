"""A run, read once: the one place that says what a run directory holds.

A run directory holds `checkpoints/` (any number of `.ckpt` files and DeepSpeed checkpoint
folders, whatever Lightning named them: `last.ckpt`, `last-v1.ckpt`, `interrupted.ckpt`, a
top-k file, a copy), `result.json` and `history.jsonl` (:mod:`.records`), and Hydra's
`.hydra/`. Nothing here trusts a file name or a modification time to say which checkpoint is
newest: the newest is the one with the highest optimizer step recorded inside it (the latest
written wins a tie), so a moved, copied or renamed run answers exactly as the original.

Every checkpoint a run writes also carries the run's configuration as it trained
(:class:`SaveRunConfig`, under :data:`RUN_CONFIG_KEY`), and the format version
(:mod:`sru_lightning.models.checkpoint_format`): the settings that produced those weights travel
with them, so a checkpoint named by run directory, by file, or as a copy elsewhere is evaluated
and resumed with the same settings.

Every command that takes a run asks this module: `fit` resuming (`ckpt_path=<run>`, `last`),
`validate`/`test`, `generate`, `export`, and sweep jobs continuing their runs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import Callback

from sru_lightning.models.checkpoint_format import stamp_format

from .checkpoint_index import indexed_entry, read_index
from .checkpoints import (
    CHECKPOINTS_DIR,
    RUN_CONFIG_KEY,
    RUN_ID_KEY,
    RUN_OWNER_KEY,
    CheckpointError,
    LoadedCheckpoint,
    is_deepspeed_folder,
    load_checkpoint,
)
from .records import RESULT_FILE, RecordFormatError, read_result, run_status

log = logging.getLogger("sru_lightning")

__all__ = [
    "CHECKPOINTS_DIR",
    "RUN_CONFIG_KEY",
    "RUN_ID_KEY",
    "RUN_OWNER_KEY",
    "RunFolder",
    "SaveRunConfig",
    "SavedCheckpoint",
    "resolve_checkpoint",
]
#: Commands' top-level settings that say what to do, not how the run trains.
COMMAND_SETTINGS = ("ckpt_path", "resume_dir", "optimized_metric")


@dataclass(frozen=True)
class SavedCheckpoint:
    """One checkpoint of a run: where it is, the optimizer step recorded inside it, and the
    identity, owner and configuration of the run that wrote it (from the run's index, else read)."""

    path: Path
    step: int
    written: float  # modification time: only breaks a tie between checkpoints of one step
    run_id: str | None = None
    owner: Mapping[str, Any] | None = field(default=None, compare=False)
    config: Mapping[str, Any] | None = field(default=None, compare=False)

    @property
    def resumable(self) -> bool:
        """It holds at least one optimizer step (a model that never trained is not worth resuming)."""
        return self.step >= 1


def saved_checkpoint(path: Path, index: Mapping[str, Mapping[str, Any]] | None = None) -> SavedCheckpoint:
    """The checkpoint at `path`, from its entry in the run's `index` when that still describes the
    file, else read; CheckpointError when it cannot be read."""
    entry = indexed_entry(path, index) if index else None
    if entry is not None:
        owner, config, run_id = entry.get("owner"), entry.get("config"), entry.get("run_id")
        return SavedCheckpoint(
            path.absolute(),
            entry["step"],
            path.stat().st_mtime,
            run_id if isinstance(run_id, str) and run_id else None,
            owner if isinstance(owner, Mapping) else None,
            config if isinstance(config, Mapping) else None,
        )
    loaded = load_checkpoint(path)
    return SavedCheckpoint(
        path.absolute(), loaded.step, path.stat().st_mtime, loaded.run_id, loaded.owner, loaded.run_config
    )


def checkpoint_candidates(folder: Path) -> Iterator[Path]:
    """The checkpoint files and DeepSpeed checkpoint folders directly in `folder` (partial
    writes, named `*.partial`, are not checkpoints)."""
    if not folder.is_dir():
        return
    for entry in sorted(folder.iterdir()):
        if entry.name.endswith(".partial"):
            continue
        if (entry.is_file() and entry.suffix == ".ckpt") or is_deepspeed_folder(entry):
            yield entry


class RunFolder:
    """A run directory: its checkpoints (newest by recorded step), its config and its record."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory).expanduser().absolute()
        self.unreadable: list[str] = []  # why each checkpoint file that could not be read was skipped

    def __repr__(self) -> str:
        return f"RunFolder({str(self.directory)!r})"

    # -- what the folder is ------------------------------------------------------------------
    @staticmethod
    def holds_a_run(directory: str | Path) -> bool:
        """True when `directory` is a run that trained (or tried to): it has checkpoints or a record."""
        directory = Path(directory)
        return (directory / CHECKPOINTS_DIR).is_dir() or (directory / RESULT_FILE).is_file()

    @classmethod
    def around(cls, checkpoint: str | Path) -> RunFolder | None:
        """The run a checkpoint lies in (`<run>/checkpoints/<file>`), or None for a loose file."""
        parent = Path(checkpoint).expanduser().absolute().parent
        if parent.name == CHECKPOINTS_DIR:
            return cls(parent.parent)
        return None

    @property
    def status(self) -> str | None:
        """The status of the run's latest attempt (result.json), None when it has no record;
        CheckpointError when the record is of another format."""
        try:
            return run_status(self.directory)
        except RecordFormatError as error:
            raise CheckpointError(str(error)) from None

    # -- checkpoints -------------------------------------------------------------------------
    @cached_property
    def checkpoints(self) -> list[SavedCheckpoint]:
        """Every readable checkpoint of the run, oldest first (by step, then by time written), as
        the run's index says (a file it does not describe is read). An unreadable file is skipped
        with a log line: it cannot be the run's newest weights."""
        found = []
        index = read_index(self.directory / CHECKPOINTS_DIR)
        for path in checkpoint_candidates(self.directory / CHECKPOINTS_DIR):
            try:
                found.append(saved_checkpoint(path, index))
            except (CheckpointError, OSError) as error:
                self.unreadable.append(str(error).splitlines()[0])
                log.info("skipping %s: %s", path, self.unreadable[-1])
        return sorted(found, key=lambda saved: (saved.step, saved.written))

    @property
    def latest(self) -> SavedCheckpoint | None:
        """The checkpoint with the highest recorded step (the latest written among equals)."""
        return self.checkpoints[-1] if self.checkpoints else None

    def latest_named(self) -> Path:
        """The latest checkpoint, for a command that names this run; CheckpointError when it has none."""
        latest = self.latest
        if latest is None:
            if _is_export_folder(self.directory):
                from sru_lightning.export.package import MANIFEST_NAME

                raise CheckpointError(
                    f"`ckpt_path` is the directory {str(self.directory)!r}, an export folder ({MANIFEST_NAME}), "
                    f"not a run: it holds no checkpoint; generate with it through model={self.directory}"
                )
            where = self.directory / CHECKPOINTS_DIR
            why = f" ({self.unreadable[0]})" if self.unreadable else ""
            raise CheckpointError(
                f"`ckpt_path` is the directory {str(self.directory)!r}, which holds no readable checkpoint "
                f"in {str(where)!r}{why}; point ckpt_path at a .ckpt file or at a run directory that trained"
            )
        return latest.path

    def why_not_continued(self) -> str | None:
        """None when `ckpt_path=last` may continue this run from its latest checkpoint, else why not."""
        try:
            if self.status == "failed":
                return f"the run in {str(self.directory)!r} failed"
        except CheckpointError as error:
            return str(error)
        latest = self.latest
        if latest is None:
            return f"{str(self.directory)!r} holds no readable checkpoint"
        if not latest.resumable:
            return f"{str(latest.path)!r} holds no optimizer step"
        return None

    def owner(self) -> dict[str, Any] | None:
        """The job that owns the run (a SLURM job, a sweep job), from its latest checkpoint or record."""
        latest = self.latest
        if latest is not None and latest.owner is not None:
            return dict(latest.owner)
        try:
            record = read_result(self.directory)
        except RecordFormatError as error:
            raise CheckpointError(str(error)) from None
        owner = record.get("owner") if record is not None else None
        return dict(owner) if isinstance(owner, Mapping) else None

    # -- configuration -----------------------------------------------------------------------
    def config(self) -> Any | None:
        """The configuration the run's latest checkpoint trained with (a DictConfig), or None."""
        latest = self.latest
        return _as_config(latest.config) if latest is not None else None


def checkpoint_run_config(loaded: LoadedCheckpoint):
    """The run configuration saved inside the checkpoint (a DictConfig), or None for a checkpoint
    written outside a run (a Trainer of the user's own)."""
    return _as_config(loaded.run_config)


def _as_config(saved: Mapping[str, Any] | None):
    from omegaconf import OmegaConf

    return OmegaConf.create(dict(saved)) if saved is not None else None


def section(config, key: str) -> dict | None:
    """`config[key]` resolved to plain values (model, data), None when it is missing or cannot resolve."""
    from omegaconf import OmegaConf

    if config is None or key not in config:
        return None
    try:
        return OmegaConf.to_container(config[key], resolve=True)
    except Exception:  # an interpolation that needs a Hydra run is not comparable
        return None


# --------------------------------------------------------------------------------------------
# finding a run to continue
def runs_under(root: Path) -> Iterator[RunFolder]:
    """Every run directory below `root` (a folder holding `checkpoints/`)."""
    if not root.is_dir():
        return
    for checkpoints in sorted(root.rglob(CHECKPOINTS_DIR)):
        if checkpoints.is_dir():
            yield RunFolder(checkpoints.parent)


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


# --------------------------------------------------------------------------------------------
# what every checkpoint of a run carries
class SaveRunConfig(Callback):
    """Writes the format version, the run's configuration, its identity (:mod:`.identity`) and its
    owner into every checkpoint it saves (see the module docstring).

    The configuration is stored unresolved, as plain values, so the checkpoint stays loadable
    with `weights_only=True` and a moved run's paths are not baked in.
    """

    def __init__(
        self, config: Mapping[str, Any], owner: Mapping[str, str] | None = None, run_id: str | None = None
    ) -> None:
        super().__init__()
        self.config = dict(config)
        self.owner = dict(owner or {})
        self.run_id = run_id

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict[str, Any]) -> None:
        stamp_format(checkpoint)
        checkpoint[RUN_CONFIG_KEY] = self.config
        if self.run_id:
            checkpoint[RUN_ID_KEY] = self.run_id
        if self.owner:
            checkpoint[RUN_OWNER_KEY] = self.owner


def plain_config(cfg) -> dict[str, Any]:
    """The run's config without Hydra's own node and the command settings, as plain values."""
    from omegaconf import OmegaConf

    container = OmegaConf.to_container(cfg, resolve=False)
    for key in ("hydra", *COMMAND_SETTINGS):
        container.pop(key, None)
    return container


def _is_export_folder(directory: Path) -> bool:
    """Whether `directory` holds a manifest written by `export` (not any manifest.json)."""
    import json

    from sru_lightning.export.package import FORMAT_NAME, MANIFEST_NAME

    try:
        manifest = json.loads((directory / MANIFEST_NAME).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and manifest.get("format_name") == FORMAT_NAME


# --------------------------------------------------------------------------------------------
# the `ckpt_path` setting -> a checkpoint
def named_checkpoint(setting: str, choices: str = "a checkpoint file, a run directory or 'last'") -> Path:
    """A `ckpt_path` other than `last` as an absolute checkpoint path: the file itself, a
    DeepSpeed checkpoint folder, or a run directory's latest checkpoint (by recorded step).
    `choices`: what the command's `ckpt_path` may be, for the error."""
    path = Path(setting).expanduser()
    if is_deepspeed_folder(path):
        return path.absolute()
    if path.is_dir():
        if path.name == CHECKPOINTS_DIR and not (path / CHECKPOINTS_DIR).is_dir():
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


#: Model settings that say how the model runs, not what it is: a run trained with another value
#: is the same model (`model.compile`).
HOW_THE_MODEL_RUNS = ("compile",)


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
