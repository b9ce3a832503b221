"""The reference cluster launcher: Apache Kafka brokers and their ZooKeeper on 127.0.0.1 that
serve Metadata once `up()` returns and are gone, by PID, once `down()` returns."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tidelog.testing.kafka_cluster import KafkaCluster, wait_for_metadata

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_one_broker_comes_up_on_localhost_and_down_by_pid(tmp_path: Path) -> None:
    cluster = KafkaCluster(tmp_path, heap_mb=256)
    try:
        cluster.up(1)
        (broker,) = cluster.brokers.values()
        assert broker.address.startswith("127.0.0.1:")
        wait_for_metadata([broker.address], 1, time.monotonic() + 5)  # serving, not just started
        assert cluster.zookeeper is not None
        pids = [broker.proc.pid, cluster.zookeeper.pid]  # type: ignore[union-attr]
        assert all(Path(f"/proc/{pid}").exists() for pid in pids)
    finally:
        cluster.down()
    assert not broker.alive() and not cluster.zookeeper.is_running()
    assert "shut down completed" in broker.log_file.read_text()  # SIGTERM: a clean shutdown
