"""Real Kafka clients are the oracles: confluent-kafka (librdkafka) and kafka-python produce to a
real tidelog broker and consume back, byte for byte."""

from __future__ import annotations

import time

import pytest
from harness import ActingController, BrokerThread

pytestmark = pytest.mark.integration


def _records(n: int, tag: str) -> list[tuple[bytes, bytes]]:
    return [(f"k{i}".encode(), f"{tag}-value-{i}-".encode() * (1 + i % 7)) for i in range(n)]


@pytest.mark.parametrize("compression", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_confluent_kafka_acks_all_round_trip(
    one_broker: BrokerThread, controller: ActingController, compression: str
) -> None:
    confluent_kafka = pytest.importorskip("confluent_kafka")
    topic = f"ck-{compression}"
    controller.create_topic(topic, {0: [1]})
    sent = _records(300, compression)
    producer = confluent_kafka.Producer({
        "bootstrap.servers": one_broker.bootstrap, "acks": "all", "compression.type": compression,
        "enable.idempotence": True, "linger.ms": 5,
    })
    acked: list[tuple[int, int]] = []

    def on_delivery(err: object, msg: object) -> None:
        assert err is None, err
        acked.append((msg.partition(), msg.offset()))  # type: ignore[attr-defined]

    for k, v in sent:
        producer.produce(topic, value=v, key=k, partition=0, on_delivery=on_delivery)
    assert producer.flush(30) == 0
    assert sorted(o for _, o in acked) == list(range(len(sent)))

    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": one_broker.bootstrap, "group.id": "unused",
        "enable.auto.commit": False,
    })
    consumer.assign([confluent_kafka.TopicPartition(topic, 0, 0)])
    got: list[tuple[bytes, bytes, int]] = []
    deadline = time.monotonic() + 30
    try:
        while len(got) < len(sent) and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            got.append((msg.key(), msg.value(), msg.offset()))
    finally:
        consumer.close()
    assert [(k, v) for k, v, _ in got] == sent
    assert [o for _, _, o in got] == list(range(len(sent)))


def test_kafka_python_idempotent_producer_round_trip(
    one_broker: BrokerThread, controller: ActingController
) -> None:
    kafka = pytest.importorskip("kafka")
    topic = "kp-topic"
    controller.create_topic(topic, {0: [1], 1: [1]})
    producer = kafka.KafkaProducer(bootstrap_servers=one_broker.bootstrap, acks="all",
                                   enable_idempotence=True, compression_type="gzip")
    sent = _records(100, "kp")
    futures = [producer.send(topic, key=k, value=v, partition=i % 2) for i, (k, v) in enumerate(sent)]
    producer.flush(30)
    metas = [f.get(timeout=30) for f in futures]
    producer.close()
    assert sorted(m.offset for m in metas if m.partition == 0) == list(range(50))
    consumer = kafka.KafkaConsumer(bootstrap_servers=one_broker.bootstrap, enable_auto_commit=False,
                                   consumer_timeout_ms=5000, auto_offset_reset="earliest")
    consumer.assign([kafka.TopicPartition(topic, 0), kafka.TopicPartition(topic, 1)])
    got = {}
    for msg in consumer:
        got[(msg.partition, msg.offset)] = (msg.key, msg.value)
        if len(got) == len(sent):
            break
    consumer.close()
    expected = {}
    counters = [0, 0]
    for i, kv in enumerate(sent):
        expected[(i % 2, counters[i % 2])] = kv
        counters[i % 2] += 1
    assert got == expected
