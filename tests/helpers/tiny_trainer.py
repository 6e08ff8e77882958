"""The Trainer of the tests' tiny CPU fits: one CPU process that writes nothing and prints no
progress, its settings the test's own where it passes them."""

from __future__ import annotations

from typing import Any

#: What a tiny fit in a test leaves out: a logger's files, checkpoints, the progress bar, the summary.
TINY_CPU_SETTINGS: dict[str, Any] = {
    "accelerator": "cpu",
    "devices": 1,
    "logger": False,
    "enable_checkpointing": False,
    "enable_progress_bar": False,
    "enable_model_summary": False,
}


def tiny_trainer(**settings: Any):
    """`lightning.pytorch.Trainer` with :data:`TINY_CPU_SETTINGS`, `settings` over them."""
    from lightning.pytorch import Trainer

    return Trainer(**{**TINY_CPU_SETTINGS, **settings})
