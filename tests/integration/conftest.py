"""Fixtures of the real-process integration tests: one 3-broker cluster for the session,
every process stopped by PID at the end (even when a test failed)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest
from real_cluster_harness import RealCluster

from tidelog.cluster.local import LocalCluster, _pid_runs


@pytest.fixture(scope="session")
def real_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealCluster]:
    d = tmp_path_factory.mktemp("real-cluster")
    c: RealCluster | None = None
    try:
        c = RealCluster(d)
        yield c
    finally:
        if c is not None:
            c.close()
        if (d / "cluster.json").exists():
            local = LocalCluster.load(d)
            local.down(timeout_s=15)
            for b in local.brokers.values():  # backstop, by PID, only if still that broker
                if _pid_runs(b.pid, b.config):
                    os.kill(b.pid, signal.SIGKILL)  # type: ignore[arg-type]
