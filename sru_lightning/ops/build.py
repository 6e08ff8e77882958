"""Build and load the C++/CUDA recurrence extension with torch.utils.cpp_extension.

The build is cached by torch (``TORCH_EXTENSIONS_DIR``, default ``~/.cache/torch_extensions``):
the first call compiles (tens of seconds), later calls and later processes just load the
library. A CPU build of torch compiles the CPU sources only; a CUDA build adds the kernels.

``python -m sru_lightning build`` prebuilds it. At run time, when the build fails, the
recurrence warns once and runs the pure-PyTorch reference instead.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import threading
import warnings

import torch

from .._resources import csrc_dir

EXTENSION_NAME = "sru_lightning_ops"
CPU_SOURCES = ("sru_ops.cpp", "sru_cpu.cpp")
CUDA_SOURCES = ("sru_cuda.cpp", "sru_cuda_kernels.cu")
# Set to 0 to skip the extension and run the reference implementation.
DISABLE_ENV = "SRU_LIGHTNING_EXTENSION"

# No trapping math: lets the compiler turn the clamps of the step math into vector selects.
# No loop-to-memcpy rewriting: the short per-block copies of the CPU kernels are faster as
# vector loops than as library calls.
CXX_FLAGS = ("-O3", "-fno-math-errno", "-fno-trapping-math", "-fno-tree-loop-distribute-patterns")
CUDA_FLAGS = ("-O3",)
# at::parallel_for is OpenMP code inlined from the ATen headers: without -fopenmp it runs on
# one thread. At run time the libgomp torch already loaded is the one used.
OPENMP_FLAGS = ("-fopenmp",) if sys.platform.startswith("linux") else ()


class ExtensionBuildError(RuntimeError):
    """The recurrence extension could not be compiled or loaded."""


_lock = threading.Lock()
_library_path: str | None = None
_failure: BaseException | None = None
_warned = False


def _find_cxx_compiler() -> str | None:
    candidate = os.environ.get("CXX", "c++")
    return shutil.which(candidate)


def wants_cuda_sources() -> bool:
    """True when this torch can run CUDA code, so the CUDA kernels are built too."""
    return torch.version.cuda is not None and torch.cuda.is_available()


def extension_sources(with_cuda: bool | None = None) -> list[str]:
    with_cuda = wants_cuda_sources() if with_cuda is None else with_cuda
    names = CPU_SOURCES + (CUDA_SOURCES if with_cuda else ())
    folder = csrc_dir()
    return [str(folder / name) for name in names]


def build_extension(verbose: bool = False) -> str:
    """Compile (or load from the cache) the extension; return the loaded library's path.

    Raises :class:`ExtensionBuildError` with the reason when it cannot be built.
    """
    if _find_cxx_compiler() is None:
        raise ExtensionBuildError(
            "sru_lightning: no C++ compiler found (looked for "
            f"{os.environ.get('CXX', 'c++')!r} on PATH); install one (e.g. `apt-get install g++`) "
            "or set CXX, then run `python -m sru_lightning build`"
        )
    from torch.utils import cpp_extension

    with_cuda = wants_cuda_sources()
    try:
        path = cpp_extension.load(
            name=EXTENSION_NAME,
            sources=extension_sources(with_cuda),
            extra_cflags=list(CXX_FLAGS + OPENMP_FLAGS) + (["-DSRU_WITH_CUDA"] if with_cuda else []),
            extra_ldflags=list(OPENMP_FLAGS),
            extra_cuda_cflags=list(CUDA_FLAGS),
            extra_include_paths=[str(csrc_dir())],
            with_cuda=with_cuda,
            is_python_module=False,
            verbose=verbose,
        )
    except Exception as error:  # compiler errors arrive as RuntimeError/CalledProcessError
        raise ExtensionBuildError(f"sru_lightning: building the recurrence extension failed: {error}") from error
    return str(path)


def load_extension(verbose: bool = False) -> str:
    """Build/load once per process; raise :class:`ExtensionBuildError` on failure."""
    global _library_path, _failure
    with _lock:
        if _library_path is not None:
            return _library_path
        if _failure is not None:
            raise ExtensionBuildError(str(_failure)) from _failure
        if os.environ.get(DISABLE_ENV, "1") == "0":
            _failure = ExtensionBuildError(f"sru_lightning: extension disabled by {DISABLE_ENV}=0")
            raise _failure
        try:
            _library_path = build_extension(verbose=verbose)
        except ExtensionBuildError as error:
            _failure = error
            raise
        return _library_path


def extension_available() -> bool:
    """True when the C++ ops are loaded; otherwise warn once and return False."""
    global _warned
    if _library_path is not None:
        return True
    try:
        load_extension()
        return True
    except ExtensionBuildError as error:
        if not _warned:
            _warned = True
            warnings.warn(
                f"{error}. Falling back to the pure-PyTorch SRU recurrence (correct, but slower). "
                "Run `python -m sru_lightning build --verbose` to see the compiler output.",
                RuntimeWarning,
                stacklevel=3,
            )
        return False


def main(argv=None) -> int:
    """``python -m sru_lightning build``: compile the extension now and say where it lives."""
    parser = argparse.ArgumentParser(
        prog="python -m sru_lightning build",
        description="Prebuild the SRU recurrence C++/CUDA extension into the torch extensions cache.",
    )
    parser.add_argument("--verbose", action="store_true", help="show the compiler commands and output")
    args = parser.parse_args([] if argv is None else list(argv))
    try:
        path = load_extension(verbose=args.verbose)
    except ExtensionBuildError as error:
        print(error)
        return 1
    kind = "CPU + CUDA" if wants_cuda_sources() else "CPU"
    print(f"sru_lightning: recurrence extension ({kind}) ready at {path}")
    return 0
