"""Finding a CUDA compiler that matches torch, and the GPU architectures to compile for.

nvcc is looked for in three places, in this order: ``$CUDA_HOME`` / ``$CUDA_PATH``, ``PATH``,
and the ``nvidia-cuda-nvcc`` wheels inside the Python environment (what the ``cuda12`` /
``cuda13`` extras install). The first whose CUDA major version equals torch's wins; when none
does, the error names every nvcc seen and the exact packages to install.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

# pip names of the compiler and runtime-header wheels, per CUDA major. From CUDA 13 on the
# wheels drop the -cuXX suffix (the suffixed names are empty placeholders).
_WHEELS = {
    12: ("nvidia-cuda-nvcc-cu12", "nvidia-cuda-runtime-cu12"),
    13: ("nvidia-cuda-nvcc", "nvidia-cuda-runtime"),
}
_VERSION_PATTERN = re.compile(r"release (\d+)\.(\d+)")


class CudaToolkitError(RuntimeError):
    """No usable nvcc, or one that does not match torch's CUDA version."""


@dataclass(frozen=True)
class Nvcc:
    """One CUDA compiler: where it is, its version and the toolkit root around it."""

    path: Path
    version: tuple[int, int]
    origin: str  # "CUDA_HOME", "PATH" or "nvidia-cuda-nvcc wheel"
    root: Path  # bin/nvcc lives here; torch's cpp_extension takes it as CUDA_HOME
    # Extra include folders and a folder holding libcudart, for toolkits split over wheels.
    include_dirs: tuple[Path, ...] = ()
    cudart_dir: Path | None = None

    @property
    def version_text(self) -> str:
        return f"{self.version[0]}.{self.version[1]}"

    def describe(self) -> str:
        return f"nvcc {self.version_text} at {self.path} (from {self.origin})"


def install_hint(torch_cuda: str) -> str:
    """The pip command that installs an nvcc (and CUDA headers) matching `torch_cuda`."""
    major, minor = (int(part) for part in torch_cuda.split(".")[:2])
    extra = f"sru_lightning[cuda{major}]" if major in _WHEELS else None
    nvcc_wheel, runtime_wheel = _WHEELS.get(major, (f"nvidia-cuda-nvcc-cu{major}", f"nvidia-cuda-runtime-cu{major}"))
    pinned = f'pip install "{nvcc_wheel}=={major}.{minor}.*" "{runtime_wheel}=={major}.{minor}.*"'
    text = f"`{pinned}`"
    if extra:
        text += f' (or `pip install "{extra}"`)'
    return text + f", or set CUDA_HOME to a CUDA {major}.x toolkit"


