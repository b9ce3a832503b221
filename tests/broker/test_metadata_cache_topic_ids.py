"""MetadataCache keeps each topic's id (KIP-516) as UpdateMetadata v7 carries it: a zero id is
no id, the id goes with the topic's deletion, and a recreated topic's new id replaces it."""

from __future__ import annotations

import uuid

from tidelog.broker.metadata_cache import (
    LEADER_DURING_DELETE,
    BrokerEndpoint,
    MetadataCache,
    PartitionMetadata,
)
from tidelog.protocol.primitives import ZERO_UUID

B1 = BrokerEndpoint(1, "h", 9092)


def _pm(topic: str, p: int, leader: int = 1) -> PartitionMetadata:
    return PartitionMetadata(topic, p, 1, leader, 0, (1,), 0, (1,))


def test_a_topic_id_is_kept_until_the_topic_is_deleted_and_replaced_when_it_is_recreated() -> None:
    cache = MetadataCache(broker_id=1)
    first, second = uuid.uuid4(), uuid.uuid4()
    assert cache.update(1, 1, [B1], [_pm("t", 0), _pm("t", 1)], {"t": first})
    assert cache.topic_id("t") == first
    assert cache.update(1, 1, [B1], [_pm("t", 0)], {"t": ZERO_UUID})  # v0-6: no id on the wire
    assert cache.topic_id("t") == first
    cache.update(1, 1, [B1], [_pm("t", 0, LEADER_DURING_DELETE), _pm("t", 1, LEADER_DURING_DELETE)],
                 {"t": first})
    assert not cache.contains_topic("t") and cache.topic_id("t") == ZERO_UUID
    cache.update(1, 1, [B1], [_pm("t", 0)], {"t": second})
    assert cache.topic_id("t") == second


def test_an_unknown_topic_has_the_zero_id() -> None:
    assert MetadataCache(broker_id=1).topic_id("nope") == ZERO_UUID
