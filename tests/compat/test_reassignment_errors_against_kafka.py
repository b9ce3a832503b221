"""AlterPartitionReassignments and ListPartitionReassignments on raw requests, against Kafka 3.9
(ZooKeeper mode) and tidelog: the refusals (codes and messages) of issue 14 item 5 change
nothing, the controller answers and the other brokers say NOT_CONTROLLER, and a move within the
cluster's three brokers (a replica dropped) completes and is listed while it runs."""

from __future__ import annotations

import time
from typing import Any

import pytest
from differential import Pair, Target, create_ready, raw, topic_shape

from tidelog.protocol.messages import alter_partition_reassignments as m_apr
from tidelog.protocol.messages import list_partition_reassignments as m_lpr

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _addresses(t: Target) -> tuple[str, str]:
    """(the controller's address, another broker's)."""
    md = t.admin().list_topics(timeout=10)
    ctl = md.brokers[md.controller_id]
    other = next(b for i, b in sorted(md.brokers.items()) if i != md.controller_id)
    return f"{ctl.host}:{ctl.port}", f"{other.host}:{other.port}"


def _alter(address: str, targets: dict[tuple[str, int], list[int] | None]) -> Any:
    topics: dict[str, list[Any]] = {}
    for (topic, p), replicas in sorted(targets.items()):
        topics.setdefault(topic, []).append(m_apr.ReassignablePartition(p, replicas))
    r = raw(address, m_apr.AlterPartitionReassignmentsRequest(topics=[
        m_apr.ReassignableTopic(t, ps) for t, ps in topics.items()]), 0)
    return (r.error_code, sorted((t.name, p.partition_index, p.error_code, p.error_message)
                                 for t in r.responses for p in t.partitions))


def _list(address: str) -> Any:
    r = raw(address, m_lpr.ListPartitionReassignmentsRequest(topics=None), 0)
    return r.error_code, sorted((t.name, p.partition_index) for t in r.topics
                                for p in t.partitions)


def test_refusals_and_not_controller_are_kafkas(pair: Pair) -> None:
    def scenario(t: Target) -> object:
        create_ready(t, "reassign-refused", 1, 2)
        before = topic_shape(t, "reassign-refused")
        ctl, other = _addresses(t)
        seen = [
            _alter(ctl, {("reassign-refused", 0): [9]}),
            _alter(ctl, {("reassign-refused", 0): [1, 1]}),
            _alter(ctl, {("reassign-refused", 0): []}),
            _alter(ctl, {("reassign-refused", 0): [1, -1]}),
            _alter(ctl, {("reassign-refused", 5): [1, 2]}),
            _alter(ctl, {("reassign-unknown", 0): [1, 2]}),
            _alter(ctl, {("reassign-refused", 0): None}),
            _alter(other, {("reassign-refused", 0): [1, 2]}),
            _list(other)[0],
            _list(ctl),
        ]
        seen.append(topic_shape(t, "reassign-refused") == before)
        return seen

    got = pair.same(scenario)
    assert got[-1] is True


def test_a_replica_dropped_by_a_reassignment(pair: Pair) -> None:
    def scenario(t: Target) -> object:
        create_ready(t, "reassign-drop", 1, 3)
        ctl, _ = _addresses(t)
        result = _alter(ctl, {("reassign-drop", 0): [2, 3]})
        deadline = time.monotonic() + 60
        while _list(ctl)[1] and time.monotonic() < deadline:
            time.sleep(0.2)
        # the dropped replica leaves the ISR in a last UpdateMetadata (Kafka's may come after
        # the reassignment is no longer listed)
        shape = topic_shape(t, "reassign-drop", isr_size=2)
        return result, _list(ctl), shape

    pair.same(scenario)
