"""Ten SIGUSR1 preemptions of one 2-rank job, each at another moment of training (forward,
backward, optimizer step, validation, checkpoint saving), chosen at random from a seed: every
stop ends, the job is requeued and comes back to its run, and after the tenth it completes with
the uninterrupted run's losses (the jobs and references of tests/helpers/requeue_jobs.py)."""

from __future__ import annotations

import random

import pytest
from helpers.requeue_jobs import MAX_STEPS, Job, assert_losses_equal
from helpers.signal_sender import POINTS

pytestmark = [pytest.mark.slow, pytest.mark.slurm]
REFERENCE_TASKS = (2,)

SEED = 2026
PER_PREEMPTION_S = 60  # a stop, the requeue and a restart of two ranks on a loaded 2-core machine
TRAINING = ("on_train_batch_start", "on_before_backward", "on_before_optimizer_step")


def moments(seed: int) -> list[tuple[str, int]]:
    """Ten moments in the order they fire: seven training-step moments (forward, backward and
    optimizer step, each at least twice, in random order at random steps: 3, 2 and 2 of them) in
    the stretches before the validations at steps 10, 20 and 30 (the run validates every 10
    steps), each stretch closed by a moment in that validation or in the checkpoint saving after
    it. A moment fires at its hook's first call at or after its step, so each fires once, in a
    later attempt than the one before."""
    rng = random.Random(seed)
    kinds = [*TRAINING, *TRAINING, rng.choice(TRAINING)]  # each training moment at least twice
    rng.shuffle(kinds)
    plan: list[tuple[str, int]] = []
    for first, last, count, closing in (
        (1, 8, 3, "on_validation_batch_start"),
        (11, 18, 2, "on_save_checkpoint"),
        (21, 28, 2, "on_validation_batch_start"),
    ):
        plan += [(kinds.pop(), step) for step in sorted(rng.sample(range(first, last + 1), count))]
        plan.append((closing, last + 2))
    assert len(plan) == 10 and {hook for hook, _ in plan} == set(POINTS) and MAX_STEPS == 30
    return plan


def test_ten_sigusr1_preemptions_at_random_moments_all_end_requeue_and_complete_exactly(
    slurm_cluster, references, tmp_path
):
    plan = moments(SEED)
    markers = tmp_path / "moments"
    markers.mkdir()
    job = Job(
        slurm_cluster,
        tmp_path,
        2,
        "+callbacks.moments._target_=pause_for_signal.SignalAtMoments",
        "+callbacks.moments.moments=" + "/".join(f"{hook}@{step}" for hook, step in plan),
        f"+callbacks.moments.marker_dir={markers}",
        "+callbacks.moments.signum=10",
    )
    state = slurm_cluster.wait(job.id, timeout=PER_PREEMPTION_S * (len(plan) + 1))
    assert state == "COMPLETED", f"job {job.id} {state}:\n{job.output[-4000:]}"
    fired = [(markers / f"moment-{index}").read_text().strip() for index in range(len(plan))]
    assert all(fired), fired
    assert job.field("Restarts") == str(len(plan)), job.cluster.job(job.id)
    # both ranks of every attempt were the tasks of one srun step
    assert job.output.count("GLOBAL_RANK: 1, MEMBER: 2/2") == len(plan) + 1, job.output[-3000:]

    *stopped, completed = job.history()
    assert [entry["status"] for entry in stopped] == ["interrupted"] * len(plan), stopped
    assert all("SIGUSR1" in entry["error"] and entry["requeue"] == "asked" for entry in stopped), stopped
    # each attempt continued from the checkpoint of the stop before it, in the job's own run
    steps = [entry["optimizer_steps"] for entry in stopped]
    assert steps == sorted(steps) and steps[-1] <= MAX_STEPS, steps
    resumed_from = [entry.get("ckpt_step") for entry in [*stopped[1:], completed]]
    assert resumed_from == steps, (resumed_from, steps)
    assert completed["status"] == "completed" and completed["optimizer_steps"] == MAX_STEPS
    assert_losses_equal(job, references[2])
    seconds = job.finish()
    print(f"10 preemptions at {fired}: all stopped, requeued and completed in {seconds:.1f} s")
