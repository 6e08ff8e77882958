# One command sets up and runs the main job; one sets up and runs the tests.
#   make run     create .venv, install the package and its runtime dependencies only, build the
#                kernels this CPU runs, train the default SRU language model
#   make test    create .venv, install every extra, build the kernels of every vector level,
#                run every tier of the test suite (in parallel with pytest-xdist, each test
#                file on one worker)
#   make test-fast  the unit tier (what a bare `pytest` runs), in parallel: no `slow` tests
#                (processes, multi-process fits, sweeps), no `toolchain` builds, no SLURM cluster
#   make docs    build the documentation site (mkdocs.yml, docs/) into site/
#   make lint    ruff's lint and format check (part of make test); make format applies them
#   make test-durations  run every tier as make test does and write each test file's measured
#                seconds into tests/durations.json (commit it): the longest files start first
#   make test-floor  the fast tier in its own .venv-floor, on the lowest versions pyproject.toml
#                allows (FLOOR_PINS below; torch from TORCH_SPEC)
#
# Neither needs SLURM: the tests in tests/cluster/ (marker `slurm`) start a private one-node
# SLURM cluster from Debian's packages (apt-get install slurmctld slurmd slurm-client munge, as
# root; .ci/run installs them) and are skipped with that reason where they are missing.
#
# TORCH_SPEC pins the PyTorch build installed first. The default is the CPU build used on
# CPU-only machines; on a CUDA machine run e.g. `make test TORCH_SPEC="torch>=2.13"`.
# CUDA_ARCH builds the CUDA kernels for GPUs this machine lacks (a login node), e.g.
# `make build-ext TORCH_SPEC="torch>=2.13" CUDA_ARCH="8.0;9.0"`.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
CUDA_ARCH ?=
PIP = $(VENV)/bin/python -m pip
# LitData, installed apart from the extras (see $(VENV)/.installed); keep in step with the `data`
# extra of pyproject.toml.
LITDATA_SPEC = litdata>=0.2.76
LITDATA_FLOOR = 0.2.76
LITDATA_DEPS = lightning-utilities filelock boto3 requests "urllib3>=1.26" tifffile obstore
PY = $(VENV)/bin/python
# pytest-xdist: one worker more than the cores (at most 16): the process tests spend part of
# their time waiting on the processes they start. Each test file runs on one worker (2-process
# fits of one file never share a port), and the fits its tests share run once.
# PYTEST_PARALLEL= runs serially.
PYTEST_WORKERS ?= $(shell $(PYTHON) -c "import os; cores = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count() or 1; print(min(cores + 1, 16))")
PYTEST_PARALLEL ?= -n $(PYTEST_WORKERS) --dist loadfile

.PHONY: setup run test test-fast test-durations test-floor lint format build-ext bench docs clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip "setuptools>=77" wheel

# What `make run` needs: torch first (TORCH_SPEC), then the package and its runtime
# dependencies; setuptools and wheel are in the venv already, so no isolated build env.
$(VENV)/.installed-run: $(VENV)/bin/python pyproject.toml
	$(PIP) install --quiet "$(TORCH_SPEC)"
	$(PIP) install --quiet --no-build-isolation -e .
	touch $@

# Everything else: the tests' tools, charts, DeepSpeed, the sweepers, the docs site, the Hugging
# Face ecosystem (transformers, PEFT, the evaluation harness) and LitData (the `data` extra).
# litdata requires torchvision for its image helpers, which token streams never import, and PyPI's
# torchvision cannot be imported beside the CPU torch build (nor installed without replacing it by
# a newer one): litdata goes in without its dependencies, and the ones it uses beside it.
$(VENV)/.installed: $(VENV)/.installed-run
	$(PIP) install --quiet --no-build-isolation -e ".[test,bench,deepspeed,sweepers,docs,hf]" "$(TORCH_SPEC)"
	$(PIP) install --quiet --no-deps "$(LITDATA_SPEC)"
	$(PIP) install --quiet $(LITDATA_DEPS) "$(TORCH_SPEC)"
	touch $@

setup: $(VENV)/.installed

build-ext: setup
	$(PY) -m sru_lightning build $(if $(CUDA_ARCH),cuda_arch="$(CUDA_ARCH)")

run: $(VENV)/.installed-run
	$(PY) -m sru_lightning fit

