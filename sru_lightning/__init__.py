"""Fast SRU (Simple Recurrent Unit) layers for PyTorch Lightning in every precision regime."""

__version__ = "0.1.0"
