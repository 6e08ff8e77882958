"""A run directory, read once: the one place that says what a run directory holds and where.

A run directory holds `checkpoints/` (any number of `.ckpt` files and DeepSpeed checkpoint
folders, whatever Lightning named them: `last.ckpt`, `last-v1.ckpt`, `interrupted.ckpt`, a
top-k file, a copy) with its index `checkpoints.json` beside it (:mod:`.checkpoint_index`),
`result.json` and `history.jsonl` (:mod:`.records`), and Hydra's `.hydra/`. Those names are
:class:`RunFolder`'s class attributes; every other module asks it for them.

Nothing here trusts a file name or a modification time to say which checkpoint is newest: the
newest is the one with the highest optimizer step recorded inside it (the latest written wins
a tie), so a moved, copied or renamed run answers exactly as the original. Every checkpoint a
run writes also carries the run's configuration as it trained (:mod:`.save_run_config`), which
:meth:`RunFolder.config` gives back. Which checkpoint a `ckpt_path` setting names is decided
by :mod:`.ckpt_path`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from .checkpoint_index import indexed_entry, read_index
from .checkpoints import CheckpointError, LoadedCheckpoint, is_deepspeed_folder, load_checkpoint
from .records import RecordFormatError, append_record, read_record, write_record_file

log = logging.getLogger("sru_lightning")

__all__ = ["RunFolder", "SavedCheckpoint", "checkpoint_candidates", "checkpoint_run_config", "runs_under"]


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

    # -- the layout: the names of what a run directory holds ---------------------------------
    #: The folder of the run's checkpoints.
    CHECKPOINTS_DIR = "checkpoints"
    #: The run's index of its checkpoints, beside CHECKPOINTS_DIR (:mod:`.checkpoint_index`).
    INDEX_FILE = "checkpoints.json"
    #: The record of the run's latest attempt (:mod:`.records`).
    RESULT_FILE = "result.json"
    #: One record per attempt, one a line (:mod:`.records`).
    HISTORY_FILE = "history.jsonl"
    #: Hydra's folder of the attempt's config (Hydra's default `hydra.output_subdir`).
    HYDRA_DIR = ".hydra"
    #: What Hydra writes into HYDRA_DIR: the composed config, Hydra's own, the command line's overrides.
    CONFIG_FILE = "config.yaml"
    HYDRA_FILE = "hydra.yaml"
    OVERRIDES_FILE = "overrides.yaml"
    HYDRA_FILES = (CONFIG_FILE, HYDRA_FILE, OVERRIDES_FILE)
    #: The hold of the process writing the run (:mod:`.hold`): one run per folder.
    HOLD_FILE = ".hold"
    #: Every name above (what a test keeps out of the other modules).
    LAYOUT_NAMES = (CHECKPOINTS_DIR, INDEX_FILE, RESULT_FILE, HISTORY_FILE, HYDRA_DIR, *HYDRA_FILES, HOLD_FILE)

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory).expanduser().absolute()
        self.unreadable: list[str] = []  # why each checkpoint file that could not be read was skipped

    def __repr__(self) -> str:
        return f"RunFolder({str(self.directory)!r})"

    # -- where things are --------------------------------------------------------------------
    @property
    def checkpoints_dir(self) -> Path:
        return self.directory / self.CHECKPOINTS_DIR

    @property
    def index_file(self) -> Path:
        return self.directory / self.INDEX_FILE

    @property
    def result_file(self) -> Path:
        return self.directory / self.RESULT_FILE

    @property
    def history_file(self) -> Path:
        return self.directory / self.HISTORY_FILE

    @classmethod
    def index_of(cls, checkpoint: str | Path) -> Path | None:
        """The index of the run a checkpoint file is written into (`<run>/checkpoints.json`
        beside `<run>/checkpoints/<file>`), None when it is not in a run's checkpoints folder."""
        folder = Path(checkpoint).parent
        return folder.parent / cls.INDEX_FILE if folder.name == cls.CHECKPOINTS_DIR else None

    # -- what the folder is ------------------------------------------------------------------
    @classmethod
    def holds_a_run(cls, directory: str | Path) -> bool:
        """True when `directory` is a run that trained (or tried to): it has checkpoints or a record."""
        directory = Path(directory)
        return (directory / cls.CHECKPOINTS_DIR).is_dir() or (directory / cls.RESULT_FILE).is_file()

    @classmethod
    def around(cls, checkpoint: str | Path) -> RunFolder | None:
        """The run a checkpoint lies in (`<run>/checkpoints/<file>`), or None for a loose file."""
        parent = Path(checkpoint).expanduser().absolute().parent
        if parent.name == cls.CHECKPOINTS_DIR:
            return cls(parent.parent)
        return None

    # -- records -----------------------------------------------------------------------------
    def result(self) -> dict[str, Any] | None:
        """The record of the run's latest attempt; None when it has none or it is not JSON (a
        partial copy). RecordFormatError for a record of another format."""
        return read_record(self.result_file)

    def write_result(self, record: dict[str, Any]) -> Path:
        """Make `record` (status, command, overrides, metrics, error) the run's result record."""
        return write_record_file(self.result_file, record)

    def write_record(self, record: dict[str, Any], *, keep_result: bool = False) -> None:
        """Append the attempt to the run's history and make it the run's result, unless
        `keep_result`: an attempt refused before it started leaves an earlier run's result alone."""
        if not (keep_result and self.result_file.is_file()):
            self.write_result(record)
        append_record(self.history_file, record)

    @property
    def status(self) -> str | None:
        """The status of the run's latest attempt (result.json), None when it has no record;
        CheckpointError when the record is of another format."""
        try:
            record = self.result()
        except RecordFormatError as error:
            raise CheckpointError(str(error)) from None
        return record.get("status") if record is not None else None

    # -- checkpoints -------------------------------------------------------------------------
    @cached_property
    def checkpoints(self) -> list[SavedCheckpoint]:
        """Every readable checkpoint of the run, oldest first (by step, then by time written), as
        the run's index says (a file it does not describe is read). An unreadable file is skipped
        with a log line: it cannot be the run's newest weights."""
        found = []
        index = read_index(self.index_file)
        for path in checkpoint_candidates(self.checkpoints_dir):
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
            where = self.checkpoints_dir
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
            record = self.result()
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


def runs_under(root: Path) -> Iterator[RunFolder]:
    """Every run directory below `root` (a folder holding `checkpoints/`)."""
    if not root.is_dir():
        return
    for checkpoints in sorted(root.rglob(RunFolder.CHECKPOINTS_DIR)):
        if checkpoints.is_dir():
            yield RunFolder(checkpoints.parent)


def _is_export_folder(directory: Path) -> bool:
    """Whether `directory` holds a manifest written by `export` (not any manifest.json)."""
    import json

    from sru_lightning.export.package import FORMAT_NAME, MANIFEST_NAME

    try:
        manifest = json.loads((directory / MANIFEST_NAME).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and manifest.get("format_name") == FORMAT_NAME
