"""LightningModules: the SRU language model (with an LSTM baseline in the same harness)."""

from .language_model import SRULanguageModel

__all__ = ["SRULanguageModel"]
