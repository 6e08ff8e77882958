"""What the benchmarks (`bench op`, `bench decode`, `bench export`, ...) share: the settings they
have in common, the thread count they time under, the statistic they keep of repeated timings,
and their fixed-width tables."""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable, Iterable, Sequence

import torch

from sru_lightning.app.key_value import setting

# `statistic` -> the word the table header uses for it.
STATISTIC_NAMES = {"min": "best", "median": "median"}


# The settings the benchmarks share, declared once (each benchmark's config gives its default,
# and its own help where the setting means something narrower there).
def threads_setting(default: int, help: str = "intra-op threads (torch.set_num_threads)"):
    return setting(default, help, at_least=1)


def repeats_setting(default: int, help: str = "timed rounds"):
    return setting(default, help, at_least=1)


def warmup_setting(default: int, help: str = "untimed rounds before them"):
    return setting(default, help, at_least=0)


def statistic_setting(default: str):
    return setting(default, "best (min) or median of the repeats", choices=tuple(STATISTIC_NAMES))


def count_setting(default: int, help: str):
    """A setting that counts something, at least 1 (a size, a length, tokens)."""
    return setting(default, help, at_least=1)


@contextlib.contextmanager
def intra_op_threads(count: int):
    """Run the block with `count` intra-op threads, then restore the previous count."""
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def statistic_of(name: str) -> Callable[[Sequence[float]], float]:
    """The function that reduces repeated timings: `min` (best of N) or `median`."""
    return min if name == "min" else statistics.median


def fixed_width_lines(columns: Sequence[tuple[str, str]], rows: Iterable[Sequence[str]]) -> list[str]:
    """A header line and one line per row; each column is (title, format spec of its width and
    alignment, e.g. "<22" or ">9"), and the cells are already written as text."""
    header = "".join(f"{title:{spec}}" for title, spec in columns)
    return [header, *("".join(f"{cell:{spec}}" for (_, spec), cell in zip(columns, row)) for row in rows)]
