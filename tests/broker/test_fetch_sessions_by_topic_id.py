"""The fetch handler's sessions by topic id (Fetch v13+, Kafka's FetchSession with topic ids)
and KIP-951's leader hint, against a real broker: a v12/v13 mix in one session, an unknown id
kept in the session, a topic whose id changed under the same name (deleted and created again)
answered INCONSISTENT_TOPIC_ID for the old id, and Fetch v16+ naming the current leader and its
endpoint on FENCED_LEADER_EPOCH."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from harness import ActingController, BrokerThread, produce, send

from tidelog.protocol.errors import ErrorCode
from tidelog.protocol.messages import fetch as m_fetch
from tidelog.protocol.records.builder import build_values


def fetch(broker: BrokerThread, version: int, session_id: int, epoch: int,
          topics: Sequence[tuple[str, uuid.UUID, int]] = (),
          forget: Sequence[tuple[str, uuid.UUID, int]] = (),
          current_leader_epoch: int = -1) -> Any:
    """A consumer's fetch of (topic, topic id, partition)s at offset 0."""
    return send(broker.port, m_fetch.FetchRequest(
        max_wait_ms=0, min_bytes=0, max_bytes=1 << 20, session_id=session_id,
        session_epoch=epoch,
        topics=[m_fetch.FetchTopic(topic=name, topic_id=topic_id, partitions=[
            m_fetch.FetchPartition(partition=p, fetch_offset=0, partition_max_bytes=1 << 20,
                                   current_leader_epoch=current_leader_epoch)])
            for name, topic_id, p in topics],
        forgotten_topics_data=[m_fetch.ForgottenTopic(topic=name, topic_id=topic_id,
                                                      partitions=[p])
                               for name, topic_id, p in forget]), version)


def answered(r: Any) -> list[tuple[Any, int, int]]:
    return [(t.topic_id if t.topic_id != uuid.UUID(int=0) else t.topic, p.partition_index,
             p.error_code) for t in r.responses for p in t.partitions]


def test_a_session_by_id_refuses_a_fetch_by_name_and_the_reverse(
        one_broker: BrokerThread, controller: ActingController) -> None:
    controller.create_topic("ids-mix", {0: [1]})
    topic_id = controller.topic_ids["ids-mix"]
    by_id = fetch(one_broker, 13, 0, 0, [("ids-mix", topic_id, 0)])
    assert by_id.error_code == 0 and by_id.session_id != 0
    mixed = fetch(one_broker, 12, by_id.session_id, 1)
    assert (mixed.error_code, mixed.session_id, mixed.responses) == (
        ErrorCode.FETCH_SESSION_TOPIC_ID_ERROR, 0, [])
    assert fetch(one_broker, 13, by_id.session_id, 1).error_code == 0
    by_name = fetch(one_broker, 12, 0, 0, [("ids-mix", topic_id, 0)])
    assert fetch(one_broker, 17, by_name.session_id, 1).error_code == \
        ErrorCode.FETCH_SESSION_TOPIC_ID_ERROR


def test_an_unknown_topic_id_is_answered_at_every_fetch_of_the_session(
        one_broker: BrokerThread, controller: ActingController) -> None:
    controller.create_topic("ids-unknown", {0: [1]})
    topic_id, unknown = controller.topic_ids["ids-unknown"], uuid.uuid4()
    full = fetch(one_broker, 17, 0, 0, [("ids-unknown", topic_id, 0), ("", unknown, 0)])
    assert full.session_id != 0
    assert answered(full) == [(topic_id, 0, 0), (unknown, 0, ErrorCode.UNKNOWN_TOPIC_ID)]
    for epoch in (1, 2):
        assert answered(fetch(one_broker, 17, full.session_id, epoch)) == [
            (unknown, 0, ErrorCode.UNKNOWN_TOPIC_ID)]


def test_the_old_id_of_a_topic_created_again_is_inconsistent(
        one_broker: BrokerThread, controller: ActingController) -> None:
    topic = "ids-recreated"
    controller.create_topic(topic, {0: [1]})
    assert produce(one_broker.port, topic, 0, build_values([b"a"]), acks=1) == (0, 0)
    old = controller.topic_ids[topic]
    full = fetch(one_broker, 17, 0, 0, [(topic, old, 0)])
    assert answered(full) == [(old, 0, 0)]
    # The topic is now another one under the same name: the controller names a new id.
    new = controller.topic_ids[topic] = uuid.uuid4()
    controller.send_leader_and_isr(topic, [0])
    controller.send_update_metadata()
    assert answered(fetch(one_broker, 17, full.session_id, 1)) == [
        (old, 0, ErrorCode.INCONSISTENT_TOPIC_ID)]
    # A fresh fetch naming the old id: no such topic any more.
    assert answered(fetch(one_broker, 17, 0, -1, [(topic, old, 0)])) == [
        (old, 0, ErrorCode.UNKNOWN_TOPIC_ID)]
    # The session swaps the ids (as Kafka's FetchSessionHandler does): the new one reads.
    swapped = fetch(one_broker, 17, full.session_id, 2, [(topic, new, 0)], [(topic, old, 0)])
    assert answered(swapped) == [(new, 0, 0)] and swapped.responses[0].partitions[0].records


def test_fetch_v16_names_the_current_leader_and_its_endpoint(
        one_broker: BrokerThread, controller: ActingController) -> None:
    topic = "leader-hint"
    controller.create_topic(topic, {0: [1]})
    controller.change_leader(topic, 0, 1, [1])  # leader epoch 1
    topic_id = controller.topic_ids[topic]
    for version in (15, 16, 17):
        r = fetch(one_broker, version, 0, -1, [(topic, topic_id, 0)], current_leader_epoch=0)
        part = r.responses[0].partitions[0]
        assert part.error_code == ErrorCode.FENCED_LEADER_EPOCH
        if version < 16:
            assert part.current_leader is None and r.node_endpoints == []
        else:
            assert (part.current_leader.leader_id, part.current_leader.leader_epoch) == (1, 1)
            assert [(e.node_id, e.host, e.port) for e in r.node_endpoints] == [
                (1, "127.0.0.1", one_broker.port)]
