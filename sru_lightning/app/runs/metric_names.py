"""The names of the metrics a run reports: `val_bpc`, or `val_bpw` for word-level data, and the
names its config's callbacks and sweep follow."""

from __future__ import annotations

from .interfaces import NamesItsMetrics, provides

__all__ = ["bits_name", "metric_names_followed", "optimized_metric_name"]


def bits_name(model, stage: str) -> str:
    """The model's bits-per-token metric of `stage`: `val_bpc`, or `val_bpw` for word-level data."""
    return model.bits_name(stage) if provides(model, NamesItsMetrics) else f"{stage}_bpc"


def metric_names_followed(node, model) -> dict[str, str]:
    """A callback's `monitor` / `filename` settings that name the character-level metrics
    (conf/callbacks/model_checkpoint.yaml: val_bpc), renamed to the ones the model logs."""
    renamed = {}
    for key in ("monitor", "filename"):
        value = node.get(key) if hasattr(node, "get") else None
        if not isinstance(value, str):
            continue
        new = value
        for stage in ("train", "val", "test"):
            new = new.replace(f"{stage}_bpc", bits_name(model, stage))
        if new != value:
            renamed[key] = new
    return renamed


def optimized_metric_name(cfg, model) -> str:
    """The metric a sweep optimises: `optimized_metric`, else the checkpoint callback's monitor."""
    name = cfg.get("optimized_metric")
    if not name:
        checkpoint = (cfg.get("callbacks") or {}).get("model_checkpoint") or {}
        name = checkpoint.get("monitor") or "val_bpc"
    for stage in ("train", "val", "test"):  # val_bpc is val_bpw for word-level data
        name = name.replace(f"{stage}_bpc", bits_name(model, stage))
    return str(name)
