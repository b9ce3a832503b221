"""Produce and fetch edge cases as a client sees them: acks, min.insync.replicas,
max.message.bytes, fetch offsets out of range, ListOffsets by timestamp."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import OFFSET_BEGINNING, TopicPartition
from confluent_kafka.admin import OffsetSpec
from differential import (
    Pair,
    Target,
    create_ready,
    leader_address,
    outcome,
    partition_metadata,
    produce,
    raw,
    topic_shape,
    watermarks,
)

from tidelog.protocol.errors import ErrorCode
from tidelog.protocol.messages import produce as m_produce
from tidelog.protocol.records.builder import Record, build_batch

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.mark.parametrize("acks", ["0", "1", "all"])
def test_produce_with_each_acks_setting(pair: Pair, acks: str) -> None:
    topic = f"acks-{acks}"

    def scenario(t: Target) -> object:
        create_ready(t, topic, 1, 3)
        sent = produce(t, topic, [b"a", b"b", b"c"], acks=acks)
        # acks 0 and 1 answer before the followers copied the records: the HW follows later.
        deadline = time.monotonic() + 20
        while (marks := watermarks(t, topic)) != (0, 3) and time.monotonic() < deadline:
            time.sleep(0.2)
        return sent, marks

    # acks=0: no answer, so no offset (librdkafka reports -1001, OFFSET_INVALID).
    pair.same(scenario)


def test_acks_all_with_an_isr_smaller_than_min_insync_replicas_is_refused(pair: Pair) -> None:
    """Two replicas, min.insync.replicas=2; the follower's broker shuts down (a controlled
    shutdown takes it out of the ISR at once): acks=all is refused with NOT_ENOUGH_REPLICAS and
    nothing is appended, acks=1 is not held to it."""
    def scenario(t: Target) -> object:
        create_ready(t, "min-isr", 1, 2, {"min.insync.replicas": "2"})
        assert topic_shape(t, "min-isr", isr_size=2) == (1, [(2, 2, True)])
        p, _ = partition_metadata(t, "min-isr")
        follower = next(r for r in p.replicas if r != p.leader)
        t.stop_broker(follower)
        try:
            shape = topic_shape(t, "min-isr", isr_size=1)
            refused = produce(t, "min-isr", [b"x"], acks="all", retries=0)
            after_refusal = watermarks(t, "min-isr")
            accepted = produce(t, "min-isr", [b"y"], acks="1")
        finally:
            t.start_broker(follower)
        return shape, refused, after_refusal, accepted

    assert pair.same(scenario) == ((1, [(2, 1, True)]), [("NOT_ENOUGH_REPLICAS", None)], (0, 0),
                                   [(None, 0)])


def test_min_insync_replicas_above_the_replication_factor_counts_as_the_replication_factor(
        pair: Pair) -> None:
    """Kafka 3.9's Partition.effectiveMinIsr: min(min.insync.replicas, replicas). A topic of one
    replica with min.insync.replicas=2 takes acks=all writes."""
    def scenario(t: Target) -> object:
        create_ready(t, "min-isr-capped", 1, 1, {"min.insync.replicas": "2"})
        return produce(t, "min-isr-capped", [b"x"], acks="all", retries=0)

    assert pair.same(scenario) == [(None, 0)]


def test_a_batch_larger_than_max_message_bytes_is_refused(pair: Pair) -> None:
    def scenario(t: Target) -> object:
        create_ready(t, "small-max", 1, 3, {"max.message.bytes": "1000"})
        big = produce(t, "small-max", [b"x" * 2000], acks="all", retries=0)
        small = produce(t, "small-max", [b"x" * 100], acks="all", retries=0)
        return big, small, watermarks(t, "small-max")

    assert pair.same(scenario) == ([("MSG_SIZE_TOO_LARGE", None)], [(None, 0)], (0, 1))


def _first_fetch(t: Target, topic: str, offset: int, reset: str) -> object:
    """Assign `offset` and report the first thing the consumer sees: (offset, value) of a
    record, or the name of an error."""
    c = t.consumer(**{"auto.offset.reset": reset})
    try:
        c.assign([TopicPartition(topic, 0, offset)])
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error():
                return m.error().name()
            return m.offset(), m.value()
        return "nothing"
    finally:
        c.close()


@pytest.mark.parametrize(("offset", "reset"), [
    (100, "error"), (100, "earliest"), (3, "earliest"), (OFFSET_BEGINNING, "error"),
])
def test_fetch_at_an_offset_out_of_range(pair: Pair, offset: int, reset: str) -> None:
    topic = f"range-{offset}-{reset}".replace("-2", "b")

    def scenario(t: Target) -> object:
        create_ready(t, topic, 1, 3)
        produce(t, topic, [b"a", b"b", b"c", b"d", b"e"], acks="all")
        return _first_fetch(t, topic, offset, reset)

    pair.same(scenario)


def test_list_offsets_by_timestamp(pair: Pair) -> None:
    """Records at create times 1000, 2000, 3000 (and 2000 again): the earliest offset whose
    timestamp is >= the one asked; past the last, no offset; earliest, latest, max timestamp."""
    specs = {
        "t=0": OffsetSpec.for_timestamp(0),
        "t=1500": OffsetSpec.for_timestamp(1500),
        "t=2000": OffsetSpec.for_timestamp(2000),
        "t=3000": OffsetSpec.for_timestamp(3000),
        "t=9999": OffsetSpec.for_timestamp(9999),
        "earliest": OffsetSpec.earliest(),
        "latest": OffsetSpec.latest(),
        "max_timestamp": OffsetSpec.max_timestamp(),
    }

    def scenario(t: Target) -> object:
        create_ready(t, "by-time", 1, 3)
        produce(t, "by-time", [b"a", b"b", b"c", b"d"], timestamps=[1000, 2000, 3000, 2000],
                acks="all")
        admin = t.admin()
        out = {}
        for label, spec in specs.items():
            tp = TopicPartition("by-time", 0)
            got = outcome(admin.list_offsets({tp: spec})[tp])
            out[label] = got if isinstance(got, str) else (got.offset, got.timestamp,
                                                           got.leader_epoch)
        return out

    pair.same(scenario)


def _raw_produce(t: Target, topic: str, records: bytes | bytearray, acks: int = -1) -> object:
    """A Produce v8 of one batch to the leader: the partition's answer, every field a client
    reads (error, base offset, append time, log start offset, record errors)."""
    request = m_produce.ProduceRequest(acks=acks, timeout_ms=10000, topic_data=[
        m_produce.TopicProduceData(topic, [m_produce.PartitionProduceData(0, bytes(records))])])
    r = raw(leader_address(t, topic), request, 8).responses[0].partition_responses[0]
    return (ErrorCode(r.error_code).name, r.base_offset, r.log_append_time_ms,
            r.log_start_offset, [(e.batch_index, e.batch_index_error_message is not None)
                                 for e in r.record_errors])


def test_produce_answers_for_a_good_an_oversized_and_a_corrupt_batch(pair: Pair) -> None:
    now = int(time.time() * 1000)  # recent: retention must not delete the batches mid-test
    good = build_batch([Record(b"v" * 10)], base_timestamp=now)
    big = build_batch([Record(b"v" * 2000)], base_timestamp=now)
    corrupt = bytearray(good)
    corrupt[-1] ^= 0xFF  # the last value byte: the CRC no longer matches

    def scenario(t: Target) -> object:
        create_ready(t, "raw-produce", 1, 3, {"max.message.bytes": "1000"})
        return [_raw_produce(t, "raw-produce", b) for b in (good, big, corrupt, good)]

    pair.same(scenario)
