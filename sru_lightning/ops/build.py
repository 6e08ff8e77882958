"""Build and load the recurrence kernels: a CPU extension always, a CUDA one when torch has CUDA.

Two libraries, both registering into the ``torch.ops.sru_lightning`` namespace:

* the CPU extension (csrc/sru_ops.cpp, sru_checks.cpp, sru_workspace.cpp, sru_cpu.cpp and one
  sru_cpu_<level>.cpp per vector level it holds, see :mod:`.cpu_levels`) holds the op schemas,
  their argument checks, the scratch-buffer cache and the CPU kernels, and needs only the C++
  compiler;
* the CUDA extension (csrc/sru_cuda.cpp + csrc/sru_cuda_kernels.cu) registers the CUDA
  kernels of the same ops. It is built on the first CUDA call (or by ``python -m sru_lightning
  build``) and needs an nvcc whose CUDA major equals torch's (see :mod:`.cuda_toolkit`).

A third variant, the CUDA kernels' source compiled as C++ for the CPU (ops
``torch.ops.sru_lightning_cuda_emulated``, see :mod:`sru_lightning.diagnostics.cuda_emulation`),
is built from the same description by :func:`load_emulation`.

A failed CUDA build keeps the CPU kernels: CUDA tensors then run the pure-PyTorch reference
after one warning naming the cause and the fix. ``SRU_LIGHTNING_REQUIRE_KERNELS=1`` turns
every such fallback, CPU or CUDA, into an error. Both libraries live in the content-keyed cache
of :mod:`.build_cache`.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import sys
import sysconfig
import threading
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from .._resources import csrc_dir
from . import build_cache, cpu_levels, cuda_toolkit
from .build_cache import BuildSpec

# Prefix of every cached library's folder and module name.
EXTENSION_NAME = "sru_lightning"
# The sources of each variant, in csrc/ (every csrc/*.h is part of each variant's key). The CPU
# library adds the files of its vector levels (cpu_levels.sources).
CPU_SOURCES = (
    "sru_ops.cpp",
    "sru_checks.cpp",
    "sru_workspace.cpp",
    "sru_cpu.cpp",
)
CUDA_SOURCES = (
    "sru_cuda.cpp",
    "sru_cuda_kernels.cu",
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
CUDA_FLAGS = ("-O3",)
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

    `variant` is "cpu", "cuda" or "cuda_emulation"; `included` are the files the sources
    include (headers, and the .cu for the emulation): they key the cache like the sources.
    """

    variant: str
    description: str
    sources: tuple[Path, ...]
    included: tuple[Path, ...]
    cxx_flags: tuple[str, ...]
    ldflags: tuple[str, ...] = ()
    cuda_flags: tuple[str, ...] = ()
    archs: tuple[str, ...] = ()
    levels: tuple[str, ...] = ()
    expected_duration: str = "about a minute"

    def build_spec(self) -> BuildSpec:
        """The cache entry of this library: its key hashes the toolchain, the flags and the
        contents of every source and included file."""
        files = sorted({*self.sources, *self.included}, key=lambda path: path.name)
        key = {
            **_toolchain_key(),
            "cxx_flags": list(self.cxx_flags),
            "sources": build_cache.digest_files(files),
        }
        if self.variant == "cuda":
            key.update(cuda_flags=list(self.cuda_flags), archs=list(self.archs))
        if self.variant == "cpu":
            key.update(levels=list(self.levels))
        return BuildSpec(self.variant, self.description, key, self.expected_duration, units=len(self.sources))

    def compile_into(self, folder: Path, name: str, verbose: bool, nvcc: cuda_toolkit.Nvcc | None = None) -> None:
        """Compile this library into `folder` as `name` (with `nvcc` for the CUDA variant)."""
        from torch.utils import cpp_extension

        options = dict(
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
        if self.variant != "cuda":
            cpp_extension.load(**options)
            return
        if nvcc is None:
            raise ValueError("compile_into: the CUDA variant needs `nvcc` (a cuda_toolkit.Nvcc), got None")
        options.update(
            with_cuda=True,
            extra_cuda_cflags=list(self.cuda_flags) + cuda_toolkit.gencode_flags(self.archs),
            extra_ldflags=[*self.ldflags, *_cudart_link_flags(folder, nvcc)],
            extra_include_paths=[str(csrc_dir()), *map(str, nvcc.include_dirs)],
        )
        with _torch_cuda_home(nvcc.root):
            cpp_extension.load(**options)


class ExtensionBuildError(RuntimeError):
    """The recurrence extension could not be compiled or loaded."""


class NoCudaArchitectures(ExtensionBuildError):
    """No GPU is visible and no architectures were named: nothing to build the CUDA kernels for."""


_lock = threading.RLock()
_library_path: str | None = None
_library_levels: tuple[str, ...] = ()
_failure: BaseException | None = None
_warned = False
_cuda_library_path: str | None = None
_cuda_failure: BaseException | None = None
_cuda_warned = False


def kernels_required() -> bool:
    """True when ``SRU_LIGHTNING_REQUIRE_KERNELS=1``: no silent fallback to the reference."""
    return os.environ.get(REQUIRE_ENV, "0").strip().lower() in ("1", "true", "yes")


def _find_cxx_compiler() -> str | None:
    candidate = os.environ.get("CXX", "c++")
    return shutil.which(candidate)


def extension_sources(with_cuda: bool = False) -> list[str]:
    """The CPU extension's sources, or the CUDA extension's when `with_cuda`."""
    folder = csrc_dir()
    return [str(folder / name) for name in (CUDA_SOURCES if with_cuda else CPU_SOURCES)]


def _headers(kernels_dir: Path | None = None) -> tuple[Path, ...]:
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
        (*level_files, *map(Path, extension_sources(with_cuda=False))),
        _headers() + other_level_files,
        CXX_FLAGS + OPENMP_FLAGS,
        ldflags=OPENMP_FLAGS,
        levels=levels,
        expected_duration=cpu_levels.expected_duration(levels),
    )


