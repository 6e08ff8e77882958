"""CPU threads per process, chosen the same way under every launcher.

Float sums split over a different number of threads round differently, so a run's losses
depend on its thread count. Lightning's own launcher gives each of its processes
`cores // processes` threads unless `OMP_NUM_THREADS` is set; `torchrun` sets
`OMP_NUM_THREADS=1` when it starts several processes per machine and nothing otherwise, and
`srun` sets nothing. The `threads` setting makes that one rule for all of them.
"""

from __future__ import annotations

import os

import torch

__all__ = ["set_thread_count", "thread_setting_problem"]


def thread_setting_problem(setting) -> str | None:
    """What is wrong with a `threads` value, or None when it is a positive integer or null."""
    if setting is None or (isinstance(setting, int) and not isinstance(setting, bool) and setting >= 1):
        return None
    return f"`threads` must be a positive integer or null, got {setting!r}"


def set_thread_count(setting, processes_per_machine: int) -> int | None:
    """Apply `threads` (a positive integer, or null) and return the count set, or None if untouched.

    null: `OMP_NUM_THREADS` when it is set, else the machine's cores shared among its
    processes when there are several (Lightning's rule); one process keeps torch's default.
    The count is also exported as `OMP_NUM_THREADS`, so processes launched from this one
    (Lightning's other ranks) and libraries that read it agree.
    """
    problem = thread_setting_problem(setting)
    if problem:
        raise ValueError(problem)
    if setting is None:
        from_environment = os.environ.get("OMP_NUM_THREADS", "").strip()
        if from_environment.isdigit() and int(from_environment) > 0:
            setting = int(from_environment)
        elif processes_per_machine > 1:
            setting = max(1, (os.cpu_count() or 1) // processes_per_machine)
        else:
            return None
    torch.set_num_threads(setting)
    os.environ["OMP_NUM_THREADS"] = str(setting)
    return setting
