"""Topic configs do on tidelog what they do on Kafka 3.9 (issue 11 item 1): the codec the leader
stores under compression.type, LogAppendTime stamps, message.timestamp.difference.max.ms and
max.message.bytes refusals, as a client observes them."""

from __future__ import annotations

import time
from typing import Any

import pytest
from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, TopicPartition
from differential import Pair, Target, create_ready, leader_address, produce, raw

from tidelog.protocol.messages.fetch import FetchPartition, FetchRequest, FetchTopic
from tidelog.protocol.records.batch import iter_batches
from tidelog.protocol.records.compression import CODEC_NAMES

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _stored_codecs(t: Target, topic: str) -> list[str]:
    """The codec of every batch the leader stores (a Fetch at a fixed version, to the leader)."""
    req = FetchRequest(replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20, topics=[
        FetchTopic(topic=topic, partitions=[FetchPartition(partition=0, fetch_offset=0,
                                                           partition_max_bytes=1 << 20)])])
    data = raw(leader_address(t, topic), req, 11).responses[0].partitions[0]
    return [CODEC_NAMES[b.compression_type] for b in iter_batches(data.records)]


def _timestamp_types(t: Target, topic: str, n: int) -> list[int]:
    c = t.consumer(**{"auto.offset.reset": "earliest"})
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        got: list[int] = []
        deadline = time.monotonic() + 30
        while len(got) < n and time.monotonic() < deadline:
            for m in c.consume(n, timeout=1.0):
                if m.error() is None:
                    got.append(m.timestamp()[0])
        return got
    finally:
        c.close()


def test_compression_type_is_the_codec_the_leader_stores(pair: Pair) -> None:
    def scenario(t: Target) -> object:
        out: dict[str, Any] = {}
        for topic_codec, producer_codec in (("gzip", "none"), ("uncompressed", "lz4"),
                                            ("producer", "snappy"), ("zstd", "gzip")):
            topic = f"codec-{topic_codec}-{producer_codec}"
            create_ready(t, topic, config={"compression.type": topic_codec})
            sent = produce(t, topic, [b"x" * 200] * 3, acks="all",
                           **{"compression.type": producer_codec})
            out[topic] = (sent, _stored_codecs(t, topic))
        return out

    got = pair.same(scenario)
    assert set(got["codec-gzip-none"][1]) == {"gzip"}


def test_timestamp_type_difference_and_size_limits(pair: Pair) -> None:
    def scenario(t: Target) -> object:
        create_ready(t, "ts-append", config={"message.timestamp.type": "LogAppendTime"})
        produce(t, "ts-append", [b"a", b"b"], timestamps=[1_000, 2_000], acks="all")
        append_types = _timestamp_types(t, "ts-append", 2)
        create_ready(t, "ts-diff", config={"message.timestamp.difference.max.ms": "60000"})
        now = int(time.time() * 1000)
        diff = produce(t, "ts-diff", [b"old", b"now"], timestamps=[now - 3_600_000, now],
                       acks="all", retries=0)
        create_ready(t, "size", config={"max.message.bytes": "1000"})
        size = produce(t, "size", [b"x" * 500, b"y" * 5000], acks="all", retries=0,
                       **{"compression.type": "none"})
        return append_types, diff, size

    append_types, diff, size = pair.same(scenario)
    assert append_types == [TIMESTAMP_LOG_APPEND_TIME] * 2
    assert diff[0][0] == "INVALID_TIMESTAMP" and diff[1][0] is None


def test_timestamp_before_and_after_bounds(pair: Pair) -> None:
    """KIP-937: message.timestamp.before.max.ms and .after.max.ms bound a CreateTime record's
    timestamp on each side of the broker's clock; one left at its default falls back to
    message.timestamp.difference.max.ms."""
    topics = {
        "ts-before": {"message.timestamp.before.max.ms": "60000"},
        "ts-after": {"message.timestamp.after.max.ms": "60000"},
        "ts-before-over-diff": {"message.timestamp.difference.max.ms": "60000",
                                "message.timestamp.before.max.ms": "7200000"},
    }

    def scenario(t: Target) -> object:
        out = {}
        for topic, config in topics.items():
            create_ready(t, topic, config=config)
            now = int(time.time() * 1000)
            out[topic] = [error for error, _ in produce(
                t, topic, [b"an hour old", b"now", b"an hour ahead"],
                timestamps=[now - 3_600_000, now, now + 3_600_000], acks="all", retries=0)]
        return out

    assert pair.same(scenario) == {
        "ts-before": ["INVALID_TIMESTAMP", None, None],
        "ts-after": [None, None, "INVALID_TIMESTAMP"],
        "ts-before-over-diff": [None, None, "INVALID_TIMESTAMP"],
    }
