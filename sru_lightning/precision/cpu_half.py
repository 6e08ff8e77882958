"""Whether this CPU computes half-precision matmuls natively, and what one costs here if not.

An x86 CPU multiplies bfloat16 matrices at speed only with AVX512_BF16 or AMX-BF16, and float16
ones only with AVX512_FP16 or AMX-FP16. Without them torch runs the product in a generic loop:
on an AVX2 CPU a 4096x256 by 256x768 bfloat16 matmul took 1.7 s where float32 took 32 ms, and a
fit in ``bf16-mixed`` ran 3x longer than in ``32-true``. :func:`cpu_half_advice` says so, with
a slowdown measured once per process, for the precision report of a half-precision regime on
CPU.

The flags come from ``/proc/cpuinfo`` (Linux on x86). Where they cannot be read (another
system, another architecture) the measurement alone decides.
"""

from __future__ import annotations

import functools
import platform
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

__all__ = ["NATIVE_HALF_FEATURES", "cpu_flags", "cpu_half_advice", "half_matmul_slowdown", "lacks_native_half"]

#: dtype -> the x86 CPU flags (as /proc/cpuinfo spells them) of which one makes its matmul native.
NATIVE_HALF_FEATURES: dict[torch.dtype, tuple[str, ...]] = {
    torch.bfloat16: ("avx512_bf16", "amx_bf16"),
    torch.float16: ("avx512_fp16", "amx_fp16"),
}

#: Where the flags cannot be read, a measured slowdown above this is reported.
UNKNOWN_CPU_SLOWDOWN = 2.0

_X86 = {"x86_64", "amd64", "i386", "i686"}
_CPUINFO = Path("/proc/cpuinfo")


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str] | None:
    """The flags of this x86 CPU (the first ``flags`` line of ``/proc/cpuinfo``, or of the text
    given); None where they cannot be read (not Linux, not x86)."""
    if cpuinfo is None:
        return _this_cpus_flags()
    for line in cpuinfo.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "flags":
            return frozenset(value.split())
    return None


@functools.lru_cache(maxsize=1)
def _this_cpus_flags() -> frozenset[str] | None:
    if platform.machine().lower() not in _X86:
        return None
    try:
        return cpu_flags(_CPUINFO.read_text(errors="replace"))
    except OSError:
        return None


def lacks_native_half(dtype: torch.dtype, flags: Iterable[str] | None) -> bool | None:
    """True when ``flags`` hold none of the features that make a ``dtype`` matmul native; None
    when the flags are unknown or ``dtype`` is not a half dtype."""
    if flags is None or dtype not in NATIVE_HALF_FEATURES:
        return None
    return not set(NATIVE_HALF_FEATURES[dtype]) & set(flags)


@functools.cache
def half_matmul_slowdown(dtype: torch.dtype) -> float:
    """Time of a ``dtype`` matmul over the same float32 one on one core of this CPU (best of a
    few): a few milliseconds, measured once per process."""

    def best(a: torch.Tensor, b: torch.Tensor, repeats: int) -> float:
        torch.matmul(a, b)  # first call: allocation, kernel selection
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            torch.matmul(a, b)
            times.append(time.perf_counter() - start)
        return min(times)

    generator = torch.Generator().manual_seed(0)
    a = torch.randn(64, 256, generator=generator)
    b = torch.randn(256, 256, generator=generator)
    # One thread: the arithmetic of a core, not how busy a shared machine's other cores are.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad(), torch.autocast("cpu", enabled=False):
            full = best(a, b, repeats=7)
            half = best(a.to(dtype), b.to(dtype), repeats=2)
    finally:
        torch.set_num_threads(threads)
    return half / max(full, 1e-9)


def _feature_names(dtype: torch.dtype) -> str:
    return " or ".join(flag.upper().replace("AMX_", "AMX-") for flag in NATIVE_HALF_FEATURES[dtype])


def _times(ratio: float) -> str:
    return f"{ratio:.1f}x" if ratio < 10 else f"{ratio:.0f}x"


_READ_FLAGS = object()


def cpu_half_advice(
    dtype: torch.dtype,
    *,
    flags: Iterable[str] | None | object = _READ_FLAGS,
    slowdown: Callable[[torch.dtype], float] | None = None,
) -> str | None:
    """One line for the precision report of a regime whose matmuls run in ``dtype`` on this
    CPU: that the CPU has no native ``dtype`` arithmetic, how much slower a ``dtype`` matmul is
    than float32 here, and that ``32-true`` trains faster. None when the CPU has one of
    :data:`NATIVE_HALF_FEATURES` (nothing is measured then) or ``dtype`` is not a half dtype.

    ``flags`` (default: :func:`cpu_flags`) and ``slowdown`` (default: measured by
    :func:`half_matmul_slowdown`) stand in for this machine's."""
    if dtype not in NATIVE_HALF_FEATURES:
        return None
    known = cpu_flags() if flags is _READ_FLAGS else flags
    lacking = lacks_native_half(dtype, known)
    if lacking is False:
        return None
    name = str(dtype).replace("torch.", "")
    ratio = (slowdown or half_matmul_slowdown)(dtype)
    if ratio > 1.0:
        measured = f"a {name} matmul measured {_times(ratio)} slower than float32; precision '32-true' trains faster"
    else:
        measured = f"a {name} matmul measured {ratio:.2f}x the time of float32"
    if lacking is None:  # flags unknown: only a measured slowdown speaks
        return f"on this CPU {measured}" if ratio >= UNKNOWN_CPU_SLOWDOWN else None
    return f"no native {name} arithmetic on this CPU (no {_feature_names(dtype)}): {measured}"
