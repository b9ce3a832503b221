"""Fixtures of the real-process integration tests: one 3-broker cluster for the session,
every process stopped by PID at the end (even when a test failed)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from real_cluster_harness import RealCluster, running_cluster


@pytest.fixture(scope="session")
def _real_cluster_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealCluster]:
    d = tmp_path_factory.mktemp("real-cluster")
    with running_cluster(d) as c:
        yield c


@pytest.fixture
def real_cluster(_real_cluster_session: RealCluster) -> Iterator[RealCluster]:
    """The session's cluster with all three brokers running when the test starts: a test that
    failed with a broker stopped does not fail the tests after it."""
    _real_cluster_session.restart_stopped_brokers()
    yield _real_cluster_session
