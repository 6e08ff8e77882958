#!/usr/bin/env bash
# Every check that needs a CUDA GPU, in one command, with one summary at the end:
# CUDA vs CPU kernels vs the reference (fp32/fp64/fp16/bf16, every variant; also on a
# non-default stream, a second GPU when present, and under compute-sanitizer when installed),
# torch.compile vs eager on CUDA, fits under 16-mixed / bf16-mixed / 16-true and DeepSpeed
# ZeRO-2 fp16/bf16 (one at a time), peak memory of 16-mixed vs 32-true, the recurrence
# kernels' memory bandwidth (GB/s), and SRU vs cuDNN nn.LSTM vs the `sru` package at a few
# sizes. Under 8 minutes (budget=420 s by default, extension build included).
# Exit status: 0 all passed, 1 a check failed, 2 no CUDA device.
#
#   bash examples/gpu_check.sh                       # everything
#   bash examples/gpu_check.sh only=kernels,fits     # some parts
#   bash examples/gpu_check.sh json=results.json     # also keep the results
#
# Uses $PYTHON, else the repository's .venv, else python3. The environment needs a CUDA
# build of PyTorch (e.g. `make setup TORCH_SPEC="torch>=2.13"`) and a C++/CUDA toolchain.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PYTHON:-}" ]; then
    if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
exec "$PYTHON" -m sru_lightning gpu-check "$@"
