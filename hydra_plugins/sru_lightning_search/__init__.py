"""Hydra finds sweepers and launchers only in the `hydra_plugins` namespace package: this module
is where it finds sru_lightning's search with a pruner (the code is in
:mod:`sru_lightning.app.search`)."""

from sru_lightning.app.search import PrunedOptunaSweeper as _PrunedOptunaSweeper

__all__ = ["PrunedOptunaSweeper"]


class PrunedOptunaSweeper(_PrunedOptunaSweeper):
    __doc__ = _PrunedOptunaSweeper.__doc__
