"""The recurrence op alone in float32, bfloat16 and float16 storage at every CPU vector level
(`bench op`'s level table).

The vector level is chosen once per process (``SRU_LIGHTNING_CPU_VECTORS`` caps it), so each
level runs in a process of its own, which times the three storage dtypes interleaved round by
round: the ratios between dtypes are measured inside one process, the only comparison a shared,
noisy machine allows. Run as a module, it times the running level and prints one JSON line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

import torch

from sru_lightning.diagnostics.tables import intra_op_threads, statistic_of

# Storage dtypes of the table, in its column order.
STORAGE_NAMES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
PHASES = ("forward", "backward", "total")


@dataclass
class LevelTimings:
    """What one level's process measured: the level it ran (its cap took effect or not) and, per
    storage dtype, the forward, backward and forward+backward times (ms)."""

    level: str
    ms: dict[str, dict[str, float]]

    def ratio(self, dtype: str, baseline: str, phase: str = "total") -> float:
        return self.ms[dtype][phase] / self.ms[baseline][phase]


def time_storage_dtypes(length: int, batch: int, hidden: int, repeats: int, warmup: int, statistic: str = "min"):
    """Forward, backward and forward+backward of one layer's recurrence (k = 3, skip term from x)
    through the autograd entry point, per storage dtype, interleaved; returns
    {dtype: {phase: ms}}."""
    from sru_lightning.ops import functional
    from sru_lightning.ops.testing import make_case

    cases = {}
    for name, dtype in STORAGE_NAMES.items():
        tensors, kwargs = make_case(length, batch, hidden, dtype=dtype, seed=0)
        leaves = [t.requires_grad_(True) for t in tensors]
        grad_h = torch.randn(length, batch, hidden, generator=torch.Generator().manual_seed(1)).to(dtype)
        cases[name] = (leaves, kwargs, grad_h)
    samples = {name: {phase: [] for phase in PHASES} for name in cases}
    for round_index in range(warmup + repeats):
        for name, (leaves, kwargs, grad_h) in cases.items():
            for leaf in leaves:
                leaf.grad = None
            start = time.perf_counter()
            h, _ = functional.sru_recurrence(*leaves, **kwargs)
            middle = time.perf_counter()
            h.backward(grad_h)
            end = time.perf_counter()
            if round_index >= warmup:
                for phase, seconds in zip(PHASES, (middle - start, end - middle, end - start)):
                    samples[name][phase].append(seconds * 1e3)
    pick = statistic_of(statistic)
    return {name: {phase: pick(times) for phase, times in phases.items()} for name, phases in samples.items()}


def _measure_here(settings: dict) -> LevelTimings:
    from sru_lightning.ops.op import cpu_vector_level

    with intra_op_threads(settings.pop("threads")):
        ms = time_storage_dtypes(**settings)
    return LevelTimings(cpu_vector_level(), ms)


def processor_levels() -> tuple[str, ...]:
    """The vector levels this processor runs, widest first."""
    from sru_lightning.ops import cpu_levels
    from sru_lightning.ops.signature import CPU_VECTOR_LEVELS

    if not cpu_levels.vector_levels_supported():
        return ("baseline",)
    widest = CPU_VECTOR_LEVELS.index(cpu_levels.processor_level())
    return tuple(reversed(CPU_VECTOR_LEVELS[: widest + 1]))


def _ensure_libraries(levels: tuple[str, ...]) -> None:
    """Build one library holding every level when a level has none yet: one build instead of one
    per capped process (`python -m sru_lightning build all_levels=true`, which prints its progress)."""
    from sru_lightning.ops import cpu_levels
    from sru_lightning.ops.build import find_cpu_build

    if all(find_cpu_build(cpu_levels.levels_for(level)) is not None for level in levels):
        return
    subprocess.run([sys.executable, "-m", "sru_lightning", "build", "all_levels=true"], check=False)


def measure_levels(
    levels: tuple[str, ...],
    *,
    length: int,
    batch: int,
    hidden: int,
    threads: int,
    repeats: int,
    warmup: int,
    statistic: str = "min",
) -> tuple[list[LevelTimings], list[str]]:
    """Each level's timings, from a process capped to it (the processor's widest: no cap), and
    notes on the levels that could not be measured."""
    from sru_lightning.ops.cpu_levels import CAP_ENV

    settings = dict(
        length=length, batch=batch, hidden=hidden, threads=threads, repeats=repeats, warmup=warmup, statistic=statistic
    )
    widest = processor_levels()[0]
    _ensure_libraries(levels)
    results, notes = [], []
    for level in levels:
        env = dict(os.environ)
        env.pop(CAP_ENV, None)
        if level != widest:
            env[CAP_ENV] = level
        command = [sys.executable, "-m", "sru_lightning.diagnostics.op_levels", json.dumps(settings)]
        run = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        lines = run.stdout.strip().splitlines()
        if run.returncode != 0 or not lines:
            reason = (run.stderr.strip().splitlines() or ["no output"])[-1]
            notes.append(f"level {level} could not be timed: {reason}")
            continue
        timings = LevelTimings(**json.loads(lines[-1]))
        if timings.level != level:
            notes.append(f"level {level} asked, {timings.level} ran (this processor or library has no {level})")
        results.append(timings)
    return results, notes


LEVEL_COLUMNS = (
    ("level", "<13"),
    ("fp32 ms", ">9"),
    ("bf16 ms", ">9"),
    ("fp16 ms", ">9"),
    ("bf16/fp32", ">11"),
    ("fp16/fp32", ">11"),
    ("bf16/fp16", ">11"),
    ("fwd bf16/fp16", ">15"),
    ("bwd bf16/fp16", ">15"),
)


def level_rows(results: list[LevelTimings]) -> list[tuple[str, ...]]:
    return [
        (
            timings.level,
            *(f"{timings.ms[name]['total']:.3f}" for name in STORAGE_NAMES),
            f"{timings.ratio('bf16', 'fp32'):.3f}",
            f"{timings.ratio('fp16', 'fp32'):.3f}",
            f"{timings.ratio('bf16', 'fp16'):.3f}",
            f"{timings.ratio('bf16', 'fp16', 'forward'):.3f}",
            f"{timings.ratio('bf16', 'fp16', 'backward'):.3f}",
        )
        for timings in results
    ]


if __name__ == "__main__":
    print(json.dumps(asdict(_measure_here(json.loads(sys.argv[1])))))
