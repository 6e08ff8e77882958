"""Test tiers (see docs/testing.md): a bare `pytest` runs the unit tier, leaving out what is
marked `slow` (starts processes or trains for long), `toolchain` (runs a compiler) or `slurm`
(the private cluster); `make test` runs every tier. `peer` needs the `sru` package; `cuda`
needs a CUDA GPU and is skipped with the reason everywhere else.

Under pytest-xdist (`make test` runs `--dist loadfile` with one worker more than the cores)
each test file runs on one worker, so the fits its tests share run once; the files that take
longest (as measured: helpers/durations.py) are handed out first so that no long file starts
last; each worker, and each process it starts, runs torch on its share of the cores.
Processes for the command line come from a preloaded fork server (helpers/preloaded.py).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import torch
from helpers import preloaded
from helpers.durations import DurationsRecorder, longest_first, read_durations

TESTS = os.path.dirname(os.path.abspath(__file__))


def _test_file(item) -> str:
    return os.path.relpath(str(item.path), TESTS).replace(os.sep, "/")


def pytest_addoption(parser):
    parser.addoption(
        "--write-durations",
        metavar="PATH",
        default=None,
        help="write each test file's measured seconds into PATH (make test-durations: tests/durations.json)",
    )


def pytest_collection_modifyitems(config, items):
    has_cuda = torch.cuda.is_available()
    has_peer = importlib.util.find_spec("sru") is not None
    skip_cuda = pytest.mark.skip(reason="needs a CUDA GPU: torch.cuda.is_available() is False")
    skip_peer = pytest.mark.skip(reason="needs the `sru` package for parity tests: pip install 'sru_lightning[test]'")
    for item in items:
        if "cuda" in item.keywords and not has_cuda:
            item.add_marker(skip_cuda)
        if "peer" in item.keywords and not has_peer:
            item.add_marker(skip_peer)
    # Longest files first, as measured (helpers/durations.py); stable: the order inside a file is kept.
    longest = longest_first(read_durations())
    items.sort(key=lambda item: longest(_test_file(item)))


def pytest_configure(config):
    # pytest-xdist 3.7+ hands out the files with the most tests first unless told not to, which
    # would start the long files of few tests (the cluster's) last and leave them running alone
    # at the end: keep the order above (older releases keep it anyway).
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False
    path = config.getoption("write_durations", None)
    if path and not hasattr(config, "workerinput"):  # under xdist, the controller writes them
        config.pluginmanager.register(DurationsRecorder(Path(path).absolute(), config.rootpath), "durations-recorder")
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:  # two workers with all the cores each would fight over them
        share = max(1, (os.cpu_count() or 1) // workers)
        torch.set_num_threads(share)
        os.environ.setdefault("OMP_NUM_THREADS", str(share))  # and so would the processes they start


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    # The fork server asks which test is running: a `cuda` test's processes are never forked,
    # in its fixtures' setup and teardown too.
    preloaded.running_test = item
    try:
        return (yield)
    finally:
        preloaded.running_test = None


@pytest.fixture(autouse=True)
def _seed_everything():
    torch.manual_seed(0)
    yield
