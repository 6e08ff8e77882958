"""One command's run context: what `fit`, `validate` or `test` knows before Hydra starts and
what Hydra's callbacks find out before the task runs, in one object the CLI builds once and
hands to whatever needs it.

* The CLI builds a :class:`RunContext` (the command and its overrides as typed)
  and hands it to the task (a closure argument), to :func:`~.run.run` and its attempt, to the
  folder guard, the sweep summary and the lost-job watchdog, and releases its holds at the end.
* :class:`~.directories.RunDirectoryGuard` records into :attr:`RunContext.found` what it learns
  (the output folder's snapshot, Hydra's subfolder, the run an evaluation evaluates), and the
  holds it takes go into :attr:`RunContext.held`; :class:`~sru_lightning.app.sweep.SweepSummary`
  records the sweep under way.

Why a context variable: Hydra instantiates its callbacks from config (conf/hydra/default.yaml),
so nothing can be passed to their constructors, and a config node cannot carry a live object.
The CLI therefore makes the context active for the length of the command (:func:`activated`, a
`with` block in one place) and the callbacks read it with :func:`active_context`. Nothing
assigns a module's global: a second command in the same process (a test calling the CLI twice)
starts with a context of its own, and one that ended leaves nothing behind.

A launcher that runs jobs in other processes (joblib, submitit) pickles the task, and the
context with it: a job in another process gets the command and overrides only (what the
callbacks found, and the holds, are this process's own).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .folder import RunFolder
from .hold import HeldFolders

__all__ = ["FoundByHydra", "RunContext", "activated", "active_context"]


@dataclass
class FoundByHydra:
    """What Hydra's callbacks find out before the task runs (this process only). The modules that
    record a field define its type (this module is below them both)."""

    #: The single run's folder as it was before Hydra wrote into it (RunDirectoryGuard.on_run_start).
    directory: Any = None  # a directories.DirectorySnapshot
    #: Hydra's subfolder of a run (`hydra.output_subdir`); None when Hydra saves no config.
    output_subdir: str | None = RunFolder.HYDRA_DIR
    #: An evaluation's own folder -> the run folder it was pointed at by hydra.run.dir.
    evaluated_runs: dict[Path, Path] = field(default_factory=dict)
    #: The sweep under way, until its summary is written (SweepSummary.on_multirun_start).
    sweep: Any = None  # a sweep.SweepUnderWay


@dataclass(frozen=True)
class RunContext:
    """One command of the CLI: `command` (fit, validate, test) and its `overrides` as the user typed them."""

    command: str
    overrides: tuple[str, ...] = ()
    #: The folders this command holds (:mod:`.hold`), given back when it ends.
    held: HeldFolders = field(default_factory=HeldFolders, compare=False)
    found: FoundByHydra = field(default_factory=FoundByHydra, compare=False)

    def evaluated_run(self, output_dir: Path) -> Path | None:
        """The run an evaluation writing into `output_dir` was pointed at with hydra.run.dir, if any."""
        return self.found.evaluated_runs.get(Path(output_dir).absolute())

    def attempt_config_path(self, output_dir: Path) -> Path | None:
        """Where Hydra saved this attempt's composed config (`.hydra/config.yaml`), None when it saves none."""
        if self.found.output_subdir is None:
            return None
        return Path(output_dir) / self.found.output_subdir / RunFolder.CONFIG_FILE

    def __reduce__(self) -> tuple[Any, ...]:
        # A job pickled into another process: the command only; the holds and what the
        # callbacks found belong to this process.
        return (RunContext, (self.command, self.overrides))


_active: ContextVar[RunContext] = ContextVar("sru_lightning_run_context")


@contextmanager
def activated(context: RunContext) -> Iterator[RunContext]:
    """Make `context` the one Hydra's callbacks see until the block ends; its holds are given back then."""
    token = _active.set(context)
    try:
        yield context
    finally:
        context.held.release_all()
        _active.reset(token)


def active_context(command: str = "fit") -> RunContext:
    """The context of the command under way; outside one (Hydra run by other code, a job in a
    launcher's own process) a new context for `command`, which holds its folders by itself."""
    try:
        return _active.get()
    except LookupError:
        return RunContext(command)