def cuda_variant(archs: tuple[str, ...]) -> ExtensionVariant:
    """The CUDA extension for `archs`. The nvcc used is not part of the key (only its major,
    which must equal torch's): compute nodes without a toolkit find the build made on a login node."""
    return ExtensionVariant(
        "cuda",
        f"CUDA recurrence kernels for {', '.join(archs)}",
        tuple(map(Path, extension_sources(with_cuda=True))),
        _headers(),
        CXX_FLAGS,
        cuda_flags=CUDA_FLAGS,
        archs=tuple(archs),
        expected_duration="a few minutes",
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
        included + _headers(folder),
        EMULATION_FLAGS + (SANITIZE_FLAGS if sanitize else ()),
        ldflags=SANITIZE_LDFLAGS if sanitize else (),
    )


def cpu_build_spec(levels: tuple[str, ...] | None = None) -> BuildSpec:
    """What the CPU extension (of `levels`, default this process's) is built from; its hash names
    the cache folder."""
    return cpu_variant(levels).build_spec()


def cuda_build_spec(archs: tuple[str, ...]) -> BuildSpec:
    """What the CUDA extension for `archs` is built from (see :func:`cuda_variant`)."""
    return cuda_variant(archs).build_spec()


# --- CPU ------------------------------------------------------------------------------------


def _load_library(path: Path, share_symbols: bool = True) -> None:
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
            _load_library(found[0])
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
        _load_library(library)
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


def _fallback(error: BaseException, device: str, fix: str) -> None:
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
        fix = "Run `python -m sru_lightning build --verbose` to see the compiler output."
        _fallback(error, "CPU", fix)
        if not _warned:
            _warned = True
            warnings.warn(
                f"{error}. Falling back to the pure-PyTorch SRU recurrence (correct, but slower). {fix}",
                RuntimeWarning,
                stacklevel=3,
            )
        return False


# --- CUDA -----------------------------------------------------------------------------------


@contextmanager
def _torch_cuda_home(root: Path):
    # torch's cpp_extension reads its module-level CUDA_HOME for nvcc, headers and libcudart;
    # point it at the toolkit picked here for the length of one build.
    from torch.utils import cpp_extension

    saved = cpp_extension.CUDA_HOME
    cpp_extension.CUDA_HOME = str(root)
    try:
        yield
    finally:
        cpp_extension.CUDA_HOME = saved


def _cudart_link_flags(folder: Path, nvcc: cuda_toolkit.Nvcc) -> list[str]:
    """Linker flags finding libcudart: the runtime wheel ships libcudart.so.<major> only, and the
    linker's -lcudart wants libcudart.so, so a link named that way goes into the build folder."""
    if nvcc.cudart_dir is None:
        return []
    link_dir = folder / "cudart"
    link_dir.mkdir()
    target = next(iter(sorted(nvcc.cudart_dir.glob("libcudart.so*"))))
    (link_dir / "libcudart.so").symlink_to(target)
    return [f"-L{link_dir}"]


# Enough of the compiler's output to show the first error; --verbose shows all of it.
_OUTPUT_TAIL_CHARS = 2000


def _compiler_output_tail(text: str) -> str:
    return text if len(text) <= _OUTPUT_TAIL_CHARS else "...\n" + text[-_OUTPUT_TAIL_CHARS:]


def _host_compiler_hint(text: str) -> str:
    """The fix for nvcc refusing the host C++ compiler (one newer than it supports)."""
    if "unsupported GNU version" in text or "unsupported clang version" in text:
        return (
            "\nnvcc does not support this host C++ compiler: install one it supports and point nvcc at "
            "it, e.g. `NVCC_CCBIN=/usr/bin/g++-12`"
        )
    return ""


