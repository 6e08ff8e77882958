"""SIGUSR1 at different moments of a 2-rank step: every stop ends, requeues and completes with the
uninterrupted run's losses (the jobs and references of tests/helpers/requeue_jobs.py)."""

from __future__ import annotations

import os

import pytest
from helpers.requeue_jobs import Job, assert_continued_exactly

pytestmark = [pytest.mark.slow, pytest.mark.slurm]


# --------------------------------------------------------------------------------------------
# 5. SIGUSR1 at different moments of a 2-rank step: every stop ends, requeues and completes.
#    Each moment costs a requeue (~50 s on a 2-core machine): by default the two that take
#    different ways out, a stop agreed in the middle of a training step and one agreed during a
#    fit's validation (which finishes first); SRU_PREEMPTION_ALL_MOMENTS=1 adds the optimizer step
#    and the checkpoint save (all four passed when this was written).
MOMENTS = [("on_before_backward", 4), ("on_validation_batch_start", 10)]
if os.environ.get("SRU_PREEMPTION_ALL_MOMENTS") == "1":
    MOMENTS += [("on_before_optimizer_step", 7), ("on_save_checkpoint", 10)]


@pytest.mark.parametrize("hook, at_step", MOMENTS)
def test_sigusr1_at_any_moment_never_hangs(slurm_cluster, references, tmp_path, hook, at_step):
    prefix = "+callbacks.signal_once"
    job = Job(
        slurm_cluster,
        tmp_path,
        2,
        f"{prefix}._target_=pause_for_signal.SignalOnce",
        f"{prefix}.marker={tmp_path / 'signalled'}",
        f"{prefix}.hook={hook}",
        f"{prefix}.target=group",
        f"{prefix}.signum=10",
        f"{prefix}.at_step={at_step}",
    )
    seconds = job.finish()
    assert (tmp_path / "signalled").exists(), job.output[-3000:]
    assert_continued_exactly(job, references[2], "SIGUSR1", requeue_asked=True)
    print(f"{hook}: stopped, requeued and completed in {seconds:.1f} s")
