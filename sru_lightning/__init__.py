"""Fast SRU (Simple Recurrent Unit) layers for PyTorch Lightning in every precision regime.

The names below are imported on first use, so `import sru_lightning` stays cheap and
`sru_lightning.SRU` does not pull in Lightning.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "SRU": "sru_lightning.nn",
    "SRUCell": "sru_lightning.nn",
    "SRUpp": "sru_lightning.nn",
    "set_recurrence_policy": "sru_lightning.nn",
    "sru_recurrence": "sru_lightning.ops",
    "SRUPrecisionCallback": "sru_lightning.callbacks",
    "detect_regime": "sru_lightning.precision",
    "SRULanguageModel": "sru_lightning.models",
    "from_pretrained": "sru_lightning.export.pretrained",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str):
    module_name = _EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module 'sru_lightning' has no attribute {name!r}")
    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(__all__)
