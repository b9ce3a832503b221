"""Transactions as confluent-kafka's clients see them, on Kafka and on tidelog: a transactional
producer commits, aborts and leaves a transaction open; read_committed and read_uncommitted
consumers read the same records at the same offsets, the read_committed high watermark is the
last stable offset, and a producer fenced by a newer one with its transactional.id fails the
same way."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, KafkaException, TopicPartition
from differential import Pair, Target, create_ready, error_name

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOPIC = "txn-out"


def txn_producer(t: Target, transactional_id: str) -> Any:
    p = t.producer(**{"transactional.id": transactional_id, "enable.idempotence": True,
                      "transaction.timeout.ms": 60000})
    p.init_transactions(60)
    return p


def send(p: Any, values: list[bytes]) -> None:
    for v in values:
        p.produce(TOPIC, value=v, partition=0)
    assert p.flush(30) == 0


def read(t: Target, isolation: str, topic: str = TOPIC) -> tuple[int, list[tuple[int, bytes]]]:
    """(high watermark as this consumer's ListOffsets sees it, every record it reads up to it).
    The watermark is the LSO for read_committed."""
    c = t.consumer(**{"isolation.level": isolation, "enable.partition.eof": True})
    tp = TopicPartition(topic, 0)
    try:
        high = int(c.get_watermark_offsets(tp, timeout=10, cached=False)[1])
        c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        got: list[tuple[int, bytes]] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            msg = c.poll(0.5)
            if msg is None:
                continue
            if msg.error() is not None:
                if msg.error().code() == -191:  # _PARTITION_EOF: everything readable was read
                    break
                raise KafkaException(msg.error())
            got.append((msg.offset(), msg.value()))
        return high, got
    finally:
        c.close()


def test_commit_abort_and_an_open_transaction_read_both_ways(pair: Pair) -> None:
    def scenario(t: Target) -> object:
        create_ready(t, TOPIC, 1, 3)
        run = uuid.uuid4().hex[:6]
        p = txn_producer(t, f"txn-a-{run}")
        p.begin_transaction()
        send(p, [b"a", b"b"])
        p.commit_transaction(30)  # a, b, COMMIT marker
        p.begin_transaction()
        send(p, [b"x", b"y"])
        p.abort_transaction(30)  # x, y, ABORT marker
        p.begin_transaction()
        send(p, [b"c"])
        p.commit_transaction(30)
        q = txn_producer(t, f"txn-b-{run}")
        q.begin_transaction()
        send(q, [b"open"])  # holds the LSO
        while_open = (read(t, "read_committed"), read(t, "read_uncommitted"))
        q.abort_transaction(30)
        # EndTxn is answered before the markers are written and replicated (on Kafka too): the
        # LSO reaches the HW a moment later.
        deadline = time.monotonic() + 30
        while True:
            after = (read(t, "read_committed"), read(t, "read_uncommitted"))
            if after[0][0] == after[1][0] or time.monotonic() > deadline:
                return while_open, after
            time.sleep(0.2)

    (committed, uncommitted), (committed_after, uncommitted_after) = pair.same(scenario)
    assert committed == (8, [(0, b"a"), (1, b"b"), (6, b"c")])
    assert uncommitted[0] == 9 and [v for _, v in uncommitted[1]][-1] == b"open"
    assert committed_after == (10, [(0, b"a"), (1, b"b"), (6, b"c")])


def test_a_fenced_producer_cannot_write_or_commit(pair: Pair) -> None:
    def scenario(t: Target) -> object:
        create_ready(t, "txn-fence", 1, 3)
        tid = f"txn-fence-{uuid.uuid4().hex[:6]}"
        old = txn_producer(t, tid)
        old.begin_transaction()
        old.produce("txn-fence", value=b"zombie", partition=0)
        assert old.flush(30) == 0
        txn_producer(t, tid)  # a newer instance: aborts the open transaction, fences `old`
        try:  # the fenced epoch is refused: a fatal error, here or at the commit
            old.produce("txn-fence", value=b"late", partition=0)
            old.flush(30)
            late = None
        except KafkaException as e:
            late = error_name(e)
        try:
            old.commit_transaction(30)
            outcome = "committed"
        except KafkaException as e:
            outcome = error_name(e)
        _, seen = read(t, "read_committed", "txn-fence")
        return late, outcome, seen

    _, outcome, seen = pair.same(scenario)
    assert outcome != "committed" and seen == []


def test_offset_fetch_require_stable_while_a_transaction_commits_offsets(pair: Pair) -> None:
    """KIP-447: offsets sent in an open transaction are UNSTABLE_OFFSET_COMMIT to an OffsetFetch
    v7 with require_stable, and the committed offset once the transaction commits."""
    from differential import coordinator, raw

    from tidelog.protocol.messages import offset_fetch as m_of

    def offset_fetch(t: Target, group: str) -> tuple[int, int, int]:
        request = m_of.OffsetFetchRequest(group_id=group, require_stable=True, topics=[
            m_of.OffsetFetchRequestTopic(name="txn-src", partition_indexes=[0])])
        part = raw(coordinator(t, group), request, 7).topics[0].partitions[0]
        return part.error_code, part.committed_offset, part.partition_index

    def scenario(t: Target) -> object:
        create_ready(t, "txn-src", 1, 3)
        run = uuid.uuid4().hex[:6]
        group = f"txn-group-{run}"
        c = t.consumer(**{"group.id": group})
        p = txn_producer(t, f"txn-offsets-{run}")
        p.begin_transaction()
        p.send_offsets_to_transaction([TopicPartition("txn-src", 0, 5)],
                                      c.consumer_group_metadata(), 30)
        pending = offset_fetch(t, group)
        p.commit_transaction(30)
        deadline = time.monotonic() + 30
        while (done := offset_fetch(t, group))[0] != 0 and time.monotonic() < deadline:
            time.sleep(0.2)  # the COMMIT marker reaches the offsets partition asynchronously
        c.close()
        return pending, done

    pending, done = pair.same(scenario)
    assert pending == (88, -1, 0) and done == (0, 5, 0)  # UNSTABLE_OFFSET_COMMIT, then 5
