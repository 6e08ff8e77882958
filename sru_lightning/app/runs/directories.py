"""Nothing a user had is changed by an attempt that does not go ahead.

Hydra creates the run directory, writes `.hydra/{config,hydra,overrides}.yaml` and opens the
log file before the task runs. :class:`RunDirectoryGuard` (a Hydra callback, registered in
conf/hydra/default.yaml) remembers what the directory held just before that, so that:

* a usage error leaves an existing run directory byte for byte as it was, and removes a
  directory the attempt created, with the empty folders created around it
  (`restore_after_usage_error`);
* an attempt that started and failed keeps the run's own `.hydra` config, and its own config
  beside it in `.hydra/attempt-<time>/` (`keep_config_beside`);
* a sweep into a `hydra.sweep.dir` that already holds the jobs of an earlier sweep is refused
  before any job writes there, unless it continues them (`ckpt_path=...`);
* `validate`/`test` pointed at a run's own directory (`hydra.run.dir=<run>`) never write into
  the run: their config, log and record go to `<run>/evaluations/<command>-<time>/`, and the
  run is what they evaluate unless `ckpt_path` names other weights.

What the guard finds out goes into the command's :class:`~.context.RunContext` (its `found`
record), which Hydra's callbacks reach as :func:`~.context.active_context`; the folders it holds
go into the context's `held`, given back when the command ends.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback

from sru_lightning.app.runs.context import RunContext, active_context
from sru_lightning.app.runs.folder import RunFolder
from sru_lightning.app.runs.hold import FolderHeld, holder_of
from sru_lightning.app.runs.jobs import sweep_job_order
from sru_lightning.app.usage import PROG, CommandExit, error_exit


def usage_exit(message: str) -> CommandExit:
    """A usage error: status 2."""
    return error_exit(message, 2)


@dataclass
class DirectorySnapshot:
    """What a run directory held before an attempt: which files, their bytes and times."""

    path: Path
    existed: bool
    hydra_files: dict[str, tuple[bytes, int]] = field(default_factory=dict)  # bytes, mtime in ns
    log_sizes: dict[str, tuple[int, int]] = field(default_factory=dict)  # size, mtime in ns
    entries: frozenset[str] = frozenset()
    hydra_entries: frozenset[str] = frozenset()
    #: The outermost folder the attempt creates around a new run directory (`outputs/<date>/`).
    first_created: Path | None = None

    @classmethod
    def take(cls, path: Path, output_subdir: str | None) -> DirectorySnapshot:
        path = Path(path).absolute()
        if not path.is_dir():
            missing = [folder for folder in (path, *path.parents) if not os.path.lexists(folder)]
            return cls(path, existed=False, first_created=missing[-1] if missing else None)
        snapshot = cls(path, existed=True, entries=frozenset(os.listdir(path)))
        hydra_dir = path / (output_subdir or RunFolder.HYDRA_DIR)
        if hydra_dir.is_dir():
            snapshot.hydra_entries = frozenset(os.listdir(hydra_dir))
            for name in RunFolder.HYDRA_FILES:
                file = hydra_dir / name
                if file.is_file():
                    snapshot.hydra_files[name] = (file.read_bytes(), file.stat().st_mtime_ns)
        for file in path.glob("*.log"):
            snapshot.log_sizes[file.name] = (file.stat().st_size, file.stat().st_mtime_ns)
        return snapshot


EVALUATIONS_DIR = "evaluations"


def _evaluation_folder(config, run_dir: Path, context: RunContext) -> DirectorySnapshot:
    """Point Hydra's run directory at a new folder of the run's `evaluations/` (before Hydra
    writes), made here: two evaluations started in one second take two folders. Its snapshot."""
    from omegaconf import read_write

    evaluations = run_dir / EVALUATIONS_DIR
    first_created = None if os.path.lexists(evaluations) else evaluations
    name = time.strftime(f"{context.command}-%Y-%m-%d_%H-%M-%S")
    folder, suffix = evaluations / name, 1
    while True:
        try:
            folder.mkdir(parents=True)
            break
        except FileExistsError:
            suffix += 1
            folder = evaluations / f"{name}.{suffix}"
        except OSError:  # a run folder that cannot take it: _check_can_create says why
            break
    with read_write(config.hydra.run):
        config.hydra.run.dir = str(folder)
    context.found.evaluated_runs[folder.absolute()] = run_dir.absolute()
    return DirectorySnapshot(folder.absolute(), existed=False, first_created=(first_created or folder).absolute())


def _close_file_logs(directory: Path) -> None:
    import logging

    for handler in list(logging.getLogger().handlers):
        if isinstance(handler, logging.FileHandler) and Path(handler.baseFilename).parent == directory:
            handler.close()
            logging.getLogger().removeHandler(handler)


def restore_after_usage_error(context: RunContext, output_dir: Path) -> None:
    """Undo what Hydra wrote for an attempt refused before it started."""
    snapshot = context.found.directory
    output_dir = Path(output_dir).absolute()
    if snapshot is None or snapshot.path != output_dir:
        return
    _close_file_logs(output_dir)
    # An evaluation started beside this run (`evaluations/`) is another command's: it stays.
    for name in set(os.listdir(output_dir)) - snapshot.entries - {EVALUATIONS_DIR}:
        target = output_dir / name
        shutil.rmtree(target) if target.is_dir() else target.unlink()
    if not snapshot.existed:
        try:
            output_dir.rmdir()
        except OSError:
            return
        _remove_created_parents(snapshot)
        return
    hydra_dir = output_dir / (context.found.output_subdir or RunFolder.HYDRA_DIR)
    if hydra_dir.is_dir():
        for name in set(os.listdir(hydra_dir)) - snapshot.hydra_entries:
            (hydra_dir / name).unlink(missing_ok=True)
        _put_back(hydra_dir, snapshot)
    for name, (size, mtime) in snapshot.log_sizes.items():
        log_file = output_dir / name
        if log_file.is_file():
            with open(log_file, "r+b") as handle:
                handle.truncate(size)
            os.utime(log_file, ns=(mtime, mtime))


def _remove_created_parents(snapshot: DirectorySnapshot) -> None:
    """The folders created around a refused run's new directory (`outputs/`, `outputs/<date>/`,
    `<run>/evaluations/`) go too, as long as nothing else has been put in them meanwhile."""
    if snapshot.first_created is None or snapshot.first_created == snapshot.path:
        return
    for folder in snapshot.path.parents:
        try:
            folder.rmdir()  # only an empty folder: another run started beside it stays
        except OSError:
            return
        if folder == snapshot.first_created:
            return


def _put_back(hydra_dir: Path, snapshot: DirectorySnapshot) -> None:
    for name, (content, mtime) in snapshot.hydra_files.items():
        file = hydra_dir / name
        file.write_bytes(content)
        os.utime(file, ns=(mtime, mtime))


def keep_config_beside(context: RunContext, output_dir: Path) -> Path | None:
    """After a failed attempt in an existing run directory: the run's own config goes back
    in place, the attempt's moves to `.hydra/attempt-<time>/`. Returns that folder."""
    snapshot = context.found.directory
    output_dir = Path(output_dir).absolute()
    if snapshot is None or snapshot.path != output_dir or not snapshot.hydra_files:
        return None
    hydra_dir = output_dir / (context.found.output_subdir or RunFolder.HYDRA_DIR)
    beside = hydra_dir / time.strftime("attempt-%Y-%m-%d_%H-%M-%S")
    beside.mkdir(parents=True, exist_ok=True)
    for name in RunFolder.HYDRA_FILES:
        if (hydra_dir / name).is_file():
            shutil.copy2(hydra_dir / name, beside / name)
    _put_back(hydra_dir, snapshot)
    return beside


