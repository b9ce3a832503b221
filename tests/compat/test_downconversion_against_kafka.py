"""message.downconversion.enable against Kafka 3.9 (issue 11 leftover): Kafka consults it only
for a client's Fetch v0-3. With it false, Kafka answers a Fetch v3 UNSUPPORTED_VERSION for the
partition and a Fetch v4 as usual; tidelog serves Fetch v4+ only, so its v4 answers (the only
ones it gives) match Kafka's with either value."""

from __future__ import annotations

from typing import Any

import pytest
from differential import Pair, Target, create_ready, produce, raw

from tidelog.protocol.messages.fetch import FetchPartition, FetchRequest, FetchTopic
from tidelog.protocol.records.decoder import iter_records

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _leader(t: Target, topic: str) -> str:
    meta = t.admin().list_topics(topic, timeout=10)
    b = meta.brokers[meta.topics[topic].partitions[0].leader]
    return f"{b.host}:{b.port}"


def _partition(t: Target, topic: str, version: int) -> Any:
    """A consumer's fetch of partition 0 from offset 0, at `version`: its partition data."""
    req = FetchRequest(replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20, topics=[
        FetchTopic(topic=topic, partitions=[FetchPartition(partition=0, fetch_offset=0,
                                                           partition_max_bytes=1 << 20)])])
    return raw(_leader(t, topic), req, version).responses[0].partitions[0]


def _fetch(t: Target, topic: str, version: int) -> tuple[int, list[bytes]]:
    data = _partition(t, topic, version)
    values = [r.value for r in iter_records(bytes(data.records))] if data.records else []
    return data.error_code, values


def test_a_v4_fetch_is_answered_alike_whatever_message_downconversion_enable_says(
        pair: Pair) -> None:
    def scenario(t: Target) -> object:
        out = []
        for value in ("true", "false"):
            topic = f"downconv-{value}"
            create_ready(t, topic, replication_factor=1,
                         config={"message.downconversion.enable": value})
            assert produce(t, topic, [b"a", b"b"], acks="all") == [(None, 0), (None, 1)]
            out.append(_fetch(t, topic, 4))
        return out

    assert pair.same(scenario) == [(0, [b"a", b"b"])] * 2


def _v3_fetch_error(t: Target, topic: str) -> int:
    return int(_partition(t, topic, 3).error_code)


def test_kafka_refuses_a_v3_fetch_only_when_it_may_not_down_convert(pair: Pair) -> None:
    """What the key governs in Kafka: the old fetch versions tidelog does not serve."""
    meta = pair.kafka.admin().list_topics(timeout=10)
    for value in ("true", "false"):
        topic = f"downconv-{value}"  # made by the test above, or now
        if topic not in meta.topics:
            create_ready(pair.kafka, topic, replication_factor=1,
                         config={"message.downconversion.enable": value})
    assert _v3_fetch_error(pair.kafka, "downconv-true") == 0  # down-converted
    assert _v3_fetch_error(pair.kafka, "downconv-false") == 35  # UNSUPPORTED_VERSION
