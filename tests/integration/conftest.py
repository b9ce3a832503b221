"""Fixtures of the real-process integration tests: one 3-broker cluster for the session,
every process stopped by PID at the end (even when a test failed)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from real_cluster_harness import RealCluster, running_cluster


@pytest.fixture(scope="session")
def real_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealCluster]:
    d = tmp_path_factory.mktemp("real-cluster")
    with running_cluster(d) as c:
        yield c
