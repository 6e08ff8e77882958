"""What a run relies on in the data module and the model it builds from the config: the
interfaces, declared. Any LightningDataModule / LightningModule a config names may be used;
the run asks :func:`provides` which of these a given one has.

:func:`provides` looks the members up without running them (`inspect.getattr_static`): a data
module's `vocab_size` or `token_unit` may read its whole text on first use, which must happen
where the run reports a data problem as the user's, not inside a type check.
"""

from __future__ import annotations

import inspect
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "provides",
    "AdoptsVocabulary",
    "ChecksSizes",
    "KeepsDocumentsApart",
    "NamesItsMetrics",
    "PacksDocuments",
    "PreparedIds",
    "RunDataModule",
    "SubwordData",
    "TokenUnitData",
]


@runtime_checkable
class RunDataModule(Protocol):
    """Every data module a run trains on: how many token ids its text has."""

    vocab_size: int


@runtime_checkable
class TokenUnitData(Protocol):
    """Data that says what a token is (`char`, `byte`, `word`, `subword`): it names the metrics."""

    token_unit: str


@runtime_checkable
class SubwordData(Protocol):
    """Data with a learned subword vocabulary (None until it has one)."""

    tokenizer: Any


@runtime_checkable
class PreparedIds(Protocol):
    """Data read from token ids prepared ahead (`data=shards`): their vocabulary is fixed."""

    reads_prepared_ids: bool


@runtime_checkable
class PacksDocuments(Protocol):
    """Data whose rows may pack documents with their boundaries."""

    packs_documents: bool


@runtime_checkable
class AdoptsVocabulary(Protocol):
    """Data that can encode its text with a checkpoint's vocabulary; returns how many words it lacks."""

    def adopt_vocabulary(self, codec: Any) -> int: ...


@runtime_checkable
class ChecksSizes(Protocol):
    """Data that can say, before training, that it has too little text for the batch layout."""

    def check_sizes(self, world_size: int) -> None: ...


@runtime_checkable
class NamesItsMetrics(Protocol):
    """A model that names its bits-per-token metric of a stage (`val_bpc`, `val_bpw`, ...)."""

    def bits_name(self, stage: str) -> str: ...


@runtime_checkable
class KeepsDocumentsApart(Protocol):
    """A model that says whether it keeps documents packed in one row apart."""

    accepts_document_boundaries: bool


_MISSING = object()


def provides(thing: Any, protocol: type) -> bool:
    """Whether `thing` has every member `protocol` declares, looked up without calling a property."""
    members = {name for name in vars(protocol) if not name.startswith("_")} | set(
        vars(protocol).get("__annotations__", {})
    )
    return all(inspect.getattr_static(thing, name, _MISSING) is not _MISSING for name in members)
