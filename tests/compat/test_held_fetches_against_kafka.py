"""A held (delayed) Fetch, raw at the wire, answered at the event that settles it, as Kafka 3.9's
DelayedFetch.tryComplete does: the partition's topic deleted (StopReplica, its case C), this
broker no longer its leader (LeaderAndIsr after a preferred election, case A). Each fetch waits up
to 30 s for one byte of an empty partition; the answer must come at the event with Kafka's error,
sessionless and in an incremental fetch session (KIP-227) alike. A consumer's Fetch v11+ without
an epoch may read a follower (KIP-392): the leader moving does not answer it, on either cluster.
The leader epoch moving past the fetch's while the leader stays (case E) is fenced by both, at
once by tidelog only (a documented difference). And a fetch session holding a partition answered
without a read (missing from the metadata, an unknown topic id) is held for max_wait_ms, one
holding a partition led elsewhere answered at once, as Kafka's KafkaApis splits them."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import ElectionType, TopicPartition
from differential import (
    Pair,
    Target,
    create_ready,
    leader_address,
    outcome,
    partition_metadata,
    raw,
    reassign,
    topic_id_of,
    until,
)

from tidelog.client.connection import BrokerConnection
from tidelog.protocol.errors import ErrorCode
from tidelog.protocol.messages import fetch as m_fetch
from tidelog.protocol.messages.metadata import MetadataRequest, MetadataRequestTopic
from tidelog.protocol.primitives import ZERO_UUID

pytestmark = [pytest.mark.integration, pytest.mark.slow]

HELD_MS = 30_000
# Answered "at the event": at least this long before the fetch's wait would end (a loaded
# machine's controller may take seconds to send its requests).
MARGIN_S = 5.0


def _send(address: str, request: Any, version: int) -> Any:
    """``raw`` with a request timeout longer than the fetch's wait."""
    return raw(address, request, version, request_timeout_ms=HELD_MS + 30_000)


def _send_noting_the_port(address: str, request: Any, version: int,
                          written: Callable[[int], None]) -> Any:
    """``_send``, calling ``written(local port)`` once the request is handed to the socket."""
    async def go() -> Any:
        host, port = address.rsplit(":", 1)
        conn = BrokerConnection(host, int(port), request_timeout_ms=HELD_MS + 30_000)
        await conn.connect(timeout_s=10)
        try:
            sending = asyncio.ensure_future(conn.send(request, version))
            await asyncio.sleep(0)  # the send writes the request before its first wait
            assert conn._transport is not None
            written(conn._transport.get_extra_info("sockname")[1])
            return await sending
        finally:
            await conn.close()

    return asyncio.run(go())


def _tcp_queues() -> dict[tuple[int, int], tuple[int, int]]:
    """Every IPv4 TCP socket here: (local port, remote port) -> (send queue, receive queue)
    (/proc/net/tcp: bytes not yet acknowledged by the peer, not yet read by the owner)."""
    queues = {}
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote, tx_rx = fields[1], fields[2], fields[4]
        tx, rx = (int(q, 16) for q in tx_rx.split(":"))
        queues[int(local.split(":")[1], 16), int(remote.split(":")[1], 16)] = (tx, rx)
    return queues


def _read_by_the_broker(broker_port: int, client_port: int) -> bool:
    """The request on that connection reached the broker, and the broker read it off its
    socket: nothing unacknowledged on the client's side, nothing unread on the broker's."""
    queues = _tcp_queues()
    client, server = (client_port, broker_port), (broker_port, client_port)
    return client in queues and server in queues \
        and queues[client][0] == 0 and queues[server][1] == 0


def _fetch_request(topic: str, epoch: int, max_wait_ms: int, session_id: int = 0,
                   session_epoch: int = -1, listed: bool = True) -> m_fetch.FetchRequest:
    return m_fetch.FetchRequest(
        max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=1 << 20,
        session_id=session_id, session_epoch=session_epoch,
        topics=[m_fetch.FetchTopic(topic, partitions=[m_fetch.FetchPartition(
            0, current_leader_epoch=epoch, fetch_offset=0, partition_max_bytes=1 << 20)])]
        if listed else [])


def _leader_epoch(address: str, topic: str) -> int:
    r = raw(address, MetadataRequest(topics=[MetadataRequestTopic(name=topic)],
                                     allow_auto_topic_creation=False), 9)
    return int(r.topics[0].partitions[0].leader_epoch)


# Held at once by one HeldFetches (each in its own thread: with fewer threads than fetches,
# the last ones were sent only once an earlier one was answered, after the event).
_MOST_HELD = 8