def earlier_jobs(sweep_dir: Path) -> list[str]:
    """Job folders under `sweep_dir` that an earlier sweep left (a config, a result or checkpoints)."""
    if not sweep_dir.is_dir():
        return []
    found = [
        child
        for child in sweep_dir.iterdir()
        if child.is_dir()
        and any(
            (child / name).exists() for name in (RunFolder.HYDRA_DIR, RunFolder.RESULT_FILE, RunFolder.CHECKPOINTS_DIR)
        )
    ]
    return [child.name for child in sorted(found, key=sweep_job_order)]


def _check_can_create(directory: Path, setting: str) -> None:
    """A run or sweep directory that is a file, or cannot be created, is one line (Hydra would
    fail with a traceback when it makes the folder)."""
    if directory.exists() and not directory.is_dir():
        raise usage_exit(f"`{setting}` must be a folder, got {str(directory)!r}, which is a file")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise usage_exit(
            f"`{setting}` must be a folder that can be created, got {str(directory)!r}: {error.strerror or error}"
        ) from None


class RunDirectoryGuard(Callback):
    """Hydra callback: snapshot a run directory before Hydra writes into it; refuse a sweep
    into the directory of an earlier sweep."""

    def on_run_start(self, config, **kwargs: Any) -> None:
        context = active_context()
        found = context.found
        found.output_subdir = config.hydra.output_subdir or RunFolder.HYDRA_DIR
        run_dir = Path(str(config.hydra.run.dir)).absolute()
        evaluation = context.command in ("validate", "test")
        if evaluation and (RunFolder.holds_a_run(run_dir) or holder_of(run_dir) is not None):
            found.directory = _evaluation_folder(config, run_dir, context)
            run_dir = found.directory.path
        else:
            found.directory = DirectorySnapshot.take(run_dir, config.hydra.output_subdir)
        _check_can_create(run_dir, "hydra.run.dir")
        _hold(run_dir, "hydra.run.dir", config, context)
        jobs = earlier_jobs(run_dir)
        if jobs:  # a run's files beside a sweep's would be two runs' in one folder
            context.held.release_all()
            raise usage_exit(
                f"`hydra.run.dir` must be a folder of one run, got {str(run_dir)!r}, which holds the jobs of a sweep "
                f"({_listed(jobs)}); choose another hydra.run.dir"
            )

    def on_run_end(self, config, **kwargs: Any) -> None:
        active_context().held.release_all()

    def on_multirun_start(self, config, **kwargs: Any) -> None:
        context = active_context()
        sweep_dir = Path(str(config.hydra.sweep.dir))
        _check_can_create(sweep_dir.absolute(), "hydra.sweep.dir")
        _hold(sweep_dir.absolute(), "hydra.sweep.dir", config, context)
        if RunFolder.holds_a_run(sweep_dir):
            context.held.release_all()
            raise usage_exit(
                f"`hydra.sweep.dir` must be a new directory, got {str(sweep_dir)!r}, which holds a run "
                "(its checkpoints or record); choose another hydra.sweep.dir"
            )
        jobs = earlier_jobs(sweep_dir)
        setting = config.get("ckpt_path")
        if jobs and (setting is None or str(setting).strip() == ""):
            context.held.release_all()
            raise usage_exit(
                f"`hydra.sweep.dir` must be a new directory, got {str(sweep_dir)!r}, which holds the jobs of an "
                f"earlier sweep ({_listed(jobs)}); choose another hydra.sweep.dir, or pass ckpt_path=auto to continue "
                "those jobs"
            )

    def on_multirun_end(self, config, **kwargs: Any) -> None:
        active_context().held.release_all()


def _listed(jobs: list[str]) -> str:
    return ", ".join(jobs[:5]) + (", ..." if len(jobs) > 5 else "")


def _hold(directory: Path, setting: str, config, context: RunContext) -> None:
    """Hold `directory` for this command (:mod:`.hold`), before anything is written into it; a
    folder another run holds is refused in one line, and left as it was."""
    try:
        multirun = ["-m"] if setting == "hydra.sweep.dir" else []
        hold = context.held.take(directory, context.command, [*multirun, *config.hydra.overrides.task])
    except FolderHeld as held:  # nothing of this attempt is in the folder: it is the holder's
        raise usage_exit(
            f"`{setting}` must be a folder no other run is writing, got {str(directory)!r}: {held}; wait for it to "
            f"end or choose another {setting}"
        ) from None
    if hold.note:
        print(f"{PROG}: note: {hold.note}", file=sys.stderr, flush=True)
