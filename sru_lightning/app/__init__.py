"""The command-line application on top of the library: `python -m sru_lightning <command>`,
Hydra-configured runs and sweeps, text generation and export from checkpoints."""