class HeldFetches:
    """Fetches sent to one broker and held there, each timed from an event."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.pool = ThreadPoolExecutor(max_workers=_MOST_HELD)  # a thread per held fetch
        self.held: dict[str, Future[Any]] = {}
        self._lock = threading.Lock()
        self._sent_from: list[int] = []  # the local ports of the held fetches, once sent

    def hold(self, label: str, topic: str, epoch: int, version: int = 12,
             session: bool = False, max_wait_ms: int = HELD_MS) -> None:
        """A sessionless fetch, or (``session``) an incremental one listing nothing in a
        session opened just before by a full fetch of the partition."""
        if session:
            opened = _send(self.address, _fetch_request(topic, epoch, 0, 0, 0), version)
            assert opened.error_code == 0 and opened.session_id != 0, opened
            request = _fetch_request(topic, epoch, max_wait_ms, opened.session_id, 1,
                                     listed=False)
        else:
            request = _fetch_request(topic, epoch, max_wait_ms)

        def written(port: int) -> None:
            with self._lock:
                self._sent_from.append(port)

        def timed() -> Any:
            sent = time.monotonic()
            r = _send_noting_the_port(self.address, request, version, written)
            return r, time.monotonic() < sent + max_wait_ms / 1000 - MARGIN_S

        assert len(self.held) < _MOST_HELD, "one more would wait for a thread, not be held"
        self.held[label] = self.pool.submit(timed)

    def event(self, action: Callable[[], None]) -> None:
        # Every fetch reached the broker and waits there before the event happens (an answer
        # given at once, before it, would not show the event answering it; a fetch arriving
        # after it would be answered by what the event left, e.g. Kafka fences a stale epoch
        # at once). The barrier: the broker read each request off its socket (neither cluster
        # shows its purgatory from outside: Kafka's only through JMX); from there to the
        # purgatory is the request's handling, far shorter than the event's controller round.
        broker_port = int(self.address.rsplit(":", 1)[1])

        def all_read() -> bool:
            with self._lock:
                ports = list(self._sent_from)
            return len(ports) == len(self.held) \
                and all(_read_by_the_broker(broker_port, p) for p in ports)

        until(all_read, "every held fetch read by the broker")
        assert not any(f.done() for f in self.held.values()), "a fetch was not held"
        action()

    def answers(self) -> dict[str, tuple[str, list[tuple[str, str]]]]:
        """label -> (answered at the event or at its wait's end, [(top-level, partition)
        errors])."""
        out: dict[str, tuple[str, list[tuple[str, str]]]] = {}
        for label, f in self.held.items():
            r, early = f.result(HELD_MS / 1000 + 60)
            when = "at the event" if early else "at its deadline"
            out[label] = (when, [(ErrorCode(r.error_code).name, ErrorCode(p.error_code).name)
                                 for t in r.responses for p in t.partitions])
        self.pool.shutdown()
        return out


def test_held_fetches_end_when_their_topic_is_deleted(pair: Pair) -> None:
    topic = "held-deleted"

    def scenario(t: Target) -> object:
        create_ready(t, topic, 1, 3)
        address = leader_address(t, topic)
        epoch = _leader_epoch(address, topic)
        held = HeldFetches(address)
        held.hold("v12 with its epoch", topic, epoch)
        held.hold("v12 without an epoch", topic, -1)
        held.hold("v10", topic, -1, version=10)
        held.hold("v12 session", topic, epoch, session=True)
        admin = t.admin()
        held.event(lambda: outcome(admin.delete_topics([topic], operation_timeout=30)[topic]))
        return held.answers()

    seen = pair.same(scenario)
    assert all(when == "at the event" for when, _ in seen.values()), seen


def test_held_fetches_fenced_by_a_new_epoch_of_the_same_leader(pair: Pair) -> None:
    """A reassignment that reorders the replicas keeps the leader and bumps its epoch: a fetch
    naming the old epoch is fenced (FENCED_LEADER_EPOCH on both), one naming none waits on.
    Kafka answers the fenced ones only at their deadline: its LeaderAndIsr re-checks held
    fetches when the broker becomes a follower (ReplicaManager.makeFollowers) or the leader's
    HW moves (Partition.makeLeader), neither of which happens here. tidelog re-checks them at
    every role change and answers at once (a documented difference: the same answer, sooner)."""
    topic = "held-epoch"

    def scenario(t: Target) -> object:
        create_ready(t, topic, 1, 3)
        p, _ = partition_metadata(t, topic)
        address = leader_address(t, topic)
        epoch = _leader_epoch(address, topic)
        held = HeldFetches(address)
        held.hold("v12 with its epoch", topic, epoch)
        held.hold("v12 session", topic, epoch, session=True)
        held.hold("v10 without an epoch", topic, -1, version=10, max_wait_ms=HELD_MS // 3)
        reordered = [p.leader, *reversed([r for r in p.replicas if r != p.leader])]
        held.event(lambda: reassign(t, topic, reordered))
        answers = held.answers()
        return answers, _leader_epoch(address, topic) > epoch

    on_kafka, on_tidelog = pair.run(scenario)
    fenced = [("NONE", "FENCED_LEADER_EPOCH")]
    assert on_kafka == ({"v12 with its epoch": ("at its deadline", fenced),
                         "v12 session": ("at its deadline", fenced),
                         "v10 without an epoch": ("at its deadline", [("NONE", "NONE")])},
                        True), on_kafka
    assert on_tidelog == ({"v12 with its epoch": ("at the event", fenced),
                           "v12 session": ("at the event", fenced),
                           "v10 without an epoch": ("at its deadline", [("NONE", "NONE")])},
                          True), on_tidelog


def test_held_fetches_end_when_this_broker_stops_leading(pair: Pair) -> None:
    """A preferred election moves the lead to another replica; the old leader becomes its
    follower (LeaderAndIsr). A fetch only a leader may answer (v10, and a follower's) ends at
    once; a consumer's v12 without an epoch may read the follower and waits on (KIP-392)."""
    topic = "held-leader"

    def scenario(t: Target) -> object:
        create_ready(t, topic, 1, 3)
        p, _ = partition_metadata(t, topic)
        address = leader_address(t, topic)
        successor = next(r for r in p.replicas if r != p.leader)
        # First the preferred replica changes (the leader stays, its epoch moves on) ...
        reassign(t, topic, [successor, *[r for r in p.replicas if r != successor]])
        until(lambda: _leader_epoch(address, topic) > 0, "the reordered replicas' epoch")
        epoch = _leader_epoch(address, topic)
        held = HeldFetches(address)
        held.hold("v10", topic, -1, version=10)
        held.hold("v10 session", topic, -1, version=10, session=True)
        held.hold("v12 without an epoch", topic, -1, max_wait_ms=HELD_MS // 3)
        held.hold("v12 session without an epoch", topic, -1, session=True,
                  max_wait_ms=HELD_MS // 3)
        held.hold("v12 with its epoch", topic, epoch)
        admin = t.admin()

        def elect() -> None:  # ... then the lead moves to it
            result = admin.elect_leaders(ElectionType.PREFERRED,
                                         [TopicPartition(topic, 0)]).result(60)
            assert all(e is None for e in result.values()), result

        held.event(elect)
        return held.answers()

    seen = pair.same(scenario)
    assert seen["v10"][0] == "at the event", seen


def _timed(address: str, request: m_fetch.FetchRequest, version: int,
           names: dict[Any, str]) -> tuple[str, list[tuple[str, int, str]], int]:
    """(answered at once or held to max_wait_ms, sorted [(topic as named in ``names``,
    partition, error)], the session id)."""
    sent = time.monotonic()
    r = _send(address, request, version)
    at_once = time.monotonic() < sent + request.max_wait_ms / 1000 - MARGIN_S
    return ("at once" if at_once else "held", sorted(
        (names.get(t.topic_id if version >= 13 else t.topic, "?"), p.partition_index,
         ErrorCode(p.error_code).name) for t in r.responses for p in t.partitions),
        r.session_id)


def test_a_session_with_a_partition_answered_without_a_read(pair: Pair) -> None:
    """Kafka's KafkaApis answers a partition missing from its metadata (or an unknown topic
    id) without a read, and holds the fetch for the others; a partition in the metadata but not
    hosted here is read, fails (NOT_LEADER_OR_FOLLOWER) and answers the fetch at once. Both for
    the fetch opening the session and its incremental fetches, which carry the session's
    partitions anew."""
    topic, wait_ms = "held-mixed", 8_000

    def scenario(t: Target) -> object:
        create_ready(t, topic, 3, 1)  # one partition on each broker
        address = leader_address(t, topic, 0)
        elsewhere = next(i for i in (1, 2) if leader_address(t, topic, i) != address)
        topic_id = topic_id_of(address, topic)
        unknown = uuid.uuid4()
        names: dict[Any, str] = {topic: "here", topic_id: "here", "held-missing": "missing",
                                 unknown: "unknown id"}
        sessions = {
            "a partition led elsewhere": (12, [(topic, ZERO_UUID, 0),
                                               (topic, ZERO_UUID, elsewhere)]),
            "a topic not in the metadata": (12, [(topic, ZERO_UUID, 0),
                                                 ("held-missing", ZERO_UUID, 0)]),
            "an unknown topic id": (13, [("", topic_id, 0), ("", unknown, 0)]),
        }
        seen = {}
        for label, (version, partitions) in sessions.items():
            def request(session_id: int, epoch: int, listed: bool,
                        partitions: list[tuple[str, uuid.UUID, int]] = partitions
                        ) -> m_fetch.FetchRequest:
                return m_fetch.FetchRequest(
                    max_wait_ms=wait_ms, min_bytes=1, max_bytes=1 << 20,
                    session_id=session_id, session_epoch=epoch,
                    topics=[m_fetch.FetchTopic(name, topic_id=tid, partitions=[
                        m_fetch.FetchPartition(p, fetch_offset=0, partition_max_bytes=1 << 20)])
                        for name, tid, p in partitions] if listed else [])

            opened = _timed(address, request(0, 0, True), version, names)
            then = _timed(address, request(opened[2], 1, False), version, names)
            seen[label] = (opened[:2], opened[2] != 0, then[:2])
        return seen

    seen = pair.same(scenario)
    assert seen["a partition led elsewhere"][0][0] == "at once", seen
    assert seen["a topic not in the metadata"][2][0] == "held", seen
