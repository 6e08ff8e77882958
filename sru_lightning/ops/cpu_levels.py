"""Which vector levels of the CPU kernels a library holds, and which this processor needs.

The block loops of the CPU kernels are compiled once per vector level, each level its own
translation unit (``csrc/sru_cpu_<level>.cpp``), so a build compiles its levels in parallel
and holds only the levels it was asked for. By default a process builds the level this
processor runs (and, for bfloat16-capable AVX-512, the AVX-512 level its other storage types
use): the first build compiles what this machine runs and nothing else. A process capped
with ``SRU_LIGHTNING_CPU_VECTORS`` needs the capped level and builds it on demand; ``python -m
sru_lightning build all_levels=true`` builds one library holding every level, which any processor
sharing the cache (a cluster with mixed CPUs) then finds without building its own.
"""

from __future__ import annotations

import os
import platform
import sys
from functools import lru_cache

from .signature import CPU_VECTOR_LEVELS

# Caps the level for a process (read by csrc/sru_cpu.cpp as well): baseline | avx2 | avx512.
CAP_ENV = "SRU_LIGHTNING_CPU_VECTORS"
# The processor features each level needs, as Linux's /proc/cpuinfo names them; each level
# also needs the ones before it (the same tests as csrc/sru_cpu.cpp's __builtin_cpu_supports).
LEVEL_FEATURES = {
    "baseline": (),
    "avx2": ("avx2", "fma", "f16c"),
    "avx512": ("avx512f", "avx512vl", "avx512bw"),
    "avx512_bf16": ("avx512_bf16",),
}


def vector_levels_supported() -> bool:
    """True where the kernels have vector levels: x86-64 with GCC or clang (not MSVC)."""
    return platform.machine().lower() in ("x86_64", "amd64") and sys.platform != "win32"


def _cpuinfo_flags() -> set[str] | None:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("flags"):
                    return set(line.partition(":")[2].split())
    except OSError:
        return None
    return None


def level_of_flags(flags: set[str]) -> str:
    """The widest level whose features (and those of the levels before it) are all in `flags`."""
    widest = "baseline"
    for level in CPU_VECTOR_LEVELS[1:]:
        if not set(LEVEL_FEATURES[level]) <= flags:
            break
        widest = level
    return widest


@lru_cache(maxsize=1)
def processor_level() -> str:
    """The widest vector level this processor runs, before any cap."""
    if not vector_levels_supported():
        return "baseline"
    flags = _cpuinfo_flags()
    if flags is not None:
        return level_of_flags(flags)
    # No /proc (macOS): torch's own dispatch level, which does not tell about BF16.
    import torch

    capability = torch.backends.cpu.get_cpu_capability().lower()
    return "avx512" if capability.startswith("avx512") else "avx2" if capability == "avx2" else "baseline"


def capped(level: str, cap: str | None) -> str:
    """`level` capped by a ``SRU_LIGHTNING_CPU_VECTORS`` value (an unknown or the widest name
    leaves it as it is, as the C++ side does)."""
    if cap in CPU_VECTOR_LEVELS[:-1] and CPU_VECTOR_LEVELS.index(cap) < CPU_VECTOR_LEVELS.index(level):
        return cap
    return level


def running_level() -> str:
    """The level this process runs: the processor's, capped by ``SRU_LIGHTNING_CPU_VECTORS``."""
    return capped(processor_level(), os.environ.get(CAP_ENV))


def levels_for(level: str) -> tuple[str, ...]:
    """The levels a library needs to run `level`: the level itself and, for avx512_bf16 (which
    holds bfloat16 code only), the avx512 level its other storage types run."""
    return ("avx512", "avx512_bf16") if level == "avx512_bf16" else (level,)


def needed_levels() -> tuple[str, ...]:
    """The levels this process needs in its CPU library."""
    return levels_for(running_level())


def all_levels() -> tuple[str, ...]:
    """Every level this platform can build (baseline only where there are no vector levels)."""
    return CPU_VECTOR_LEVELS if vector_levels_supported() else CPU_VECTOR_LEVELS[:1]


def covers(built: tuple[str, ...], needed: tuple[str, ...]) -> bool:
    """True when a library built with `built` levels runs a process needing `needed` (a library
    for an avx512_bf16 processor only runs such processes: see :func:`defines`)."""
    if tuple(built) == levels_for("avx512_bf16"):
        return tuple(needed) == tuple(built)
    return set(needed) <= set(built)


def defines(levels: tuple[str, ...]) -> tuple[str, ...]:
    """The compiler flags telling csrc/sru_cpu.cpp which levels the library holds. A library for
    a processor with the AVX-512 BF16 instructions only (no lower level) leaves bfloat16 out of the
    avx512 level, which no such process reaches."""
    flags = tuple(f"-DSRU_CPU_WITH_{level.upper()}" for level in levels)
    if tuple(levels) == levels_for("avx512_bf16"):
        flags += ("-DSRU_CPU_AVX512_WITHOUT_BF16",)
    return flags


def sources(levels: tuple[str, ...]) -> tuple[str, ...]:
    """The level files (in csrc/) of a library holding `levels`."""
    return tuple(f"sru_cpu_{level}.cpp" for level in levels)


# CPU-seconds to compile each file of the CPU library, measured one at a time with GCC 12 -O3 on
# a 2026 AMD EPYC core (other machines differ by about 1.5x either way): the common files, then
# the levels (avx512 with and without its bfloat16 code).
_COMMON_COMPILE_S = {"sru_ops.cpp": 6, "sru_checks.cpp": 6, "sru_workspace.cpp": 5.5, "sru_cpu.cpp": 6}
_LEVEL_COMPILE_S = {"baseline": 22, "avx2": 21, "avx512": 20, "avx512_bf16": 9}
_AVX512_WITHOUT_BF16_S = 15


def expected_seconds(levels: tuple[str, ...], cores: int | None = None) -> int:
    """About how long a build of `levels` takes on `cores` cores (default: this process's), the
    files compiled in parallel: the longest file, or the total shared out, whichever is longer."""
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    costs = [*_COMMON_COMPILE_S.values(), *(_LEVEL_COMPILE_S[level] for level in levels)]
    if "-DSRU_CPU_AVX512_WITHOUT_BF16" in defines(levels):
        costs[len(_COMMON_COMPILE_S) + list(levels).index("avx512")] = _AVX512_WITHOUT_BF16_S
    return int(max(max(costs), sum(costs) / max(1, cores))) + 2  # + linking


def expected_duration(levels: tuple[str, ...]) -> str:
    """The build's duration as the build message quotes it."""
    seconds = expected_seconds(levels)
    if seconds < 90:
        return f"about {5 * round(seconds / 5)} s"
    return f"about {round(seconds / 60)} minutes"
