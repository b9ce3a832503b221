"""A consumer group's life as the admin client describes it, on both clusters: unknown (Dead),
one subscribed member (Stable, its assignment), after it leaves (Empty, offsets kept), listed,
and deleted."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
from differential import Pair, Target, advertised, coordinator, create_ready, outcome, raw

from tidelog.protocol.api_keys import ApiKey
from tidelog.protocol.errors import ErrorCode
from tidelog.protocol.messages.delete_groups import DeleteGroupsRequest

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _describe(t: Target, group: str) -> object:
    admin = t.admin()
    deadline = time.monotonic() + 30
    # Kafka answers NOT_COORDINATOR / COORDINATOR_LOAD_IN_PROGRESS while a coordinator is
    # still loading its offsets partition; a client asks again.
    while (d := outcome(admin.describe_consumer_groups([group])[group])) in (
            "NOT_COORDINATOR", "COORDINATOR_LOAD_IN_PROGRESS") and time.monotonic() < deadline:
        time.sleep(0.3)
    if isinstance(d, str):
        return d
    return (d.state.name, d.is_simple_consumer_group, d.partition_assignor,
            sorted((sorted((tp.topic, tp.partition) for tp in m.assignment.topic_partitions))
                   for m in d.members),
            d.coordinator is not None and d.coordinator.id >= 0)


def test_group_states_from_dead_to_stable_to_empty(pair: Pair) -> None:
    def scenario(t: Target) -> object:
        create_ready(t, "grouped", 2, 3)
        coordinator(t, "g-life")  # the first lookup creates __consumer_offsets: wait for it
        seen: dict[str, object] = {"unknown group": _describe(t, "g-life")}
        c = t.consumer(**{"group.id": "g-life", "auto.offset.reset": "earliest",
                          "partition.assignment.strategy": "range"})
        try:
            c.subscribe(["grouped"])
            deadline = time.monotonic() + 60
            while not c.assignment():
                assert time.monotonic() < deadline, "no assignment in time"
                c.poll(0.2)
            seen["one member"] = _describe(t, "g-life")
            c.commit(offsets=[TopicPartition("grouped", 0, 0), TopicPartition("grouped", 1, 0)],
                     asynchronous=False)
        finally:
            c.close()  # LeaveGroup
        seen["after it left"] = _describe(t, "g-life")
        admin = t.admin()
        listed = outcome(admin.list_consumer_groups())
        seen["listed"] = sorted((g.group_id, g.state.name) for g in listed.valid
                                if g.group_id == "g-life")
        offsets = outcome(admin.list_consumer_group_offsets(
            [ConsumerGroupTopicPartitions("g-life")])["g-life"])
        seen["offsets kept"] = sorted((tp.topic, tp.partition, tp.offset)
                                      for tp in offsets.topic_partitions)
        return seen

    got = pair.same(scenario)
    assert got["after it left"][0] == "EMPTY"


def test_deleting_an_empty_group(pair: Pair) -> None:
    """DeleteGroups (42) of a group with committed offsets and no member: deleted on both.
    (Raw requests: librdkafka 2.16 aborts the process at garbage collection after its
    DeleteGroups met a broker without the API, which tidelog was until issue 14.)"""
    def scenario(t: Target) -> object:
        create_ready(t, "to-forget", 1, 3)
        at = coordinator(t, "g-forget")
        c = t.consumer(**{"group.id": "g-forget"})
        try:
            c.commit(offsets=[TopicPartition("to-forget", 0, 3)], asynchronous=False)
        finally:
            c.close()
        assert advertised(at, ApiKey.DELETE_GROUPS)
        r = raw(at, DeleteGroupsRequest(groups_names=["g-forget"]), 2)
        again = raw(at, DeleteGroupsRequest(groups_names=["g-forget"]), 2)
        return [(g.group_id, ErrorCode(g.error_code).name) for g in (*r.results, *again.results)]

    assert pair.same(scenario) == [("g-forget", "NONE"), ("g-forget", "GROUP_ID_NOT_FOUND")]
