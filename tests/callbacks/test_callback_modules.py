"""The callbacks are laid out as Lightning's own are: one callback per module, every one of them
importable from `sru_lightning.callbacks`, and no module that only passes on another's names."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

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


def test_every_module_defines_what_it_holds():
    """No module only passes on names defined elsewhere (the package has no earlier import paths
    to keep: its checkpoints name the modules that define their callbacks)."""
    hollow = []
    for module_info in pkgutil.iter_modules(callbacks_package.__path__):
        module = importlib.import_module(f"{callbacks_package.__name__}.{module_info.name}")
        own = [
            member
            for _, member in inspect.getmembers(module, lambda item: inspect.isclass(item) or inspect.isfunction(item))
            if member.__module__ == module.__name__
        ]
        if not own:
            hollow.append(module_info.name)
    assert hollow == []
