"""One run of `python -m sru_lightning fit|validate|test`: build it from the Hydra config,
run it, and record what happened in its run directory (the CLI sits on top of this)."""
