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


def test_topic_names_by_id_take_the_metadata_s_id_and_hosted_ids_it_does_not_name_yet() -> None:
    cache = MetadataCache(broker_id=1)
    first, second, other = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    cache.update(1, 1, [B1], [_pm("t", 0)], {"t": first})
    # A LeaderAndIsr hosts "u" before any UpdateMetadata names it: its id resolves already.
    cache.note_hosted_topic_ids({"t": first, "u": other})
    assert cache.topic_names_by_id() == {first: "t", other: "u"}
    # "t" deleted and created again: the LeaderAndIsr's new id is the hosted one, but until
    # the UpdateMetadata names it the metadata's (old) id is the one that resolves.
    cache.note_hosted_topic_ids({"t": second})
    assert cache.hosted_topic_ids["t"] == second
    assert cache.topic_names_by_id() == {first: "t", other: "u"}
    cache.update(1, 1, [B1], [_pm("t", 0)], {"t": second})
    assert cache.topic_names_by_id() == {second: "t", other: "u"}


def test_a_hosted_topic_id_goes_with_the_topic_s_deletion() -> None:
    cache = MetadataCache(broker_id=1)
    topic_id = uuid.uuid4()
    cache.note_hosted_topic_ids({"t": topic_id, "v": ZERO_UUID})
    assert cache.hosted_topic_ids == {"t": topic_id}
    cache.update(1, 1, [B1], [_pm("t", 0, LEADER_DURING_DELETE)], {})
    assert cache.hosted_topic_ids == {} and cache.topic_names_by_id() == {}


def test_a_replica_fetches_under_its_leader_and_isr_s_topic_id_before_the_metadata_s() -> None:
    cache = MetadataCache(broker_id=1)
    old, new = uuid.uuid4(), uuid.uuid4()
    cache.update(1, 1, [B1], [_pm("t", 0)], {"t": old})
    assert cache.hosted_topic_id("t") == old
    cache.note_hosted_topic_ids({"t": new})
    assert cache.hosted_topic_id("t") == new and cache.topic_id("t") == old
    assert cache.hosted_topic_id("nope") == ZERO_UUID
