"""One run of `python -m sru_lightning fit|validate|test`: build it from its Hydra config,
execute it, and record what happened.

Every run directory ends with a `result.json` that tells the truth about the final weights:
its status (`completed`, `failed`, `interrupted`), the final metrics (validated again when the
last validation is older than the last optimizer step), optimizer steps, tokens per second
and wall time; `history.jsonl` keeps one such record per attempt, so a run resumed into its
own directory keeps the story of every attempt (and its overrides).

The jobs are in their own modules: :mod:`.building` (the run from its config),
:mod:`.executing` (the Trainer call and the final metrics), :mod:`.outcomes` (one exit per
outcome), :mod:`.console` (what the run says, and where), :mod:`.refusals` (the calls that
apply the user's settings, whose refusal is a usage error) and :mod:`.run_callbacks`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import ModelCheckpoint

from sru_lightning.app.signal_watch import SignalWatch, watching_signals

from .building import build
from .checkpoints import CHECKPOINT_NAME
from .console import visible_logging
from .context import RunContext
from .executing import check_final_metric, evaluation_settings, execute
from .folder import RunFolder
from .metric_names import bits_name, optimized_metric_name
from .outcomes import Attempt, completed, ended_early, record_a_watchdog_exit

__all__ = ["run"]


def run(cfg, context: RunContext, output_dir: Path, overrides: list[str], *, multirun: bool = False) -> dict[str, Any]:
    """Build everything from `cfg`, run the `context`'s command with the job's `overrides`, record
    the result in `output_dir`; return the record.

    The outcomes: completed; refused (a setting the run cannot apply: a single run exits with
    status 2 and leaves its directory as it was, a sweep job is recorded as failed and the
    others go on); interrupted (recorded with the command that resumes it; a sweep stops);
    failed (recorded; a single run exits with status 1 for a failure its message explains, such
    as a NaN loss, and with the traceback otherwise; a sweep job is logged and the others go on).
    """
    attempt = Attempt(context.command, overrides, Path(output_dir).absolute(), multirun, context)
    with visible_logging(context.command), watching_signals(context.held.release_all) as signals:
        attempt.signal_watch = signals
        try:
            metrics = _build_and_execute(cfg, attempt, signals)
        except BaseException as error:
            signals.release_launched_ranks()
            return ended_early(error, attempt)
        signals.release_launched_ranks()
        return completed(attempt, metrics)


def _build_and_execute(cfg, attempt: Attempt, signals: SignalWatch) -> dict[str, float]:
    """The run itself: build, execute the command, check the final metric; the final metrics."""
    trainer, model, datamodule, start = build(
        cfg, attempt.command, attempt.output_dir, attempt.overrides, owner=attempt.owner, context=attempt.context
    )
    attempt.trainer = trainer
    signals.follow(trainer)
    record_a_watchdog_exit(attempt)
    attempt.record["monitor"] = optimized_metric_name(start.cfg, model)
    ckpt_path = start.checkpoint
    if ckpt_path is not None:
        attempt.record.update(ckpt_path=str(ckpt_path), ckpt_step=start.step)
    if start.changes:
        attempt.record["changes"] = start.changes_record()
    final_checkpoint = None
    if attempt.command == "fit" and any(isinstance(cb, ModelCheckpoint) for cb in trainer.callbacks):
        final_checkpoint = attempt.output_dir / RunFolder.CHECKPOINTS_DIR / CHECKPOINT_NAME
    evaluated_with = None
    if attempt.command != "fit":
        evaluated_with = evaluation_settings(start, trainer, attempt.command)
        attempt.record["evaluated_with"] = evaluated_with
    metrics = execute(attempt.command, trainer, model, datamodule, ckpt_path, final_checkpoint, evaluated_with)
    check_final_metric(metrics, bits_name(model, "test" if attempt.command == "test" else "val"))
    return metrics