def find_cuda_build(archs_needed: tuple[str, ...]) -> Path | None:
    """A finished CUDA build of these sources, flags and torch whose archs cover `archs_needed`
    (e.g. one built on a login node with ``--cuda-arch``)."""
    wanted = {k: v for k, v in cuda_build_spec(()).key.items() if k != "archs"}
    for directory, manifest in build_cache.finished_builds(build_cache.cache_root(), f"{EXTENSION_NAME}_cuda_"):
        same_inputs = all(manifest.get(k) == v for k, v in wanted.items())
        library = build_cache.library_file(directory, manifest.get("name", ""))
        if (
            same_inputs
            and library.is_file()
            and cuda_toolkit.archs_cover(tuple(manifest.get("archs", ())), archs_needed)
        ):
            return library
    return None


def build_cuda_extension(cuda_arch: str | None = None, verbose: bool = False) -> tuple[str, tuple[str, ...], bool]:
    """Compile the CUDA extension (or find it in the cache) and load it.

    `cuda_arch` ("8.0;9.0") overrides ``TORCH_CUDA_ARCH_LIST`` and the visible GPUs. Returns
    (library path, archs built for, compiled now?). The CPU extension must be loaded first.
    Raises :class:`ExtensionBuildError` naming the cause and the fix.
    """
    if torch.version.cuda is None:
        raise ExtensionBuildError(
            f"sru_lightning: torch {torch.__version__} has no CUDA, so there are no CUDA kernels to "
            "build; install a CUDA build of torch (https://pytorch.org/get-started)"
        )
    try:
        archs, archs_from = cuda_toolkit.resolve_archs(cuda_arch)
    except ValueError as error:
        raise ExtensionBuildError(f"sru_lightning: {error}") from error
    if not archs:
        raise NoCudaArchitectures(
            "sru_lightning: no GPU is visible and no CUDA architectures were given, so the CUDA kernels "
            'were not built; pass --cuda-arch "8.0;9.0" (the compute capabilities of your GPUs) or set '
            f"{cuda_toolkit.ARCH_ENV}"
        )
    if cuda_arch is None:
        existing = find_cuda_build(archs)
        if existing is not None:
            _load_library(existing)
            return str(existing), tuple(build_cache.read_manifest(existing.parent)["archs"]), False
    variant = cuda_variant(archs)
    spec = variant.build_spec()
    library = build_cache.library_file(spec.directory(), spec.name)
    nvcc = None
    if build_cache.read_manifest(spec.directory()) is None or not library.is_file():
        try:
            nvcc = cuda_toolkit.select_nvcc(torch.version.cuda)
        except cuda_toolkit.CudaToolkitError as error:
            raise ExtensionBuildError(str(error)) from error
        spec.notes["nvcc"] = nvcc.describe()
    try:
        library, compiled = build_cache.ensure_built(
            spec, lambda folder, name: variant.compile_into(folder, name, verbose, nvcc)
        )
        _load_library(library)
    except Exception as error:
        where = f" with {nvcc.describe()}" if nvcc else ""
        raise ExtensionBuildError(
            f"sru_lightning: building the CUDA recurrence extension{where} for {';'.join(archs)} "
            f"({archs_from}) failed: {_compiler_output_tail(str(error))}{_host_compiler_hint(str(error))}"
        ) from error
    return str(library), archs, compiled


def load_cuda_extension(verbose: bool = False) -> str:
    """Build/load the CUDA extension once per process (after the CPU one); raise
    :class:`ExtensionBuildError` on failure."""
    global _cuda_library_path, _cuda_failure
    with _lock:
        if _cuda_library_path is not None:
            return _cuda_library_path
        if _cuda_failure is not None:
            raise ExtensionBuildError(str(_cuda_failure)) from _cuda_failure
        load_extension(verbose=verbose)
        try:
            _cuda_library_path, _, _ = build_cuda_extension(verbose=verbose)
        except ExtensionBuildError as error:
            _cuda_failure = error
            raise
        return _cuda_library_path


def cuda_extension_available() -> bool:
    """True when the CUDA kernels are loaded; otherwise one loud warning naming the cause and
    the fix, and False (CUDA tensors then run the reference); an error under
    ``SRU_LIGHTNING_REQUIRE_KERNELS=1``."""
    global _cuda_warned
    if _cuda_library_path is not None:
        return True
    try:
        load_cuda_extension()
        return True
    except ExtensionBuildError as error:
        fix = (
            "After fixing it, `python -m sru_lightning build --verbose` rebuilds and shows the compiler "
            'output (add --cuda-arch "8.0;9.0" to build for GPUs this machine does not have).'
        )
        _fallback(error, "CUDA", fix)
        if not _cuda_warned:
            _cuda_warned = True
            warnings.warn(
                f"\n*** sru_lightning: the CUDA recurrence kernels are NOT available; CUDA tensors run the "
                f"pure-PyTorch reference recurrence (correct, but many times slower). ***\nCause: {error}\n"
                f"{fix} Set {REQUIRE_ENV}=1 to make this an error instead.",
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
        _load_library(library, share_symbols=False)
        _emulation_loaded[spec.name] = str(library)
        return str(library)


def emulation_loaded() -> bool:
    """True when this process has loaded an emulation build."""
    return bool(_emulation_loaded)
