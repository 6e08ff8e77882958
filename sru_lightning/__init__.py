"""Fast SRU (Simple Recurrent Unit) layers for PyTorch Lightning in every precision regime.

The names below are imported on first use, so `import sru_lightning` stays cheap and
`sru_lightning.SRU` does not pull in Lightning.

With transformers installed, the package's transformers classes (:mod:`sru_lightning.hf`) are
registered with its Auto classes when transformers is imported, before or after this package,
so ``import sru_lightning`` is all ``AutoModelForCausalLM.from_pretrained(<export folder>)``
needs; transformers itself is never imported here.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

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


# --------------------------------------------------------------------------------------------
# transformers' Auto classes: registered when transformers is imported
_TRANSFORMERS = "transformers"


def _register_with_transformers() -> None:
    try:
        importlib.import_module("sru_lightning.hf")
    except Exception as error:  # an incompatible transformers must not break the user's import of it
        warnings.warn(
            f"sru_lightning: its transformers classes were not registered ({type(error).__name__}: {error}); "
            "AutoModelForCausalLM cannot load its folders. pip install 'sru_lightning[hf]' installs a transformers "
            "it supports",
            stacklevel=2,
        )


class _LoaderThenRegister(importlib.abc.Loader):
    """transformers' own loader, followed by the registration once its package has run."""

    def __init__(self, loader) -> None:
        self._loader = loader

    def __getattr__(self, name: str):
        return getattr(self._loader, name)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        _register_with_transformers()


class _RegisterOnTransformersImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when transformers is first imported, it hands over transformers' own
    spec with a loader that registers this package's classes after transformers has loaded."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != _TRANSFORMERS:
            return None
        sys.meta_path.remove(self)  # once, and so find_spec below sees the other finders only
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _LoaderThenRegister(spec.loader)
        return spec


if _TRANSFORMERS in sys.modules:
    _register_with_transformers()
elif importlib.util.find_spec(_TRANSFORMERS) is not None:
    sys.meta_path.insert(0, _RegisterOnTransformersImport())
