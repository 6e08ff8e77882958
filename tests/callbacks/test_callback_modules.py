"""The callbacks are laid out as Lightning's own are: one callback per module, every one of them
importable from `sru_lightning.callbacks`, and the earlier import paths still naming them."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest
from lightning.pytorch.callbacks import Callback

import sru_lightning.callbacks as callbacks_package


def callback_classes_by_module() -> dict[str, list[type]]:
    found = {}
    for module_info in pkgutil.iter_modules(callbacks_package.__path__):
        module = importlib.import_module(f"{callbacks_package.__name__}.{module_info.name}")
        found[module_info.name] = [
            member
            for _, member in inspect.getmembers(module, inspect.isclass)
            if issubclass(member, Callback) and member.__module__ == module.__name__
        ]
    return found


def test_each_module_defines_at_most_one_callback():
    crowded = {name: [cls.__name__ for cls in classes] for name, classes in callback_classes_by_module().items()}
    assert {name: classes for name, classes in crowded.items() if len(classes) > 1} == {}


def test_every_public_callback_is_exported_from_the_package():
    public = {
        cls for classes in callback_classes_by_module().values() for cls in classes if not cls.__name__.startswith("_")
    }
    exported = {getattr(callbacks_package, name) for name in callbacks_package.__all__}
    assert sorted(cls.__name__ for cls in public - exported) == []


@pytest.mark.parametrize(
    "earlier_path,name",
    [
        ("sru_lightning.callbacks.interrupts", "GracefulInterrupt"),
        ("sru_lightning.callbacks.interrupts", "InterruptionCheckpoint"),
        ("sru_lightning.callbacks.resume", "RestoreDataPosition"),
        ("sru_lightning.callbacks.resume", "SeedEveryBatch"),
    ],
)
def test_the_earlier_import_paths_name_the_same_classes(earlier_path, name):
    """Run configs saved in the checkpoints of earlier runs name these `_target_`s, and a resumed
    run instantiates them again."""
    from hydra.utils import get_class

    assert get_class(f"{earlier_path}.{name}") is getattr(callbacks_package, name)
