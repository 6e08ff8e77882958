"""Execute a built run: the Trainer call of its command, the final weights of a fit saved and
validated when no checkpoint or validation holds them yet, and the final metrics it reports.
"""

from __future__ import annotations

import inspect
import logging
import math
import os
from pathlib import Path
from typing import Any

from sru_lightning._atomic import PARTIAL_SUFFIX, put_in_place

from .building import bits_name
from .console import RunFailed, say
from .folder import RunFolder
from .refusals import trainer_call_settings
from .run_callbacks import LastValidation
from .starting_point import StartingPoint

log = logging.getLogger("sru_lightning")


def evaluation_settings(start: StartingPoint, trainer, command: str) -> dict[str, Any]:
    """What an evaluation's number depends on besides the weights: the checkpoint and its step,
    the data settings and the batch limit, and the settings changed against the run."""
    from omegaconf import OmegaConf

    data = OmegaConf.to_container(start.cfg.data, resolve=True)
    shown = {"data": str(data.get("_target_", "?")).rsplit(".", 1)[-1]}
    shown.update({key: value for key, value in data.items() if not key.startswith("_")})
    limit = trainer.limit_test_batches if command == "test" else trainer.limit_val_batches
    if limit not in (None, 1.0):
        shown[f"limit_{'test' if command == 'test' else 'val'}_batches"] = limit
    changed = [change.key for change in start.changes if change.key.startswith("data.")]
    return {
        "checkpoint": start.checkpoint,
        "step": start.step,
        "settings": shown,
        "settings_from": start.config_source,
        "changed": changed,
    }


def _evaluation_text(evaluated_with: dict[str, Any]) -> str:
    settings = " ".join(f"{key}={value}" for key, value in evaluated_with["settings"].items())
    changed = evaluated_with["changed"]
    origin = f"the run's settings except {', '.join(changed)}" if changed else evaluated_with["settings_from"]
    return f"; step {evaluated_with['step']} of {evaluated_with['checkpoint']}, {settings} ({origin})"


def execute(
    command: str,
    trainer,
    model,
    datamodule,
    ckpt_path: str | None = None,
    final_checkpoint: Path | None = None,
    evaluated_with: dict[str, Any] | None = None,
) -> dict[str, float]:
    """Run the trainer command; return the final metrics, and print the headline line.
    A fit whose last saved checkpoint is older than its final weights saves them as
    `final_checkpoint`, so the run's newest checkpoint is its final state."""
    split = "test" if command == "test" else "val"
    bits = bits_name(model, split)  # val_bpc, or val_bpw for word-level data
    unit = bits.split("_", 1)[1]
    training_metrics: dict[str, float] = {}
    if command == "fit":
        with trainer_call_settings(trainer, trainer.fit_loop):
            trainer.fit(
                _handed_to_trainer(model), datamodule=datamodule, ckpt_path=ckpt_path, **_safe_loading(trainer.fit)
            )
        if final_checkpoint is not None:
            _save_final_weights(trainer, final_checkpoint)
        # A validation of the final weights replaces the trainer's metrics; the training ones stay.
        training_metrics = _training_metrics(trainer)
        _validate_final_weights(trainer, model, datamodule, bits)
    elif command == "validate":
        with trainer_call_settings(trainer, trainer.validate_loop):
            trainer.validate(
                _handed_to_trainer(model),
                datamodule=datamodule,
                ckpt_path=ckpt_path,
                **_safe_loading(trainer.validate),
            )
    else:
        with trainer_call_settings(trainer, trainer.test_loop):
            trainer.test(
                _handed_to_trainer(model), datamodule=datamodule, ckpt_path=ckpt_path, **_safe_loading(trainer.test)
            )
    metrics = _scalar_metrics(trainer)
    if command == "fit":
        metrics = {
            **training_metrics,
            **{name: value for name, value in metrics.items() if not name.startswith("train_")},
        }
    baseline = datamodule.unigram_bpc(split)  # bits per token, whatever the token is
    metrics[f"unigram_{unit}"] = baseline
    if trainer.is_global_zero:
        value = metrics.get(bits)
        if value is None:
            train_name = bits_name(model, "train")
            train = metrics.get(train_name)
            text = f"{train_name}={train:.4f}" if train is not None else "no metric"
            say(f"final {text} (no validation: trainer.limit_val_batches=0; unigram baseline {unit}={baseline:.4f})")
        else:
            where = _evaluation_text(evaluated_with) if evaluated_with else ""
            # Bits per byte compare a subword run with character-level ones (a character is about
            # a byte); at word level it is an estimate (docs/data.md), so the line keeps bits per word.
            per_byte = metrics.get(f"{split}_bpb")
            also = f", {split}_bpb={per_byte:.4f}" if per_byte is not None and bits.endswith("_bpt") else ""
            say(f"final {bits}={value:.4f}{also} (unigram baseline {unit}={baseline:.4f}{where})")
    return metrics


