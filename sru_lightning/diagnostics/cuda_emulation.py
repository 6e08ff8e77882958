"""The CUDA kernels on the CPU: csrc/sru_cuda_kernels.cu compiled as C++ and run serially.

:func:`sru_lightning.ops.build.load_emulation` compiles the unchanged CUDA source with the
C++ compiler (the ``cuda_emulation`` variant of the build, cached like the CPU and CUDA
libraries) through a small shim (csrc/sru_cuda_emulation.h: a launch loop over the grid, the
thread built-ins, the device's ``expf``) and binds it to CPU tensors with the same binding as the real CUDA kernels
(csrc/sru_cuda_binding.h), as the ops ``torch.ops.sru_lightning_cuda_emulated.*``.

Inside :func:`emulated_cuda_kernels` the CPU dispatch of ``torch.ops.sru_lightning`` runs
those emulated kernels, so everything above the kernel (the op boundary, autograd, the fake
kernels, tracing) is the production code, and :mod:`~sru_lightning.diagnostics.kernel_parity`
compares them with the CPU kernels and the float64 reference like it compares a GPU.

It catches indexing, layout and math bugs of the GPU source, reads out of bounds (under
AddressSanitizer, ``sanitize=True``) and bad launch configurations. It cannot catch races
between threads, stream or device-memory mistakes, or the GPU's own rounding of fused
multiply-adds: those need ``gpu-check`` on a GPU.

``python -m sru_lightning.diagnostics.cuda_emulation`` runs the comparison in every storage
dtype; ``--kernels-dir`` compiles another copy of the kernels (the tests inject bugs that
way) and ``--sanitize`` builds with AddressSanitizer (run it with libasan preloaded, see
:func:`sanitizer_environment`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import warnings

import torch

from sru_lightning.diagnostics import kernel_parity
from sru_lightning.ops import build

NAMESPACE = build.EMULATION_NAMESPACE


def emulated_ops():
    """``torch.ops.sru_lightning_cuda_emulated`` (built and loaded on first use)."""
    if not build.emulation_loaded():
        build.load_emulation()
    return getattr(torch.ops, NAMESPACE)


@contextlib.contextmanager
def emulated_cuda_kernels():
    """Inside the block, CPU calls of ``torch.ops.sru_lightning`` run the emulated CUDA kernels.

    The registration is undone on exit, and the CPU kernels are back.
    """
    from sru_lightning.ops import op  # noqa: F401  (loads the extension that defines the ops)

    ops = emulated_ops()
    library = torch.library.Library("sru_lightning", "IMPL")
    try:
        with warnings.catch_warnings():
            # The dispatcher warns that the CPU kernel is overridden: that is the point here.
            warnings.simplefilter("ignore")
            library.impl("recurrence_forward", ops.recurrence_forward.default, "CPU")
            library.impl("recurrence_backward", ops.recurrence_backward.default, "CPU")
        yield ops
    finally:
        library._destroy()


def compare_emulated_kernels(dtype_name: str, variants=kernel_parity.VARIANTS) -> kernel_parity.KernelComparison:
    """The emulated CUDA kernels vs the CPU kernels and the float64 reference, one storage dtype."""
    emulated_ops()
    return kernel_parity.compare_kernels(dtype_name, variants, device="cpu", kernels_under_test=emulated_cuda_kernels)


def sanitizer_environment(base: dict | None = None) -> dict:
    """Environment for a Python process that loads the sanitized build: libasan preloaded
    (Python itself is not instrumented) and leak checks off (the interpreter never frees
    everything)."""
    environment = dict(os.environ if base is None else base)
    compiler = os.environ.get("CXX", "c++")
    runtimes = []
    for library in ("libasan.so", "libubsan.so"):
        found = subprocess.run([compiler, f"-print-file-name={library}"], capture_output=True, text=True).stdout.strip()
        if not os.path.isabs(found):
            raise RuntimeError(
                f"{compiler} does not know where {library} is (got {found!r}); install its sanitizer runtime"
            )
        runtimes.append(found)
    environment["LD_PRELOAD"] = " ".join(runtimes + [environment.get("LD_PRELOAD", "")]).strip()
    environment["ASAN_OPTIONS"] = "detect_leaks=0:abort_on_error=1:halt_on_error=1"
    return environment


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sru_lightning.diagnostics.cuda_emulation",
        description="Run the CUDA kernels' source on the CPU and compare it with the CPU kernels and the "
        "float64 reference, every variant. Exit status 0 when all agree, 1 otherwise.",
    )
    parser.add_argument(
        "--kernels-dir",
        help="folder with another copy of sru_cuda_kernels.cu and "
        "sru_cuda_kernels_emulated.cpp (default: the package's csrc/)",
    )
    parser.add_argument("--sanitize", action="store_true", help="build with AddressSanitizer (needs libasan preloaded)")
    parser.add_argument(
        "--dtypes", nargs="+", choices=sorted(kernel_parity.STORAGE_DTYPES), default=list(kernel_parity.STORAGE_DTYPES)
    )
    parser.add_argument("--variants", nargs="+", metavar="NAME", help="only these variants (by name)")
    args = parser.parse_args([] if argv is None else list(argv))
    variants = kernel_parity.VARIANTS
    if args.variants:
        unknown = set(args.variants) - {variant.name for variant in variants}
        if unknown:
            parser.error(f"--variants: unknown {sorted(unknown)}; known: {[v.name for v in variants]}")
        variants = tuple(variant for variant in variants if variant.name in args.variants)
    build.load_emulation(args.kernels_dir, sanitize=args.sanitize)
    failed = False
    for dtype_name in args.dtypes:
        comparison = compare_emulated_kernels(dtype_name, variants)
        status = "PASS" if comparison.passed else "FAIL"
        print(
            f"emulated CUDA kernels {dtype_name}: {status} {comparison.describe()}"
            + ("".join(f"\n  {failure}" for failure in comparison.failures)),
            flush=True,
        )
        failed |= not comparison.passed
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
