"""Fetch sessions by topic id (KIP-516 in KIP-227 sessions) and KIP-951's leader hint, as Kafka
answers them at the wire: a session opened by Fetch v13+ refuses a v12 fetch and the reverse
(FETCH_SESSION_TOPIC_ID_ERROR), an unknown topic id stays in the session (UNKNOWN_TOPIC_ID at
every fetch), a topic deleted and created again under the same name while a session names its
old id (UNKNOWN_TOPIC_OR_PARTITION, then INCONSISTENT_TOPIC_ID), and Fetch v16+ naming the
leader and its endpoint on NOT_LEADER_OR_FOLLOWER."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

import pytest
from differential import (
    Pair,
    Target,
    address_of,
    create_ready,
    create_topic,
    leader_address,
    outcome,
    partition_metadata,
    raw,
    topic_id_of,
    topic_shape,
    until,
)

from tidelog.protocol.errors import ErrorCode
from tidelog.protocol.messages import fetch as m_fetch
from tidelog.protocol.primitives import ZERO_UUID

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _fetch(address: str, version: int, session_id: int, epoch: int,
           topics: Sequence[tuple[str, uuid.UUID, int]] = (),
           forget: Sequence[tuple[str, uuid.UUID, int]] = (),
           replica_id: int = -1) -> Any:
    """A fetch of (topic, topic id, partition)s at offset 0, in session ``session_id``."""
    request = m_fetch.FetchRequest(
        replica_id=replica_id if version < 15 else -1,
        replica_state=m_fetch.ReplicaState(replica_id, -1) if version >= 15 else None,
        max_wait_ms=0, min_bytes=0, max_bytes=1 << 20,
        session_id=session_id, session_epoch=epoch,
        topics=[m_fetch.FetchTopic(topic=name, topic_id=topic_id, partitions=[
            m_fetch.FetchPartition(partition=p, fetch_offset=0, partition_max_bytes=1 << 20)])
            for name, topic_id, p in topics],
        forgotten_topics_data=[m_fetch.ForgottenTopic(topic=name, topic_id=topic_id,
                                                      partitions=[p])
                               for name, topic_id, p in forget])
    return raw(address, request, version)


def _seen(r: Any, ids: dict[uuid.UUID, str]) -> object:
    """A response as comparable values: (top-level error, a session opened?, [(topic as the
    test names it, partition, error)])."""
    return (ErrorCode(r.error_code).name, r.session_id != 0,
            [(ids.get(t.topic_id, t.topic or "an unknown id"), p.partition_index,
              ErrorCode(p.error_code).name) for t in r.responses for p in t.partitions])


def test_a_session_opened_by_id_refuses_a_fetch_by_name_and_the_reverse(pair: Pair) -> None:
    topic = "session-versions"

    def scenario(t: Target) -> object:
        create_ready(t, topic, 1, 1)
        address = leader_address(t, topic)
        topic_id = topic_id_of(address, topic)
        ids = {topic_id: "t"}
        seen = []
        for opened, then in ((13, 12), (12, 13), (17, 12)):
            full = _fetch(address, opened, 0, 0, [(topic, topic_id, 0)])
            mixed = _fetch(address, then, full.session_id, 1)
            # The refused fetch did not move the session on: epoch 1 at its own version works.
            same = _fetch(address, opened, full.session_id, 1)
            seen.append((opened, then, _seen(full, ids), _seen(mixed, ids), _seen(same, ids)))
        return seen

    seen = pair.same(scenario)
    assert all(mixed[0] == "FETCH_SESSION_TOPIC_ID_ERROR" for *_, mixed, _ in seen)


def test_an_unknown_topic_id_stays_in_the_session(pair: Pair) -> None:
    topic = "session-unknown-id"

    def scenario(t: Target) -> object:
        create_ready(t, topic, 1, 1)
        address = leader_address(t, topic)
        topic_id, unknown = topic_id_of(address, topic), uuid.uuid4()
        ids = {topic_id: "t", unknown: "unknown"}
        full = _fetch(address, 17, 0, 0, [(topic, topic_id, 0), ("", unknown, 0)])
        seen = [_seen(full, ids)]
        for epoch in (1, 2):  # nothing listed: the unknown id is answered again each time
            seen.append(_seen(_fetch(address, 17, full.session_id, epoch), ids))
        # Forgotten, it goes; the session holds the known partition only.
        seen.append(_seen(_fetch(address, 17, full.session_id, 3,
                                 forget=[("", unknown, 0)]), ids))
        return seen

    assert pair.same(scenario)[1] == ("NONE", True, [("unknown", 0, "UNKNOWN_TOPIC_ID")])


def test_a_topic_created_again_during_a_session(pair: Pair) -> None:
    """The session was opened on the old topic's id. Deleted, the partition is unknown;
    created again under the same name (a new id, on every broker again), the old id is
    INCONSISTENT_TOPIC_ID until the session swaps it for the new one."""
    topic = "session-recreated"

    def scenario(t: Target) -> object:
        create_ready(t, topic, 1, 3)
        address = leader_address(t, topic)
        old = topic_id_of(address, topic)
        full = _fetch(address, 17, 0, 0, [(topic, old, 0)])
        sid, seen = full.session_id, [("open", _seen(full, {old: "old"}))]
        admin = t.admin()
        assert outcome(admin.delete_topics([topic], operation_timeout=30)[topic]) is None
        until(lambda: topic_shape(t, topic, timeout_s=0) == "UNKNOWN_TOPIC_OR_PART",
               "the topic deleted")
        # Every broker (this one too) has dropped it: the old id's partition is unknown.
        until(lambda: topic_id_of(address, topic) == ZERO_UUID, "the broker dropped the topic")
        seen.append(("deleted", _seen(_fetch(address, 17, sid, 1), {old: "old"})))
        deadline = time.monotonic() + 30
        while (created := create_topic(t, topic, 1, 3)) == "TOPIC_ALREADY_EXISTS":
            assert time.monotonic() < deadline, "the topic could not be created again in time"
            time.sleep(0.2)
        assert created is None, created
        assert isinstance(topic_shape(t, topic), tuple)
        until(lambda: topic_id_of(address, topic) not in (old, ZERO_UUID),
               "the broker knows the new topic")
        new = topic_id_of(address, topic)
        until(lambda: _fetch(address, 17, 0, -1, [(topic, new, 0)]).responses[0]
               .partitions[0].error_code == 0, "the new topic readable at the session's broker")
        ids = {old: "old", new: "new"}
        seen.append(("created again", _seen(_fetch(address, 17, sid, 2), ids)))
        # The fetcher swaps the ids (Kafka's FetchSessionHandler: forget the old, add the new).
        seen.append(("swapped", _seen(_fetch(address, 17, sid, 3, [(topic, new, 0)],
                                             forget=[(topic, old, 0)]), ids)))
        seen.append(("after", _seen(_fetch(address, 17, sid, 4), ids)))
        return seen

    seen = dict(pair.same(scenario))
    assert seen["created again"] == ("NONE", True, [("old", 0, "INCONSISTENT_TOPIC_ID")])


def test_fetch_v16_names_the_leader_on_not_leader_or_follower(pair: Pair) -> None:
    """A replica's fetch at a follower, and a consumer's at a broker without the partition:
    NOT_LEADER_OR_FOLLOWER with the current leader (KIP-951) from v16, and that leader's
    endpoint in the response's NodeEndpoints; nothing of it before v16."""
    topic, lone = "leader-hint", "leader-hint-rf1"

    def scenario(t: Target) -> object:
        create_ready(t, topic, 1, 3)
        create_ready(t, lone, 1, 1)
        seen = []
        for name, rf in ((topic, 3), (lone, 1)):
            p, brokers = partition_metadata(t, name)
            addresses = {i: address_of(brokers, i) for i in brokers}
            other = next(i for i in sorted(addresses) if i != p.leader
                         and (rf == 1 or i in p.replicas))
            address = addresses[other]
            topic_id = topic_id_of(address, name)
            # At the follower a replica fetch (as broker `other`'s peer); at a broker without
            # the partition, a consumer's.
            replica_id = next(i for i in p.replicas if i not in (p.leader, other)) \
                if rf == 3 else -1
            for version in (15, 16, 17):
                r = _fetch(address, version, 0, -1, [(name, topic_id, 0)], replica_id=replica_id)
                part = r.responses[0].partitions[0]
                leader = part.current_leader
                seen.append((name, version, ErrorCode(part.error_code).name,
                             None if leader is None or leader.leader_id == -1 else (
                                 leader.leader_id == p.leader, leader.leader_epoch),
                             [(e.node_id == p.leader, f"{e.host}:{e.port}" == addresses[p.leader])
                              for e in r.node_endpoints]))
        return seen

    seen = pair.same(scenario)
    assert ("leader-hint", 16, "NOT_LEADER_OR_FOLLOWER", (True, 0), [(True, True)]) in seen
