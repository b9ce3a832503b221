"""A follower's incremental fetch held at the leader, against a real broker (the test plays
followers 2 and 3 of a partition led by broker 1): another follower's fetch that moves the HW
does not make the leader read the held fetch's partitions again (Kafka's DelayedFetch for a
follower counts bytes past its fetch offset, truncation and leadership, not the HW); records
do wake it, and a held fetch that saw only HW changes answers them at its deadline."""

from __future__ import annotations

import threading
from typing import Any

from harness import (
    ActingController,
    BrokerThread,
    fetch_request,
    produce,
    send,
    values_of,
    wait_until,
)

from tidelog.protocol.records.builder import build_values
from tidelog.replication.types import TopicPartition

FETCH_VERSION = 12  # names its topics and carries replica_id in the body


def _follower_fetch(port: int, topic: str, replica_id: int, offset: int, *, max_wait_ms: int = 0,
                    session_id: int = 0, session_epoch: int = -1) -> Any:
    req = fetch_request(topic, 0, offset, replica_id=replica_id, max_wait_ms=max_wait_ms,
                        current_leader_epoch=0)
    req.session_id, req.session_epoch = session_id, session_epoch
    return send(port, req, FETCH_VERSION, timeout_ms=max_wait_ms + 15_000)


def _count_reads(broker: BrokerThread) -> list[int]:
    """The replica id of every read the broker's fetch handler makes (the real reads: the
    replica manager's method, wrapped)."""
    reads: list[int] = []
    rm = broker.server.replica_manager
    real = rm.fetch_messages

    async def counted(replica_id: int, *args: Any, **kwargs: Any) -> Any:
        reads.append(replica_id)
        return await real(replica_id, *args, **kwargs)

    broker.call(lambda: setattr(rm, "fetch_messages", counted))
    return reads


def _hold(broker: BrokerThread, topic: str, max_wait_ms: int) -> tuple[threading.Thread, list[Any]]:
    """Follower 2 opens a session at offset 1 (the leader's log end) and sends an incremental
    fetch there that the leader holds; returns its thread and where its answer goes."""
    opened = _follower_fetch(broker.port, topic, 2, 1, session_epoch=0)
    assert opened.error_code == 0 and opened.session_id != 0
    answer: list[Any] = []
    held = threading.Thread(target=lambda: answer.append(_follower_fetch(
        broker.port, topic, 2, 1, max_wait_ms=max_wait_ms, session_id=opened.session_id,
        session_epoch=1)))
    held.start()
    apis = broker.server.apis

    def waiting() -> bool:
        session = apis.fetch_manager.cache.get(opened.session_id)
        return session is not None and session.waker is not None

    wait_until(lambda: broker.call(waiting), what="follower 2's fetch is held")
    return held, answer


def _partition(response: Any) -> Any:
    [topic] = response.responses
    [part] = topic.partitions
    return part


def test_a_hw_moved_by_another_follower_does_not_make_the_held_fetch_read_again(
        one_broker: BrokerThread, controller: ActingController) -> None:
    controller.create_topic("held-hw", {0: [1, 2, 3]}, live=[1, 2, 3], isr=[1, 2, 3])
    assert produce(one_broker.port, "held-hw", 0, build_values([b"a"]), acks=1) == (0, 0)
    reads = _count_reads(one_broker)
    held, answer = _hold(one_broker, "held-hw", max_wait_ms=30_000)
    # Follower 3 catches up: the HW moves to 1 (followers 2 and 3 both have offset 0).
    part = _partition(_follower_fetch(one_broker.port, "held-hw", 3, 1))
    assert part.error_code == 0 and part.high_watermark == 0  # the HW as of its read
    core = one_broker.server.replica_manager.core
    assert one_broker.call(lambda: core.partitions[TopicPartition("held-hw", 0)].high_watermark) == 1
    # Records wake the held fetch: it answers them (and the HW of its read).
    assert produce(one_broker.port, "held-hw", 0, build_values([b"b"]), acks=1) == (0, 1)
    held.join(timeout=20)  # well before its 30 s wait
    assert answer, "the held fetch did not wake for the records"
    part = _partition(answer[0])
    assert values_of(part.records) == [b"b"] and part.high_watermark == 1
    # Follower 2's reads: the opening fetch, the held fetch's read at its arrival, and the one
    # of the records. The HW move read nothing (before, one read more per move).
    assert reads.count(2) == 3


