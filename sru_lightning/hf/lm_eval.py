"""``python -m sru_lightning.hf.lm_eval <lm_eval's arguments>``: EleutherAI's evaluation harness
with this package's model type registered and ``--model sru_lightning`` added
(:mod:`sru_lightning.hf.harness`)."""

from sru_lightning.hf.harness import main

if __name__ == "__main__":
    main()
