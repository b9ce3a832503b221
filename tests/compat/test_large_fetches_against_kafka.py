"""Large fetches, which tidelog answers with sendfile from the segment files (as Kafka does):
librdkafka (confluent-kafka) and Kafka's Java consumer (kafka-console-consumer) read the same
records from Kafka 3.9 and from tidelog (RF=3, acks=all)."""

from __future__ import annotations

import hashlib
import time

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import NewTopic
from differential import Pair, Target

from tidelog.testing.kafka_cluster import kafka_tool

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CONSOLE_CONSUMER = "org.apache.kafka.tools.consumer.ConsoleConsumer"
TOPIC = "large-fetches"
# 100 KiB and 1 KiB records in large batches: fetches of many whole batches per partition.
VALUES = ([f"{i:06d}".encode() * (100 * 1024 // 6) for i in range(40)]
          + [f"{i:06d}".encode() * (1024 // 6) for i in range(3000)])


def _digest(value: bytes) -> str:
    return hashlib.sha256(value).hexdigest()[:16]


def test_large_fetches_read_the_same_records_on_both(pair: Pair) -> None:
    def scenario(t: Target) -> object:
        admin = t.admin()
        admin.create_topics([NewTopic(TOPIC, 1, 3)])[TOPIC].result(timeout=60)
        # Idempotent, so that a retried request cannot land after a later one (the first
        # requests to a new topic may meet a leader still taking its LeaderAndIsr: on a loaded
        # CI tidelog's log once began with records 604-612, then 0-603).
        producer = t.producer(**{"acks": "all", "linger.ms": 50, "batch.size": 1_000_000,
                                 "message.max.bytes": 1_000_000, "enable.idempotence": True})
        for v in VALUES:
            producer.produce(TOPIC, v, partition=0)
            producer.poll(0)
        assert producer.flush(120) == 0
        consumer = t.consumer(**{"fetch.max.bytes": 4 << 20})
        consumer.assign([TopicPartition(TOPIC, 0, 0)])
        got: list[tuple[int, str]] = []
        try:
            deadline = time.monotonic() + 120  # bounded in time, not in polls (a loaded CI)
            while len(got) < len(VALUES) and time.monotonic() < deadline:
                for m in consumer.consume(1000, timeout=0.1):
                    assert m.error() is None, m.error()
                    got.append((m.offset(), _digest(m.value())))
        finally:
            consumer.close()
        r = kafka_tool(CONSOLE_CONSUMER, "--bootstrap-server", t.bootstrap, "--topic", TOPIC,
                       "--partition", "0", "--offset", "earliest",
                       "--max-messages", str(len(VALUES)), "--timeout-ms", "60000",
                       "--property", "print.offset=true", timeout_s=180)
        assert r.returncode == 0, r.stderr[-2000:]
        java = [(int(line.split("\t", 1)[0].removeprefix("Offset:")),
                 _digest(line.split("\t", 1)[1].encode()))
                for line in r.stdout.splitlines() if line.startswith("Offset:")]
        return got, java

    librdkafka, java = pair.same(scenario)
    expected = [(i, _digest(v)) for i, v in enumerate(VALUES)]
    assert librdkafka == expected
    assert java == expected