def test_a_held_fetch_that_saw_only_hw_moves_answers_them_at_its_deadline(
        one_broker: BrokerThread, controller: ActingController) -> None:
    controller.create_topic("held-hw-end", {0: [1, 2, 3]}, live=[1, 2, 3], isr=[1, 2, 3])
    assert produce(one_broker.port, "held-hw-end", 0, build_values([b"a"]), acks=1) == (0, 0)
    held, answer = _hold(one_broker, "held-hw-end", max_wait_ms=1_000)
    assert _partition(_follower_fetch(one_broker.port, "held-hw-end", 3, 1)).error_code == 0
    held.join(timeout=20)
    assert answer, "the held fetch was not answered at its deadline"
    part = _partition(answer[0])
    assert part.error_code == 0 and part.high_watermark == 1 and values_of(part.records) == []


def _fetch_all(port: int, topic: str, partitions: int, replica_id: int, offset: int, *,
               max_wait_ms: int = 0, session_id: int = 0, session_epoch: int = -1) -> Any:
    from tidelog.protocol.messages.fetch import FetchPartition

    req = fetch_request(topic, 0, offset, replica_id=replica_id, max_wait_ms=max_wait_ms,
                        current_leader_epoch=0)
    [fetch_topic] = req.topics
    fetch_topic.partitions = [
        FetchPartition(partition=p, fetch_offset=offset, current_leader_epoch=0,
                       partition_max_bytes=1 << 20) for p in range(partitions)]
    req.session_id, req.session_epoch = session_id, session_epoch
    return send(port, req, FETCH_VERSION, timeout_ms=max_wait_ms + 15_000)


class _CountingGets(dict[Any, Any]):
    """A session's partitions, counting the lookups of one partition (.get)."""

    gets = 0

    def get(self, key: Any, default: Any = None) -> Any:
        self.gets += 1
        return super().get(key, default)


def test_many_partitions_changing_at_once_are_each_looked_at_once_for_a_held_fetch(
        one_broker: BrokerThread, controller: ActingController) -> None:
    """One answer that changes n partitions of a held follower fetch's session in a row (here
    follower 3's fetch moving n HWs; an ISR update or an UpdateMetadata alike) looks at each
    changed partition once for that fetch. Looking at every dirty one at each change took
    n(n+1)/2 lookups: at 10,000 partitions (3,333 led per broker) an AlterPartition answer
    held a broker ~30 s, followers fell out of the ISR and the idle cluster never settled."""
    n = 100
    topic = "held-many"
    controller.create_topic(topic, {p: [1, 2, 3] for p in range(n)}, live=[1, 2, 3],
                            isr=[1, 2, 3])
    for p in range(n):
        assert produce(one_broker.port, topic, p, build_values([b"a"]), acks=1) == (0, 0)
    opened = _fetch_all(one_broker.port, topic, n, 2, 1, session_epoch=0)
    assert opened.error_code == 0 and opened.session_id != 0
    answer: list[Any] = []
    held = threading.Thread(target=lambda: answer.append(_fetch_all(
        one_broker.port, topic, n, 2, 1, max_wait_ms=2_000, session_id=opened.session_id,
        session_epoch=1)))
    held.start()
    apis = one_broker.server.apis
    session = apis.fetch_manager.cache.get(opened.session_id)
    assert session is not None
    wait_until(lambda: one_broker.call(lambda: session.waker is not None),
               what="follower 2's fetch is held")
    counting = _CountingGets(session.partitions)
    one_broker.call(lambda: setattr(session, "partitions", counting))
    # Follower 3 catches up on every partition: n HWs move, each marks the session.
    fetched = _fetch_all(one_broker.port, topic, n, 3, 1)
    assert all(p.error_code == 0 for t in fetched.responses for p in t.partitions)
    core = one_broker.server.replica_manager.core
    assert one_broker.call(lambda: all(
        core.partitions[TopicPartition(topic, p)].high_watermark == 1 for p in range(n)))
    looked = one_broker.call(lambda: counting.gets)
    assert looked <= n  # the old code: n(n+1)/2 = 5,050
    held.join(timeout=20)
    assert answer and answer[0].error_code == 0  # answered at its deadline, the HWs with it
