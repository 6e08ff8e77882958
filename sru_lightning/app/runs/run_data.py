"""The data of a run: the data module its config names, encoding with the vocabulary of the
checkpoint the run starts from where token ids must mean what they meant in training."""

from __future__ import annotations

import logging

from .checkpoints import saved_codec
from .init_from import InitialWeights
from .interfaces import AdoptsVocabulary, PreparedIds, SubwordData, provides
from .refusals import checkpoint_setting, data_setting, instantiate_setting
from .starting_point import StartingPoint

log = logging.getLogger("sru_lightning")

__all__ = ["build_data"]


def build_data(cfg, command: str, start: StartingPoint, initial: InitialWeights | None = None):
    """The data module of `cfg.data` and its vocabulary size (the text read here, its problems the
    user's); with `initial` weights (`model.init_from`), encoded with their vocabulary."""
    datamodule = instantiate_setting(cfg.data)
    if initial is not None:
        _adopt_vocabulary(datamodule, initial.codec, f"the vocabulary of {initial.source!r}")
    learned = provides(datamodule, SubwordData) and datamodule.tokenizer is not None
    prepared = provides(datamodule, PreparedIds) and datamodule.reads_prepared_ids
    if start.checkpoint is not None and (command != "fit" or learned or prepared):
        # Token ids mean what they meant in training; a resumed fit with a learned subword
        # vocabulary takes the checkpoint's rather than learning it again, and prepared shards
        # must hold the checkpoint's vocabulary.
        _encode_with_the_checkpoints_vocabulary(datamodule, start.loaded)
    with data_setting():  # the data module reads its text on first use
        vocab_size = datamodule.vocab_size
    return datamodule, vocab_size


def _encode_with_the_checkpoints_vocabulary(datamodule, loaded) -> None:
    """Evaluation data is encoded with the checkpoint's vocabulary (a character it lacks is an
    error; an unknown word is counted as the unknown word)."""
    with checkpoint_setting():
        codec = saved_codec(loaded)
    if codec is not None:
        _adopt_vocabulary(datamodule, codec, "the checkpoint's vocabulary")


def _adopt_vocabulary(datamodule, codec, whose: str) -> None:
    """Encode the data with `codec` (an unknown word counts as the unknown word, with a warning)."""
    if not provides(datamodule, AdoptsVocabulary):
        return
    with data_setting():
        unknown = datamodule.adopt_vocabulary(codec)
    if unknown:
        log.warning(
            "%d words of the data are not in %s of %d words; each counts as %r",
            unknown,
            whose,
            codec.vocab_size,
            codec.unknown,
        )
