"""Build and load the CUDA recurrence kernels (csrc/sru_cuda.cpp + csrc/sru_cuda_kernels.cu),
which register the CUDA kernels of the ops the CPU extension (:mod:`.build`) defines.

The library is built on the first CUDA call (or by ``python -m sru_lightning build``) for the
architectures of the visible GPUs, ``TORCH_CUDA_ARCH_LIST`` or ``build cuda_arch=...``, with an nvcc
whose CUDA major equals torch's (:mod:`.cuda_toolkit` finds it and the architecture lists). A
build of the same sources for architectures that cover the needed ones is used as it is (one
made on a login node serves the compute nodes). A failed build keeps the CPU kernels: CUDA
tensors then run the pure-PyTorch reference after one warning naming the cause and the fix
(an error under ``SRU_LIGHTNING_REQUIRE_KERNELS=1``).
"""

from __future__ import annotations

import threading
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from .._resources import csrc_dir
from . import build_cache, cuda_toolkit
from .build import (
    CXX_FLAGS,
    EXTENSION_NAME,
    REQUIRE_ENV,
    ExtensionBuildError,
    ExtensionVariant,
    check_fallback_allowed,
    csrc_headers,
    load_extension,
    load_library,
)
from .build_cache import BuildSpec

# The CUDA library's sources, in csrc/ (every csrc/*.h is part of its key too).
CUDA_SOURCES = (
    "sru_cuda.cpp",
    "sru_cuda_kernels.cu",
)
CUDA_FLAGS = ("-O3",)


class NoCudaArchitectures(ExtensionBuildError):
    """No GPU is visible and no architectures were named: nothing to build the CUDA kernels for."""


_cuda_lock = threading.RLock()
_cuda_library_path: str | None = None
_cuda_failure: BaseException | None = None
_cuda_warned = False


@dataclass(frozen=True)
class CudaExtensionVariant(ExtensionVariant):
    """The CUDA library: an :class:`~.build.ExtensionVariant` compiled by nvcc for `archs`, whose
    nvcc flags and architectures key its cache folder too."""

    cuda_flags: tuple[str, ...] = ()
    archs: tuple[str, ...] = ()

    def key(self) -> dict:
        return {**super().key(), "cuda_flags": list(self.cuda_flags), "archs": list(self.archs)}

    def compile_into(self, folder: Path, name: str, verbose: bool, nvcc: cuda_toolkit.Nvcc | None = None) -> None:
        """Compile the library into `folder` as `name` with `nvcc`."""
        from torch.utils import cpp_extension

        if nvcc is None:
            raise ValueError("compile_into: the CUDA variant needs `nvcc` (a cuda_toolkit.Nvcc), got None")
        options = self.extension_options(folder, name, verbose)
        options.update(
            with_cuda=True,
            extra_cuda_cflags=list(self.cuda_flags) + cuda_toolkit.gencode_flags(self.archs),
            extra_ldflags=[*self.ldflags, *_cudart_link_flags(folder, nvcc)],
            extra_include_paths=[str(csrc_dir()), *map(str, nvcc.include_dirs)],
        )
        with _torch_cuda_home(nvcc.root):
            cpp_extension.load(**options)


def cuda_sources() -> list[str]:
    """The CUDA extension's sources."""
    folder = csrc_dir()
    return [str(folder / name) for name in CUDA_SOURCES]


def cuda_variant(archs: tuple[str, ...]) -> CudaExtensionVariant:
    """The CUDA extension for `archs`. The nvcc used is not part of the key (only its major,
    which must equal torch's): compute nodes without a toolkit find the build made on a login node."""
    return CudaExtensionVariant(
        "cuda",
        f"CUDA recurrence kernels for {', '.join(archs)}",
        tuple(map(Path, cuda_sources())),
        csrc_headers(),
        CXX_FLAGS,
        cuda_flags=CUDA_FLAGS,
        archs=tuple(archs),
        expected_duration="a few minutes",
    )


def cuda_build_spec(archs: tuple[str, ...]) -> BuildSpec:
    """What the CUDA extension for `archs` is built from (see :func:`cuda_variant`)."""
    return cuda_variant(archs).build_spec()


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
    (e.g. one built on a login node with ``build cuda_arch=...``)."""
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
            'were not built; pass cuda_arch="8.0;9.0" to `build` (the compute capabilities of your GPUs) or set '
            f"{cuda_toolkit.ARCH_ENV}"
        )
    if cuda_arch is None:
        existing = find_cuda_build(archs)
        if existing is not None:
            load_library(existing)
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
        load_library(library)
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
    with _cuda_lock:
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
            "After fixing it, `python -m sru_lightning build verbose=true` rebuilds and shows the compiler "
            'output (add cuda_arch="8.0;9.0" to build for GPUs this machine does not have).'
        )
        check_fallback_allowed(error, "CUDA", fix)
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
