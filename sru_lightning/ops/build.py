"""Build and load the recurrence kernels: a CPU extension always, a CUDA one when torch has CUDA.

Two libraries, both registering into the ``torch.ops.sru_lightning`` namespace:

* the CPU extension (csrc/sru_ops.cpp, sru_checks.cpp, sru_workspace.cpp, sru_cpu.cpp and one
  sru_cpu_<level>.cpp per vector level it holds, see :mod:`.cpu_levels`) holds the op schemas,
  their argument checks, the scratch-buffer cache and the CPU kernels, and needs only the C++
  compiler; it is built here;
* the CUDA extension registers the CUDA kernels of the same ops; :mod:`.build_cuda` builds it
  from the same description (:class:`ExtensionVariant`) with nvcc.

A third variant, the CUDA kernels' source compiled as C++ for the CPU (ops
``torch.ops.sru_lightning_cuda_emulated``, see :mod:`sru_lightning.diagnostics.cuda_emulation`),
is built from the same description by :func:`load_emulation`.

A failed build runs the pure-PyTorch reference after one warning naming the cause and the fix
(a failed CUDA build keeps the CPU kernels). ``SRU_LIGHTNING_REQUIRE_KERNELS=1`` turns every
such fallback, CPU or CUDA, into an error (:func:`check_fallback_allowed`). Both libraries
live in the content-keyed cache of :mod:`.build_cache`.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import sys
import sysconfig
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from .._resources import csrc_dir
from . import build_cache, cpu_levels
from .build_cache import BuildSpec

# Prefix of every cached library's folder and module name.
EXTENSION_NAME = "sru_lightning"
# The sources of the CPU library, in csrc/ (every csrc/*.h is part of each variant's key); it adds
# the files of its vector levels (cpu_levels.sources). The CUDA library's are in build_cuda.
CPU_SOURCES = (
    "sru_ops.cpp",
    "sru_checks.cpp",
    "sru_workspace.cpp",
    "sru_cpu.cpp",
)
# The emulation: the plumbing and the binding (always from csrc/), then the kernels' C++
# wrapper, which includes the .cu. The two kernel files may come from another folder.
EMULATION_SOURCES = (
    "sru_checks.cpp",
    "sru_workspace.cpp",
    "sru_cuda_emulated.cpp",
    "sru_cuda_kernels_emulated.cpp",
)
EMULATION_KERNEL_FILES = (
    "sru_cuda_kernels_emulated.cpp",
    "sru_cuda_kernels.cu",
)
# The op namespace the emulation registers (csrc/sru_cuda_emulated.cpp).
EMULATION_NAMESPACE = "sru_lightning_cuda_emulated"
# Set to 0 to skip the extensions and run the reference implementation.
DISABLE_ENV = "SRU_LIGHTNING_EXTENSION"
# Set to 1 to make any fallback to the reference an error (clusters that would rather fail than crawl).
REQUIRE_ENV = "SRU_LIGHTNING_REQUIRE_KERNELS"

# No trapping math: lets the compiler turn the clamps of the step math into vector selects.
# No loop-to-memcpy rewriting: the short per-block copies of the CPU kernels are faster as
# vector loops than as library calls.
CXX_FLAGS = ("-O3", "-fno-math-errno", "-fno-trapping-math", "-fno-tree-loop-distribute-patterns")
# at::parallel_for is OpenMP code inlined from the ATen headers: without -fopenmp it runs on
# one thread. At run time the libgomp torch already loaded is the one used.
OPENMP_FLAGS = ("-fopenmp",) if sys.platform.startswith("linux") else ()
EMULATION_FLAGS = ("-O1", "-DSRU_CUDA_EMULATION")
# AddressSanitizer plays compute-sanitizer's memcheck; the alignment check stands in for
# the GPU's misaligned-address fault (the vector loads of U).
SANITIZE_FLAGS = ("-g", "-fno-omit-frame-pointer", "-fsanitize=address,alignment", "-fno-sanitize-recover=all")
SANITIZE_LDFLAGS = ("-fsanitize=address,alignment",)


@dataclass(frozen=True)
class ExtensionVariant:
    """One library built from csrc/: its files, its flags, and what names its cache folder.

    `variant` is "cpu", "cuda" (:class:`.build_cuda.CudaExtensionVariant`) or "cuda_emulation";
    `included` are the files the sources include (headers, and the .cu for the emulation): they
    key the cache like the sources.
    """

    variant: str
    description: str
    sources: tuple[Path, ...]
    included: tuple[Path, ...]
    cxx_flags: tuple[str, ...]
    ldflags: tuple[str, ...] = ()
    levels: tuple[str, ...] = ()
    expected_duration: str = "about a minute"

    def key(self) -> dict:
        """What changes the binary: the toolchain, the flags and the contents of every source and
        included file (and the CPU library's vector levels)."""
        files = sorted({*self.sources, *self.included}, key=lambda path: path.name)
        key = {
            **_toolchain_key(),
            "cxx_flags": list(self.cxx_flags),
            "sources": build_cache.digest_files(files),
        }
        if self.variant == "cpu":
            key.update(levels=list(self.levels))
        return key

    def build_spec(self) -> BuildSpec:
        """The cache entry of this library: its key (:meth:`key`) names its folder."""
        return BuildSpec(self.variant, self.description, self.key(), self.expected_duration, units=len(self.sources))

    def extension_options(self, folder: Path, name: str, verbose: bool) -> dict:
        """The arguments of torch's `cpp_extension.load` that compile this library into `folder` as `name`."""
        return dict(
            name=name,
            sources=[str(path) for path in self.sources],
            extra_cflags=[*self.cxx_flags, *cpu_levels.defines(self.levels)],
            extra_ldflags=list(self.ldflags),
            extra_include_paths=[str(csrc_dir())],
            with_cuda=False,
            is_python_module=False,
            build_directory=str(folder),
            verbose=verbose,
        )

    def compile_into(self, folder: Path, name: str, verbose: bool) -> None:
        """Compile this library into `folder` as `name`."""
        from torch.utils import cpp_extension

        cpp_extension.load(**self.extension_options(folder, name, verbose))


class ExtensionBuildError(RuntimeError):
    """The recurrence extension could not be compiled or loaded."""


_lock = threading.RLock()
_library_path: str | None = None
_library_levels: tuple[str, ...] = ()
_failure: BaseException | None = None
_warned = False


def kernels_required() -> bool:
    """True when ``SRU_LIGHTNING_REQUIRE_KERNELS=1``: no silent fallback to the reference."""
    return os.environ.get(REQUIRE_ENV, "0").strip().lower() in ("1", "true", "yes")


def _find_cxx_compiler() -> str | None:
    candidate = os.environ.get("CXX", "c++")
    return shutil.which(candidate)


def extension_sources() -> list[str]:
    """The CPU extension's sources (the CUDA extension's: :func:`.build_cuda.cuda_sources`)."""
    folder = csrc_dir()
    return [str(folder / name) for name in CPU_SOURCES]


def csrc_headers(kernels_dir: Path | None = None) -> tuple[Path, ...]:
    """Every csrc/*.h, each taken from `kernels_dir` instead where that folder has it."""
    found = []
    for header in sorted(csrc_dir().glob("*.h")):
        override = None if kernels_dir is None else kernels_dir / header.name
        found.append(override if override is not None and override.is_file() else header)
    return tuple(found)


def _toolchain_key() -> dict:
    return {
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "python": f"{sys.implementation.cache_tag}{getattr(sys, 'abiflags', '')}",
        "platform": sysconfig.get_platform(),
        "cxx": os.environ.get("CXX", "c++"),
    }


def cpu_variant(levels: tuple[str, ...] | None = None) -> ExtensionVariant:
    """The CPU extension holding the vector `levels` (default: the ones this process needs,
    :func:`.cpu_levels.needed_levels`): the op schemas and the CPU kernels. Every level file
    keys the cache, built or not, so libraries of other levels are told apart by `levels` only."""
    levels = cpu_levels.needed_levels() if levels is None else tuple(levels)
    folder = csrc_dir()
    level_files = tuple(folder / name for name in cpu_levels.sources(levels))
    other_level_files = tuple(
        folder / name for name in cpu_levels.sources(cpu_levels.all_levels()) if folder / name not in level_files
    )
    return ExtensionVariant(
        "cpu",
        f"CPU recurrence kernels ({', '.join(levels)})",
        # The level files first: they take longest, and ninja starts its jobs in this order.
        (*level_files, *map(Path, extension_sources())),
        csrc_headers() + other_level_files,
        CXX_FLAGS + OPENMP_FLAGS,
        ldflags=OPENMP_FLAGS,
        levels=levels,
        expected_duration=cpu_levels.expected_duration(levels),
    )


def emulation_variant(kernels_dir: str | os.PathLike | None = None, sanitize: bool = False) -> ExtensionVariant:
    """The CUDA kernels' source compiled as C++ for the CPU. `kernels_dir` holds another copy of
    the kernel files (:data:`EMULATION_KERNEL_FILES`; default csrc/), whose headers, where it has
    them, replace csrc/'s; `sanitize` builds with AddressSanitizer."""
    folder = Path(kernels_dir) if kernels_dir is not None else csrc_dir()
    missing = [name for name in EMULATION_KERNEL_FILES if not (folder / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{EMULATION_NAMESPACE}: kernels_dir {folder} lacks {missing}")
    sources = tuple((folder if name in EMULATION_KERNEL_FILES else csrc_dir()) / name for name in EMULATION_SOURCES)
    included = tuple(folder / name for name in EMULATION_KERNEL_FILES if name not in EMULATION_SOURCES)
    description = "CUDA kernels emulated on the CPU" + (" (ASan build)" if sanitize else "")
    return ExtensionVariant(
        "cuda_emulation",
        description,
        sources,
        included + csrc_headers(folder),
        EMULATION_FLAGS + (SANITIZE_FLAGS if sanitize else ()),
        ldflags=SANITIZE_LDFLAGS if sanitize else (),
    )


def cpu_build_spec(levels: tuple[str, ...] | None = None) -> BuildSpec:
    """What the CPU extension (of `levels`, default this process's) is built from; its hash names
    the cache folder."""
    return cpu_variant(levels).build_spec()


# --- CPU ------------------------------------------------------------------------------------


def load_library(path: Path, share_symbols: bool = True) -> None:
    # Global symbols: the CUDA extension uses the tensor plumbing (argument checks, output
    # allocation) defined once in the CPU library instead of carrying a second copy.
    if share_symbols:
        ctypes.CDLL(str(path), mode=getattr(ctypes, "RTLD_GLOBAL", 0))
    torch.ops.load_library(str(path))


def find_cpu_build(needed: tuple[str, ...]) -> tuple[Path, tuple[str, ...]] | None:
    """(library, its levels) of a finished CPU build of these sources, flags and torch that runs a
    process needing the vector levels `needed` (its own build, or one holding every level)."""
    wanted = {k: v for k, v in cpu_build_spec(needed).key.items() if k != "levels"}
    for directory, manifest in build_cache.finished_builds(build_cache.cache_root(), f"{EXTENSION_NAME}_cpu_"):
        levels = tuple(manifest.get("levels", ()))
        library = build_cache.library_file(directory, manifest.get("name", ""))
        same_inputs = all(manifest.get(k) == v for k, v in wanted.items())
        if same_inputs and cpu_levels.covers(levels, needed) and library.is_file():
            return library, levels
    return None


def build_extension(verbose: bool = False, all_levels: bool = False) -> str:
    """Compile the CPU extension (or find it in the cache) and load it; return its path.

    The library holds the vector levels this process needs, or every level with `all_levels`
    (a cache shared by machines with different processors). A finished library holding more
    levels than needed is used as it is. Raises :class:`ExtensionBuildError` with the reason
    when it cannot be built.
    """
    global _library_levels
    needed = cpu_levels.all_levels() if all_levels else cpu_levels.needed_levels()
    variant = cpu_variant(needed)
    spec = variant.build_spec()
    library = build_cache.library_file(spec.directory(), spec.name)
    if not library.is_file():
        found = find_cpu_build(needed)
        if found is not None:
            load_library(found[0])
            _library_levels = found[1]
            return str(found[0])
    if not library.is_file() and _find_cxx_compiler() is None:
        raise ExtensionBuildError(
            "sru_lightning: no C++ compiler found (looked for "
            f"{os.environ.get('CXX', 'c++')!r} on PATH); install one (e.g. `apt-get install g++`) "
            "or set CXX, then run `python -m sru_lightning build`"
        )
    try:
        library, _ = build_cache.ensure_built(spec, lambda folder, name: variant.compile_into(folder, name, verbose))
        load_library(library)
        _library_levels = needed
    except Exception as error:  # compiler errors arrive as RuntimeError/CalledProcessError
        raise ExtensionBuildError(f"sru_lightning: building the CPU recurrence extension failed: {error}") from error
    return str(library)


def extension_loaded() -> bool:
    """True when this process has loaded the CPU extension."""
    return _library_path is not None


def loaded_cpu_levels() -> tuple[str, ...]:
    """The vector levels of the CPU library this process loaded (empty before it is loaded)."""
    return _library_levels


def load_extension(verbose: bool = False, all_levels: bool = False) -> str:
    """Build/load the CPU extension once per process (with every vector level when
    `all_levels`); raise :class:`ExtensionBuildError` on failure."""
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
            _library_path = build_extension(verbose=verbose, all_levels=all_levels)
        except ExtensionBuildError as error:
            _failure = error
            raise
        return _library_path


def check_fallback_allowed(error: BaseException, device: str, fix: str) -> None:
    """Raise under SRU_LIGHTNING_REQUIRE_KERNELS=1; otherwise the caller warns (once)."""
    if kernels_required():
        raise ExtensionBuildError(
            f"{error}. {REQUIRE_ENV}=1 forbids running the {device} recurrence on the pure-PyTorch reference. {fix}"
        ) from error


def extension_available() -> bool:
    """True when the CPU ops are loaded; otherwise warn once and return False (raise under
    ``SRU_LIGHTNING_REQUIRE_KERNELS=1``)."""
    global _warned
    if _library_path is not None:
        return True
    try:
        load_extension()
        return True
    except ExtensionBuildError as error:
        fix = "Run `python -m sru_lightning build verbose=true` to see the compiler output."
        check_fallback_allowed(error, "CPU", fix)
        if not _warned:
            _warned = True
            warnings.warn(
                f"{error}. Falling back to the pure-PyTorch SRU recurrence (correct, but slower). {fix}",
                RuntimeWarning,
                stacklevel=3,
            )
        return False


# --- the CUDA kernels emulated on the CPU ----------------------------------------------------

_emulation_loaded: dict[str, str] = {}


def load_emulation(kernels_dir: str | os.PathLike | None = None, sanitize: bool = False, verbose: bool = False) -> str:
    """Compile (or find in the cache) the emulated CUDA kernels of :func:`emulation_variant`
    and load them as ``torch.ops.sru_lightning_cuda_emulated``; return the library's path.

    One process holds one build (the op namespace can be registered only once): asking for
    another one raises RuntimeError.
    """
    variant = emulation_variant(kernels_dir, sanitize)
    spec = variant.build_spec()
    with _lock:
        if spec.name in _emulation_loaded:
            return _emulation_loaded[spec.name]
        if _emulation_loaded:
            raise RuntimeError(
                f"{EMULATION_NAMESPACE}: this process already loaded {next(iter(_emulation_loaded))}; "
                f"build {spec.name} in a new process"
            )
        library, _ = build_cache.ensure_built(spec, lambda folder, name: variant.compile_into(folder, name, verbose))
        # Local symbols: the emulation carries its own copy of the plumbing.
        load_library(library, share_symbols=False)
        _emulation_loaded[spec.name] = str(library)
        return str(library)


def emulation_loaded() -> bool:
    """True when this process has loaded an emulation build."""
    return bool(_emulation_loaded)
