"""Benchmark of packed documents: what the op's document boundaries (``reset``) cost.

``python -m sru_lightning bench --documents [--length 128 --batch 32 --hidden 256]`` times the
recurrence op alone (one layer, forward+backward, float32, k = 3) without flags (``reset=None``),
with flags that mark no boundary (all False) and with a document start every 32 steps, timed
interleaved in one process, and prints each time with its ratio to the call without flags.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from sru_lightning.diagnostics.tables import fixed_width_lines, intra_op_threads, statistic_of

CASES = ("no flags (reset=None)", "flags, no boundary", "a document every 32 steps")


@dataclass
class DocumentsBenchConfig:
    length: int = 128
    batch: int = 32
    hidden: int = 256
    threads: int = 2
    repeats: int = 15
    warmup: int = 3
    statistic: str = "min"


def measure_reset_overhead(config: DocumentsBenchConfig) -> dict[str, float]:
    """Best (or median) milliseconds of one forward+backward of the op for each of :data:`CASES`."""
    from sru_lightning.ops import functional
    from sru_lightning.ops.testing import make_case

    (U, x, weight_c, bias, c0), kwargs = make_case(config.length, config.batch, config.hidden, dtype=torch.float32)
    leaves = [t.requires_grad_(True) for t in (U, x, weight_c, bias, c0)]
    grad_h = torch.randn(config.length, config.batch, config.hidden)
    every_32 = torch.zeros(config.length, config.batch, dtype=torch.bool)
    every_32[::32] = True
    flags = {
        CASES[0]: None,
        CASES[1]: torch.zeros(config.length, config.batch, dtype=torch.bool),
        CASES[2]: every_32,
    }

    def step(reset):
        for leaf in leaves:
            leaf.grad = None
        h, _ = functional.sru_recurrence(*leaves, reset=reset, **kwargs)
        h.backward(grad_h)

    samples: dict[str, list[float]] = {name: [] for name in CASES}
    with intra_op_threads(config.threads):
        for name in CASES:
            for _ in range(config.warmup):
                step(flags[name])
        for _ in range(config.repeats):
            for name in CASES:
                start = time.perf_counter()
                step(flags[name])
                samples[name].append((time.perf_counter() - start) * 1e3)
    pick = statistic_of(config.statistic)
    return {name: pick(times) for name, times in samples.items()}


def format_table(config: DocumentsBenchConfig, times: dict[str, float]) -> str:
    base = times[CASES[0]]
    rows = [(name, f"{times[name]:.3f}", f"{times[name] / base:.3f}") for name in CASES]
    title = (
        f"recurrence op, forward+backward, float32, L={config.length} B={config.batch} D={config.hidden}, "
        f"{config.threads} threads ({config.statistic} of {config.repeats})"
    )
    columns = (("reset", "<28"), ("ms", ">10"), ("ratio to no flags", ">20"))
    return "\n".join([title, *fixed_width_lines(columns, rows)])
