#!/usr/bin/env bash
# A DeepSpeed ZeRO run of the SRU language model on every GPU of this node, or on 2 CPU
# processes (gloo) where there is no GPU. Needs the `deepspeed` extra
# (pip install 'sru_lightning[deepspeed]').
#
#   bash examples/deepspeed_fit.sh                       # ZeRO stage 2, bf16 mixed precision
#   STAGE=3 PRECISION=16-mixed bash examples/deepspeed_fit.sh
#
# SRUPrecisionCallback (in the default callbacks) reads DeepSpeed's fp16/bf16 settings and
# runs the recurrence in the matching half dtype with float32 accumulation.
set -euo pipefail
STAGE="${STAGE:-2}"
PRECISION="${PRECISION:-bf16-mixed}"

PLACEMENT=()
if ! python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "no CUDA GPU: DeepSpeed runs on 2 CPU processes (gloo); fp16 needs a GPU" >&2
  PLACEMENT=(trainer.accelerator=cpu trainer.devices=2)
fi

python -m sru_lightning fit \
  trainer="deepspeed_stage_${STAGE}" \
  trainer.precision="${PRECISION}" \
  model=sru_large \
  data=stdlib \
  trainer.max_epochs=1 \
  "${PLACEMENT[@]}" \
  "$@"
