"""The private one-node SLURM cluster the tests in tests/cluster/ submit to (helpers/slurm_cluster.py).

Started once per test process (each pytest-xdist worker that runs these files has its own, on
its own ports) and always stopped: by this fixture's teardown, or at interpreter exit.
Skipped with the reason where the SLURM packages are missing or the tests do not run as root.
"""

from __future__ import annotations

import pytest
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
