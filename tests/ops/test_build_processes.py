"""Real builds in separate processes: a build killed mid-compile blocks nothing, concurrent
first use from two checkouts compiles once, and the cache folder follows the source content.

What is tested is the build's cache, lock and clean-up, not the code the compiler makes: these
builds compile without optimisation (CXX is a wrapper that appends -O0, which the cache key
records like any other compiler), about a fifth of the optimised build's time. The optimised
build is the one `make test` runs before the tests, and every kernel test uses it.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import preloaded

REPO = Path(__file__).resolve().parents[2]
COMPILING = "compiling the CPU recurrence kernels"
# A generous bound for one CPU build on a loaded two-core machine; a hang fails, slowness not.
BUILD_BOUND_S = 1500


def copy_tree(destination: Path) -> Path:
    """A checkout of the package and its kernel sources, as another clone would be."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / "sru_lightning", destination / "sru_lightning", ignore=ignore)
    shutil.copytree(REPO / "csrc", destination / "csrc", ignore=ignore)
    return destination


def environment(tree: Path, cache: Path) -> dict:
    unoptimised = cache.parent / "c++-O0"
    if not unoptimised.exists():
        unoptimised.write_text(f'#!/bin/sh\nexec {shlex.quote(os.environ.get("CXX", "c++"))} "$@" -O0\n')
        unoptimised.chmod(0o755)
    return {
        **os.environ,
        "PYTHONPATH": str(tree),
        "TORCH_EXTENSIONS_DIR": str(cache),
        "OMP_NUM_THREADS": "1",
        "CXX": str(unoptimised),
    }


def start_build(tree: Path, cache: Path, **options) -> subprocess.Popen:
    return preloaded.Popen(
        [sys.executable, "-m", "sru_lightning", "build"],
        cwd=tree,
        env=environment(tree, cache),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **options,
    )


def build_folder(tree: Path, cache: Path) -> str:
    code = "from sru_lightning.ops import build; print(build.cpu_build_spec().directory())"
    result = preloaded.run(
        [sys.executable, "-c", code],
        cwd=tree,
        env=environment(tree, cache),
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return result.stdout.strip()


@pytest.mark.toolchain
def test_cache_folder_is_shared_by_equal_trees_and_changes_with_any_source(tmp_path):
    cache = tmp_path / "cache"
    first, second = copy_tree(tmp_path / "a"), copy_tree(tmp_path / "b")
    assert build_folder(first, cache) == build_folder(second, cache)
    assert build_folder(first, cache).startswith(str(cache))
    with open(second / "csrc" / "sru_step.h", "a") as header:  # a header the sources include
        header.write("\n// changed\n")
    assert build_folder(first, cache) != build_folder(second, cache)


@pytest.mark.toolchain
@pytest.mark.skipif(not hasattr(os, "killpg"), reason="kills a process group: needs a POSIX system")
def test_killed_build_then_two_checkouts_build_once_concurrently(tmp_path):
    cache = tmp_path / "cache"
    first, second = copy_tree(tmp_path / "a"), copy_tree(tmp_path / "b")

    # 1. A build killed mid-compile (SIGKILL to the whole job: no cleanup code runs).
    doomed = start_build(first, cache, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not list(cache.glob("*.partial-*/build.ninja")) and time.monotonic() < deadline:
            assert doomed.poll() is None, doomed.communicate()
            time.sleep(0.2)
        time.sleep(1)  # the compiler is running now (even unoptimised, a file takes several seconds)
        assert doomed.poll() is None, "the build finished before it could be killed"
    finally:
        os.killpg(doomed.pid, signal.SIGKILL)
        doomed.communicate()
    assert list(cache.glob("*.partial-*")), "the killed build should leave its half-built folder"

    # 2. Two checkouts with equal sources start at once: both succeed, one compiles.
    builders = [start_build(tree, cache) for tree in (first, second)]
    try:
        outputs = [builder.communicate(timeout=BUILD_BOUND_S) for builder in builders]
    finally:
        for builder in builders:
            if builder.poll() is None:
                builder.kill()
                builder.communicate()
    assert [builder.returncode for builder in builders] == [0, 0], outputs
    stderrs = [err for _, err in outputs]
    assert sum(err.count(COMPILING) for err in stderrs) == 1, stderrs
    waiter = next(err for err in stderrs if COMPILING not in err)
    folder = build_folder(first, cache)
    assert f"waiting for another process building the recurrence kernels in {folder}" in waiter
    assert all(f"CPU  : {folder}" in out for out, _ in outputs)
    assert not list(cache.glob("*.partial-*"))

    # 3. A later process loads it without compiling.
    later = start_build(second, cache)
    out, err = later.communicate(timeout=300)
    assert later.returncode == 0 and COMPILING not in err and "already in the cache" in out
