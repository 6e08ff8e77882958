#!/usr/bin/env bash
# A Hydra sweep: every combination runs in its own directory under multirun/<date>/<time>/<n>,
# a failing job does not stop the others, and summary.md / summary.csv in the sweep directory
# tabulate each job's overrides and final metrics (val_bpc, val_ppl, unigram_bpc, ...).
#
#   bash examples/sweep.sh                      # SRU vs SRU++ vs LSTM, fp32 vs bf16, on CPU
#   bash examples/sweep.sh trainer.max_epochs=2 # extra overrides apply to every job
#
# On a SLURM cluster, install the submitit launcher and add its launcher override; each job
# becomes a SLURM job and the summary is written when all of them are done:
#   pip install hydra-submitit-launcher
#   python -m sru_lightning fit -m hydra/launcher=submitit_slurm \
#       hydra.launcher.partition=gpu hydra.launcher.gpus_per_node=1 hydra.launcher.timeout_min=240 \
#       trainer=gpu model=sru,lstm trainer.precision=bf16-mixed,16-mixed
set -euo pipefail
python -m sru_lightning fit -m \
  model=sru,srupp,lstm \
  trainer.precision=32-true,bf16-true \
  trainer.max_steps=100 \
  "$@"
