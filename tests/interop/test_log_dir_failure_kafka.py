"""The oracle for tidelog's log dir failure handling: Apache Kafka 3.9 (ZooKeeper mode) through
the same scenario as tests/broker/test_log_dir_failure_broker.py (tests/log_dir_failure_scenario.py):
broker 1's log dir holding its replica of partition 0 is a tmpfs that fills up (a real ENOSPC, no
simulation; skipped where mounting is not allowed). The clients see what the scenario asserts."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import log_dir_failure_scenario
import pytest

from tidelog.controller.zk_client import KafkaZkClient
from tidelog.testing.kafka_cluster import KafkaCluster

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]


class TwoDirKafka(KafkaCluster):
    """Each broker with two log dirs, `<broker dir>/d1` and `d2`."""

    def broker_properties(self, broker_id: int, port: int, n_brokers: int,
                          overrides: Mapping[str, str]) -> dict[str, str]:
        props = super().broker_properties(broker_id, port, n_brokers, overrides)
        props["log.dirs"] = ",".join(str(d) for d in self.log_dirs(broker_id))
        return props

    def log_dirs(self, broker_id: int) -> list[Path]:
        return [self.dir / f"kafka-{broker_id}" / d for d in ("d1", "d2")]


def test_kafka_takes_a_full_log_dir_offline_and_moves_its_leaderships(tmp_path: Path) -> None:
    cluster = TwoDirKafka(tmp_path)
    mounted: list[str] = []
    zk: KafkaZkClient | None = None
    try:
        for d in cluster.log_dirs(1):
            refused = log_dir_failure_scenario.mount_tmpfs(str(d))
            if refused is not None:
                pytest.skip(f"mounting a tmpfs is not allowed here: {refused}")
            mounted.append(str(d))
        cluster.up(2, overrides={"auto.leader.rebalance.enable": "false",
                                 "replica.lag.time.max.ms": "2000",
                                 "offsets.topic.replication.factor": "2"})
        assert cluster.zookeeper is not None
        zk = KafkaZkClient(cluster.zookeeper.connect_string).start(
            create_top_level_paths=False)
        outcome = log_dir_failure_scenario.run(
            zk, {b: broker.port for b, broker in cluster.brokers.items()},
            [str(d) for d in cluster.log_dirs(1)], log_dir_failure_scenario.fill)
        assert cluster.brokers[1].alive()  # it runs on with its other dir
        print(f"\nkafka: leaders moved {outcome.leaders_moved_s:.2f} s after the disk filled; "
              f"the records produced meanwhile acknowledged in {outcome.produce_s:.2f} s")
    finally:
        if zk is not None:
            zk.close()
        cluster.down()
        for d in mounted:
            log_dir_failure_scenario.unmount(d)
