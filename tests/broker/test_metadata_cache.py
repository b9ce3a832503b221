"""MetadataCache: what UpdateMetadata installs, stale controller epochs, topic deletion markers,
per-listener endpoints."""

from __future__ import annotations

from tidelog.broker.metadata_cache import (
    LEADER_DURING_DELETE,
    BrokerEndpoint,
    MetadataCache,
    PartitionMetadata,
)
from tidelog.replication.types import TopicPartition


def _pm(topic: str, p: int, leader: int, epoch: int = 0) -> PartitionMetadata:
    return PartitionMetadata(topic, p, 1, leader, epoch, (leader,), 0, (leader,))


def test_update_installs_brokers_and_partitions() -> None:
    cache = MetadataCache(broker_id=1)
    b1 = BrokerEndpoint(1, "h1", 9092, None, (("PLAINTEXT", "h1", 9092), ("EXTERNAL", "x1", 19092)))
    assert cache.update(7, 3, [b1, BrokerEndpoint(2, "h2", 9093)], [_pm("t", 0, 1), _pm("t", 1, 2)])
    assert (cache.controller_id, cache.controller_epoch) == (7, 3)
    assert cache.alive_broker_ids() == [1, 2]
    assert cache.topics() == ["t"] and cache.leader_of(TopicPartition("t", 1)) == 2
    assert cache.has_leaders("t")
    assert b1.for_listener("EXTERNAL") == ("x1", 19092) and b1.for_listener("OTHER") is None
    assert BrokerEndpoint(2, "h2", 9093).for_listener("ANY") == ("h2", 9093)  # v0: one endpoint
    # Broker 2 goes away: its partitions have no live leader any more.
    assert cache.update(7, 3, [b1], [])
    assert not cache.has_leaders("t") and cache.endpoint(2) is not None  # still known, not alive
    assert not cache.is_alive(2)


def test_stale_controller_epoch_is_ignored() -> None:
    cache = MetadataCache(broker_id=1)
    assert cache.update(1, 5, [BrokerEndpoint(1, "h", 1)], [_pm("t", 0, 1)])
    assert not cache.update(2, 4, [], [_pm("t", 0, 9)])
    assert cache.controller_id == 1 and cache.leader_of(TopicPartition("t", 0)) == 1


def test_partitions_of_deleted_topics_are_dropped() -> None:
    cache = MetadataCache(broker_id=1)
    cache.update(1, 1, [BrokerEndpoint(1, "h", 1)], [_pm("d", 0, 1), _pm("d", 1, 1)])
    cache.update(1, 1, [BrokerEndpoint(1, "h", 1)], [_pm("d", 0, LEADER_DURING_DELETE)])
    assert list(cache.topic_partitions("d")) == [1]
    cache.update(1, 1, [BrokerEndpoint(1, "h", 1)], [_pm("d", 1, LEADER_DURING_DELETE)])
    assert not cache.contains_topic("d")


def test_the_latest_endpoint_wins() -> None:
    cache = MetadataCache(broker_id=1)
    cache.update(1, 1, [BrokerEndpoint(2, "h", 1000)], [])
    cache.remember_endpoint(BrokerEndpoint(2, "h", 2000))  # LeaderAndIsr: broker 2 restarted
    assert cache.endpoint(2).port == 2000
    cache.update(1, 1, [BrokerEndpoint(2, "h", 3000)], [])
    assert cache.endpoint(2).port == 3000
