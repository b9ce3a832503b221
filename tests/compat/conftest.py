"""The differential suite's two clusters, one each for the whole session: Apache Kafka 3.9 (the
oracle, `tidelog.testing.kafka_cluster`) and tidelog (`tidelog cluster up`'s LocalCluster), both 3
brokers with a private ZooKeeper on 127.0.0.1 and the same settings, every process stopped by PID
at the end (and all of them killed with this process if it dies, even by kill -9)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from differential import Pair, Target
from tidelog_clusters import running_local_cluster

from tidelog.testing.kafka_cluster import KafkaCluster, wait_for_metadata

# Settings both clusters get (LocalCluster already sets offsets.topic.replication.factor=3 and
# group.initial.rebalance.delay.ms=0, as the Kafka launcher does).
SHARED = {"zookeeper.session.timeout.ms": "6000",
          # The cleaner looks for dirty logs every second, not 15: a compacted topic's test
          # (test_kafka_streams.py) sees its changelog cleaned in seconds on both clusters.
          "log.cleaner.backoff.ms": "1000"}


@pytest.fixture(scope="session")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    cluster = KafkaCluster(tmp_path_factory.mktemp("kafka-reference"))
    cluster.up(3, overrides=SHARED)
    try:
        assert cluster.zookeeper is not None
        yield Target("kafka", cluster.bootstrap_servers, cluster.stop_broker,
                     cluster.start_broker, cluster.zookeeper.connect_string)
    finally:
        cluster.down()


@pytest.fixture(scope="session")
def tidelog(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    with running_local_cluster(tmp_path_factory.mktemp("tidelog-cluster"), 3,
                               SHARED) as cluster:

        def start_broker(broker_id: int) -> None:
            cluster.start_broker(broker_id, timeout_s=120)
            wait_for_metadata([b.address for b in cluster.brokers.values()], 3,
                              time.monotonic() + 60)

        def stop_broker(broker_id: int) -> None:
            cluster.stop_broker(broker_id)

        yield Target("tidelog", cluster.bootstrap_servers, stop_broker, start_broker,
                     cluster.zookeeper)


@pytest.fixture
def pair(kafka: Target, tidelog: Target) -> Pair:
    return Pair(kafka, tidelog)