# What third-party packages compile on first use (the `sru` parity peer's extension, DeepSpeed's
# CPU shared-memory op, torch.compile's C++ cache) is built once per venv, before the tests,
# not inside whichever test needs it first (tests/helpers/warm_caches.py).
$(VENV)/.warmed: $(VENV)/.installed tests/helpers/warm_caches.py
	$(PY) tests/helpers/warm_caches.py
	touch $@

# The kernels compile beside the third-party warm-up ($(1): build's settings): each side is
# mostly one compiler at a time, so two cores finish both together (its output follows).
define kernels_beside_warmup
	@$(PY) -m sru_lightning build $(1) > $(VENV)/kernel-build.log 2>&1 & build=$$!; \
	$(MAKE) --no-print-directory $(VENV)/.warmed; warmed=$$?; \
	wait $$build; built=$$?; cat $(VENV)/kernel-build.log; test $$warmed = 0 && test $$built = 0
endef

# Every tier: `-m ""` lifts the unit-tier selection of pyproject.toml's addopts. One kernel
# library of every vector level serves the tests that cap the level.
test: setup lint
	$(call kernels_beside_warmup,all_levels=true)
	$(PY) -m pytest $(PYTEST_PARALLEL) -m "" --durations=25

test-fast: setup
	$(call kernels_beside_warmup,)
	$(PY) -m pytest $(PYTEST_PARALLEL) -q --durations=10

# tests/durations.json, from a run of every tier as `make test` runs them (tests/helpers/durations.py).
test-durations: setup
	$(call kernels_beside_warmup,--all-levels)
	$(PY) -m pytest $(PYTEST_PARALLEL) -m "" -q --write-durations=tests/durations.json

# The dependency floors: a separate environment with the floor of every dependency and extra in
# pyproject.toml pinned (keep the two in step), made again when either file changes.
FLOOR_VENV ?= .venv-floor
FLOOR_PY = $(FLOOR_VENV)/bin/python
FLOOR_PINS = lightning==2.6.0 torchmetrics==1.3.0.post0 hydra-core==1.3.2 omegaconf==2.3.0 numpy==1.26.0 \
	ninja==1.11.1 rich==13.0.0 typing-extensions==4.12.2 deepspeed==0.16.0 \
	pytest==8.0.0 pytest-xdist==3.5.0 hypothesis==6.100.0 sru==2.6.0 tensorboard==2.17.1 ruff==0.17.6 \
	onnx==1.17.0 onnxscript==0.6.0 onnxruntime==1.21.0 \
	hydra-optuna-sweeper==1.3.0 hydra-joblib-launcher==1.2.0 hydra-submitit-launcher==1.2.0 sqlalchemy==1.4.54 alembic==1.13.3 \
	safetensors==0.8.0 huggingface_hub==2.4.0 tokenizers==0.23.3 fastapi==0.165.0 uvicorn==0.55.0 \
	matplotlib==3.8.4 mkdocs==1.6.0 mkdocs-material==9.5.0 mkdocstrings==0.30.0 mkdocstrings-python==1.17.0 \
	transformers==5.25.0 peft==0.21.2 lm-eval==0.4.13 openai==3.63.0

$(FLOOR_VENV)/.installed: pyproject.toml Makefile
	rm -rf $(FLOOR_VENV)
	$(PYTHON) -m venv $(FLOOR_VENV)
	$(FLOOR_PY) -m pip install --quiet --upgrade pip "setuptools>=77" wheel
	$(FLOOR_PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(FLOOR_PY) -m pip install --quiet -e ".[test,bench,deepspeed,sweepers,docs,hf]" "$(TORCH_SPEC)" $(FLOOR_PINS)
	$(FLOOR_PY) -m pip install --quiet --no-deps litdata==$(LITDATA_FLOOR)
	$(FLOOR_PY) -m pip install --quiet $(LITDATA_DEPS) "$(TORCH_SPEC)"
	$(FLOOR_PY) tests/helpers/warm_caches.py
	touch $@

test-floor: $(FLOOR_VENV)/.installed
	$(FLOOR_PY) -m sru_lightning build
	$(FLOOR_PY) -m pytest $(PYTEST_PARALLEL) -q --durations=10

# ruff (configured in pyproject.toml): lint and formatting check; `make format` applies both.
lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format: setup
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

bench: setup
	$(PY) -m sru_lightning bench

# The documentation site into site/ (warnings are errors, as in tests/test_docs.py).
docs: setup
	$(PY) -m mkdocs build --strict

clean:
	rm -rf build dist *.egg-info outputs multirun site
