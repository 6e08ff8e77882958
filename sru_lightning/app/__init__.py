"""The command-line application on top of the library: `python -m sru_lightning <command>`,
Hydra-configured runs and sweeps, text generation and export from checkpoints."""

from sru_lightning.app.runs.jobs import register_resolvers as _register_resolvers

# conf/hydra/default.yaml names the default run directory through a resolver of ours.
_register_resolvers()
