"""The private one-node SLURM cluster the tests in tests/cluster/ submit to (helpers/slurm_cluster.py).

Started once per test process (each pytest-xdist worker that runs these files has its own, on
its own ports) and always stopped: by this fixture's teardown, or at interpreter exit.
Skipped with the reason where the SLURM packages are missing or the tests do not run as root.
"""

from __future__ import annotations

import pytest
from helpers.requeue_jobs import TRAINERS, Reference
from helpers.slurm_cluster import SlurmCluster, unavailable


@pytest.fixture(scope="session")
def slurm_cluster():
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    cluster = SlurmCluster()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


# The uninterrupted local runs a test file's requeued jobs are compared with, started in the
# background as the file starts: those of the process counts in its REFERENCE_TASKS (default all).
@pytest.fixture(scope="module")
def references(request, tmp_path_factory):
    root = tmp_path_factory.mktemp("references")
    wanted = getattr(request.module, "REFERENCE_TASKS", tuple(TRAINERS))
    started = {tasks: Reference(root, tasks) for tasks in wanted}
    yield started
    for reference in started.values():
        reference.stop()
