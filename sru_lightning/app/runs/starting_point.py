"""Where an attempt starts: which checkpoint, and the configuration it runs with.

A fresh `fit` runs the composed config. A command that starts from a checkpoint (a resumed or
continued `fit`, `validate`, `test`) runs the configuration the checkpoint trained with
(:func:`.folder.checkpoint_run_config`), with the settings the command line names put on top
under the one rule of :mod:`.changes`. A checkpoint that carries no run configuration (one a
Trainer of the user's own wrote) is taken with the composed config, its model rebuilt from the
checkpoint's own constructor arguments.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .changes import Change, judge, kept_run_callbacks, merged_config, refuse_unfollowable, resume_callback
from .checkpoints import LoadedCheckpoint, check_engine_reads, load_checkpoint
from .ckpt_path import resolve_checkpoint
from .folder import RunFolder, checkpoint_candidates, checkpoint_run_config
from .identity import new_run_id, run_id_to_continue, why_another_run

if TYPE_CHECKING:
    from .context import RunContext

log = logging.getLogger("sru_lightning")


class ConfigSource(enum.Enum):
    """Where an attempt's settings come from (recorded in `result.json` as `settings_from`)."""

    COMMAND_LINE = "command line"
    CHECKPOINT = "the settings saved with the checkpoint"
    COMMAND_LINE_AROUND_CHECKPOINT = "command line (the checkpoint carries no run config)"


@dataclass
class StartingPoint:
    """The config an attempt runs with, and the checkpoint it starts from (None: fresh), as read
    once (`loaded`: the model's checks and the evaluation's vocabulary take it from there)."""

    cfg: Any
    checkpoint: str | None = None
    step: int = 0
    changes: list[Change] = field(default_factory=list)
    config_source: ConfigSource = ConfigSource.COMMAND_LINE
    run_id: str = field(default_factory=new_run_id)  # the run this attempt writes (see .identity)
    loaded: LoadedCheckpoint | None = field(default=None, repr=False)

    def callbacks(self) -> list:
        """Callbacks that apply the changed settings to a restored training state."""
        found = resume_callback(self.changes) if self.checkpoint is not None else None
        return [found] if found is not None else []

    def changes_record(self) -> dict[str, Any]:
        return {change.key: change.as_record() for change in self.changes}


def starting_point(
    cfg,
    command: str,
    output_dir: Path,
    overrides: list[str],
    evaluated_run: Path | None = None,
    owner: dict[str, str] | None = None,
) -> StartingPoint:
    """Resolve `ckpt_path` and the configuration the attempt runs with; UsageError/CheckpointError
    for a setting that cannot be honoured."""
    from sru_lightning.app.usage import UsageError

    checkpoint = resolve_checkpoint(cfg, command, output_dir, evaluated_run, owner)
    if command == "fit" and checkpoint is None:
        earlier = list(checkpoint_candidates(Path(output_dir) / RunFolder.CHECKPOINTS_DIR))
        if earlier:
            # A fresh fit would write over them; continuing must be asked for.
            raise UsageError(
                f"the run directory {str(output_dir)!r} already holds checkpoints of an earlier run "
                f"({', '.join(p.name for p in earlier[:3])}); pass ckpt_path=auto to continue that run, "
                "or choose another hydra.run.dir"
            )
        return StartingPoint(cfg)
    if checkpoint is None:
        return StartingPoint(cfg)
    loaded = load_checkpoint(checkpoint)
    if command == "fit":
        held = why_another_run(loaded, output_dir)
        if held is not None:
            # Resuming would write this checkpoint's run over the one the directory holds.
            raise UsageError(
                f"the run directory {str(output_dir)!r} already holds checkpoints of an earlier run ({held}), "
                f"not of the run of ckpt_path={str(checkpoint)!r}; pass ckpt_path=auto to continue the run it "
                "holds, or choose another hydra.run.dir to continue the other"
            )
    check_engine_reads(cfg, command, checkpoint, loaded)
    step = loaded.step
    saved = checkpoint_run_config(loaded)
    source = ConfigSource.CHECKPOINT
    if saved is None:
        saved = _config_around_model(cfg, loaded.contents)
        source = ConfigSource.COMMAND_LINE_AROUND_CHECKPOINT
    merged = merged_config(saved, cfg, overrides, keep_run_callbacks=command == "fit")
    changes = judge(saved, merged, command, str(checkpoint), step)
    if command == "fit":
        refuse_unfollowable(changes, merged, str(checkpoint))
    return StartingPoint(merged, str(checkpoint), step, changes, source, run_id_to_continue(loaded), loaded)


def start_attempt(
    cfg, command: str, output_dir: Path, overrides: list[str], owner: dict[str, str] | None, context: RunContext
):
    """The attempt's starting point, said in the log; `.hydra/config.yaml` rewritten to the
    settings it really runs with when those are the checkpoint's (Hydra wrote the composed ones)."""
    from .refusals import check_config_resolves, checkpoint_setting

    check_config_resolves(cfg)
    with checkpoint_setting():
        start = starting_point(cfg, command, output_dir, overrides, context.evaluated_run(output_dir), owner)
    check_config_resolves(start.cfg)
    if start.checkpoint is None:
        return start
    verb = "resuming" if command == "fit" else "evaluating"
    log.info("%s %s (step %d) with %s", verb, start.checkpoint, start.step, start.config_source.value)
    for name in kept_run_callbacks(cfg, start.cfg) if command == "fit" else ():
        log.info(
            "callbacks.%s: kept from the run, which its checkpoints carry on (the command line leaves it out)", name
        )
    for change in start.changes:
        log.info(
            "changed setting: %s (%s)", change, "not used by evaluation" if change.action == "unused" else "applied"
        )
    path = context.attempt_config_path(output_dir)
    if start.config_source is ConfigSource.CHECKPOINT and path is not None and path.is_file():
        from omegaconf import OmegaConf

        OmegaConf.save(start.cfg, path)
    return start


def _config_around_model(cfg, contents) -> Any:
    """The composed config with the model the checkpoint was built as (its constructor arguments)."""
    from omegaconf import OmegaConf

    config = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
    saved = contents.get("hyper_parameters")
    if isinstance(saved, dict) and saved:
        model = {
            key: value for key, value in OmegaConf.to_container(cfg.model, resolve=False).items() if key.startswith("_")
        }
        model.update(saved)
        config.model = model
    return config