def check_final_metric(metrics: dict[str, float], final_name: str) -> None:
    """Raise RunFailed when the final bits-per-token metric is not finite."""
    final = metrics.get(final_name, 0.0)
    if not math.isfinite(final):
        raise RunFailed(
            f"the final {final_name} is {final}: the model's outputs are "
            "not finite (see the training loss in the logs; a smaller learning rate or bf16 instead of "
            "fp16 usually helps)"
        )


def _save_final_weights(trainer, path: Path) -> None:
    """Save the fit's final state as `path` when no checkpoint of the run holds it yet (a stop by
    max_time or max_steps between validations). Rank 0 decides, every rank takes part in the save."""
    newest = RunFolder(path.parent.parent).latest if trainer.is_global_zero else None
    needed = newest is None or newest.step < trainer.global_step
    if not trainer.strategy.broadcast(needed and trainer.global_step > 0):
        return
    log.info(
        "Saving the final weights (step %d) as %s: the run's newest checkpoint was older", trainer.global_step, path
    )
    partial = f"{path}{PARTIAL_SUFFIX}"
    trainer.save_checkpoint(partial, weights_only=False)
    if trainer.is_global_zero and os.path.exists(partial):
        put_in_place(partial, str(path))
    trainer.strategy.barrier("final-weights-saved")


def _scalar_metrics(trainer) -> dict[str, float]:
    return {
        name: float(value)
        for name, value in trainer.callback_metrics.items()
        if getattr(value, "numel", lambda: 1)() == 1
    }


def _training_metrics(trainer) -> dict[str, float]:
    """The fit's training metrics, named for what they cover: after a resume in the middle of an
    epoch, the epoch means cover only the batches since the resume (`train_bpc_since_resume`)."""
    tracker = next((cb for cb in trainer.callbacks if isinstance(cb, LastValidation)), None)
    # Epoch means are logged at each epoch's end: only the first one after a mid-epoch resume is partial.
    partial = tracker is not None and tracker.resumed_mid_epoch and tracker.epochs_ended <= 1
    metrics = {}
    for name, value in _scalar_metrics(trainer).items():
        if not name.startswith("train_"):
            continue
        if partial and name.endswith("_epoch"):
            name = name[: -len("_epoch")] + "_since_resume"
        metrics[name] = value
    return metrics


def _handed_to_trainer(model):
    """The model as the Trainer call gets it: `torch.compile(model)` when `model.compile` asks for
    it (`SRULanguageModel.for_trainer`), as Lightning documents. Lightning unwraps it and runs the
    module itself with compiled steps, so checkpoints, callbacks and the final validation all see
    `model`; another LightningModule named by the config is handed over as it is."""
    for_trainer = getattr(model, "for_trainer", None)
    return for_trainer() if callable(for_trainer) else model


def _safe_loading(method) -> dict[str, bool]:
    """`weights_only=True` where this Lightning accepts it: checkpoints are untrusted input."""
    return {"weights_only": True} if "weights_only" in inspect.signature(method).parameters else {}


def _validate_final_weights(trainer, model, datamodule, final_metric: str) -> None:
    from sru_lightning.callbacks import SRUPrecisionCallback

    if trainer.limit_val_batches == 0:
        return
    tracker = next((cb for cb in trainer.callbacks if isinstance(cb, LastValidation)), None)
    last_step = tracker.step if tracker is not None else None
    if final_metric in trainer.callback_metrics and last_step == trainer.global_step:
        return
    if last_step is not None:
        where = f"the last validation ran at step {last_step}"
    elif tracker is not None and tracker.start_step in (None, trainer.global_step):
        where = f"the fit resumed at step {trainer.global_step} and trained no further"
    else:
        where = "no validation ran in this fit"
    log.info("Validating the final weights (step %d): %s", trainer.global_step, where)
    precision_reports = [cb for cb in trainer.callbacks if isinstance(cb, SRUPrecisionCallback)]
    verbose = [getattr(cb, "verbose", False) for cb in precision_reports]
    for callback in precision_reports:  # the fit already printed the precision table
        callback.verbose = False
    try:
        trainer.validate(model, datamodule=datamodule, verbose=False)
    finally:
        for callback, was in zip(precision_reports, verbose):
            callback.verbose = was