def nvcc_version(nvcc: Path | str, timeout_s: float = 60.0) -> tuple[int, int]:
    """The (major, minor) release printed by ``nvcc --version``."""
    try:
        result = subprocess.run(
            [str(nvcc), "--version"], capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise CudaToolkitError(f"sru_lightning: cannot run {nvcc} --version: {error}") from error
    match = _VERSION_PATTERN.search(result.stdout)
    if result.returncode != 0 or match is None:
        raise CudaToolkitError(
            f"sru_lightning: {nvcc} --version did not print a CUDA release "
            f"(exit {result.returncode}): {(result.stdout + result.stderr).strip()[-300:]!r}"
        )
    return int(match.group(1)), int(match.group(2))


def _has_runtime_headers(root: Path) -> bool:
    return (root / "include" / "cuda_runtime_api.h").is_file()


def _toolkit_root(nvcc: Path) -> Path:
    # A wrapper script on PATH (e.g. /usr/local/bin/nvcc) is not inside its toolkit; nvcc's
    # dry run names the folder the real binary runs from.
    root = nvcc.resolve().parent.parent
    if _has_runtime_headers(root):
        return root
    try:
        dry_run = subprocess.run(
            [str(nvcc), "--dryrun", "-c", "-x", "cu", os.devnull, "-o", os.devnull],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        match = re.search(r"_HERE_=(\S+)", dry_run.stdout + dry_run.stderr)
    except (OSError, subprocess.TimeoutExpired):
        match = None
    if match and _has_runtime_headers(Path(match.group(1)).parent):
        return Path(match.group(1)).parent
    return root


def _wheel_folders() -> list[Path]:
    """The ``nvidia`` namespace folders of the installed NVIDIA wheels."""
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        spec = None
    folders = [Path(p) for p in (spec.submodule_search_locations or [])] if spec else []
    # find_spec misses a namespace shadowed by a regular package; look at sys.path as well.
    for entry in sys.path:
        candidate = Path(entry or ".") / "nvidia"
        if candidate.is_dir() and candidate not in folders:
            folders.append(candidate)
    return folders


def _wheel_candidates() -> list[tuple[Path, Path, tuple[Path, ...], Path | None]]:
    """(nvcc, root, extra include dirs, cudart dir) for each nvcc wheel found."""
    found = []
    for folder in _wheel_folders():
        # CUDA 12 wheels: nvidia/cuda_nvcc + nvidia/cuda_runtime; CUDA 13: nvidia/cu13/.
        layouts = [(folder / "cuda_nvcc", folder / "cuda_runtime")]
        layouts += [(tree, tree) for tree in sorted(folder.glob("cu[0-9]*"))]
        for compiler_tree, runtime_tree in layouts:
            nvcc = compiler_tree / "bin" / "nvcc"
            if not nvcc.is_file():
                continue
            runtime_include = runtime_tree / "include"
            includes = (runtime_include,) if runtime_tree != compiler_tree and runtime_include.is_dir() else ()
            cudart = next((p.parent for p in sorted(runtime_tree.glob("lib*/libcudart.so*"))), None)
            found.append((nvcc, compiler_tree, includes, cudart))
    return found


def find_nvcc_candidates() -> list[Nvcc]:
    """Every nvcc this process can see, in search order, with its version."""
    seen: set[Path] = set()
    candidates: list[Nvcc] = []

    def add(path: Path, origin: str, root: Path | None = None, includes=(), cudart=None):
        try:
            key = path.resolve()
        except OSError:
            return
        if key in seen or not path.is_file():
            return
        seen.add(key)
        try:
            version = nvcc_version(path)
        except CudaToolkitError:
            return
        candidates.append(Nvcc(path, version, origin, root or _toolkit_root(path), tuple(includes), cudart))

    for variable in ("CUDA_HOME", "CUDA_PATH"):
        home = os.environ.get(variable)
        if home:
            add(Path(home) / "bin" / "nvcc", variable, Path(home))
    on_path = shutil.which("nvcc")
    if on_path:
        add(Path(on_path), "PATH")
    for nvcc, root, includes, cudart in _wheel_candidates():
        add(nvcc, "nvidia-cuda-nvcc wheel", root, includes, cudart)
    return candidates


def select_nvcc(torch_cuda: str | None, candidates: list[Nvcc] | None = None) -> Nvcc:
    """The first nvcc whose CUDA major equals torch's; a :class:`CudaToolkitError` naming what
    to install otherwise."""
    if torch_cuda is None:
        raise CudaToolkitError(
            "sru_lightning: this torch has no CUDA (torch.version.cuda is None), so there are no "
            "CUDA kernels to build; install a CUDA build of torch (https://pytorch.org/get-started)"
        )
    candidates = find_nvcc_candidates() if candidates is None else candidates
    wanted_major = int(torch_cuda.split(".")[0])
    for candidate in candidates:
        if candidate.version[0] == wanted_major:
            return candidate
    if not candidates:
        raise CudaToolkitError(
            f"sru_lightning: no CUDA compiler (nvcc) found for torch's CUDA {torch_cuda}: looked in "
            "$CUDA_HOME/$CUDA_PATH, PATH and the nvidia-cuda-nvcc wheels. Install one: " + install_hint(torch_cuda)
        )
    seen = "; ".join(candidate.describe() for candidate in candidates)
    raise CudaToolkitError(
        f"sru_lightning: torch was built with CUDA {torch_cuda} but the CUDA compiler found is "
        f"for another major version ({seen}); the kernels must be compiled by a CUDA "
        f"{wanted_major}.x nvcc. Install one: " + install_hint(torch_cuda)
    )


# --- architectures ---------------------------------------------------------------------------

_ARCH_PATTERN = re.compile(r"^(\d+)\.(\d+)([a-z]?)(\+PTX)?$")
ARCH_ENV = "TORCH_CUDA_ARCH_LIST"


def parse_arch_list(text: str, argument: str = "cuda_arch") -> tuple[str, ...]:
    """``"8.0;9.0+PTX"`` (``;``, ``,`` or space separated) -> ``("8.0", "9.0+PTX")``, sorted."""
    archs = [part for part in re.split(r"[;, ]+", text.strip()) if part]
    bad = [arch for arch in archs if not _ARCH_PATTERN.match(arch)]
    if not archs or bad:
        raise ValueError(
            f'{argument}: expected compute capabilities like "8.0;9.0" (optionally "9.0+PTX"), received {text!r}'
        )
    return tuple(sorted(set(archs), key=lambda a: (int(a.split(".")[0]), a)))


def visible_device_archs() -> tuple[str, ...]:
    """The compute capabilities of the visible GPUs (empty without a GPU)."""
    import torch

    if not torch.cuda.is_available():
        return ()
    capabilities = {torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())}
    return tuple(f"{major}.{minor}" for major, minor in sorted(capabilities))


def resolve_archs(requested: str | None = None) -> tuple[tuple[str, ...], str]:
    """The architectures to compile for and where that choice came from: the argument, then
    ``TORCH_CUDA_ARCH_LIST``, then the visible GPUs. Empty when none of these gives any."""
    if requested:
        return parse_arch_list(requested), "cuda_arch"
    from_env = os.environ.get(ARCH_ENV, "")
    if from_env and from_env != "native":
        return parse_arch_list(from_env, argument=ARCH_ENV), ARCH_ENV
    return visible_device_archs(), "the visible GPUs"


def gencode_flags(archs: tuple[str, ...]) -> list[str]:
    """nvcc ``-gencode`` flags: SASS for each arch, plus PTX for the ones marked ``+PTX``."""
    flags = []
    for arch in archs:
        number = arch.split("+")[0].replace(".", "")
        flags.append(f"-gencode=arch=compute_{number},code=sm_{number}")
        if arch.endswith("+PTX"):
            flags.append(f"-gencode=arch=compute_{number},code=compute_{number}")
    return flags


def archs_cover(built: tuple[str, ...], needed: tuple[str, ...]) -> bool:
    """True when a library built for `built` runs on every device of capability `needed`:
    the same capability, or PTX of an equal or lower one (the driver compiles it)."""

    def runs_on(device: str) -> bool:
        major, minor = (int(part) for part in device.split(".")[:2])
        for arch in built:
            match = _ARCH_PATTERN.match(arch)
            if match is None:
                continue
            built_cap = (int(match.group(1)), int(match.group(2)))
            if built_cap == (major, minor) and not match.group(3):
                return True
            if match.group(4) and built_cap <= (major, minor):
                return True
        return False

    return bool(needed) and all(runs_on(device) for device in needed)
