"""Real Kafka clients are the oracles: confluent-kafka (librdkafka) and kafka-python produce to a
real tidelog broker and consume back, byte for byte."""

from __future__ import annotations

import time
from typing import Any

import pytest
from harness import ActingController, BrokerThread, wait_until
from zk_chroot import new_chroot

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


@pytest.mark.parametrize("compression", [None, "gzip", "snappy", "lz4", "zstd"])
def test_kafka_python_idempotent_producer_round_trip(
    one_broker: BrokerThread, controller: ActingController, compression: str | None
) -> None:
    kafka = pytest.importorskip("kafka")
    topic = f"kp-{compression}"
    controller.create_topic(topic, {0: [1], 1: [1]})
    # kafka-python's default producer is idempotent (acks=all, InitProducerId, sequences).
    producer = kafka.KafkaProducer(bootstrap_servers=one_broker.bootstrap,
                                   compression_type=compression)
    assert producer.config["enable_idempotence"] and producer.config["acks"] in (-1, "all")
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


def test_kafka_python_consumes_through_an_incremental_fetch_session(
    one_broker: BrokerThread, controller: ActingController
) -> None:
    # kafka-python opens a KIP-227 session (librdkafka 2.x fetches sessionless, epoch -1).
    kafka = pytest.importorskip("kafka")
    from harness import produce, wait_until

    from tidelog.protocol.records.builder import build_values

    controller.create_topic("kps", {0: [1], 1: [1]})
    cache = one_broker.server.apis.fetch_manager.cache
    # Earlier consumers' sessions stay cached (as in Kafka, until evicted).
    before = one_broker.call(lambda: set(cache.sessions))
    consumer = kafka.KafkaConsumer(bootstrap_servers=one_broker.bootstrap, enable_auto_commit=False,
                                   fetch_max_wait_ms=100)
    tps = [kafka.TopicPartition("kps", 0), kafka.TopicPartition("kps", 1)]
    consumer.assign(tps)
    for tp in tps:
        consumer.seek(tp, 0)
    got: list[tuple[int, int, bytes]] = []
    try:
        # An empty poll opens the session; what follows arrives through incremental fetches.
        wait_until(lambda: consumer.poll(100) == {}
                   and len(one_broker.call(lambda: set(cache.sessions) - before)) == 1,
                   what="the consumer's fetch session")
        (sid,) = one_broker.call(lambda: set(cache.sessions) - before)
        session = one_broker.call(lambda: cache.sessions[sid])
        assert not session.privileged
        # The epoch now, not a fixed count: how many incremental fetches carry the records
        # depends on timing (on a loaded machine one fetch may bring all six).
        opened = one_broker.call(lambda: session.epoch)
        for i in range(6):
            produce(one_broker.port, "kps", i % 2, build_values([f"v{i}".encode()]), acks=1)
        deadline = time.monotonic() + 30
        while len(got) < 6 and time.monotonic() < deadline:
            for batch in consumer.poll(200).values():
                got += [(m.partition, m.offset, m.value) for m in batch]
        assert one_broker.call(lambda: cache.sessions.get(sid)) is session
        assert one_broker.call(lambda: session.epoch) > opened
    finally:
        consumer.close()
    assert sorted(got) == [(0, 0, b"v0"), (0, 1, b"v2"), (0, 2, b"v4"),
                           (1, 0, b"v1"), (1, 1, b"v3"), (1, 2, b"v5")]


def test_aiokafka_round_trip(one_broker: BrokerThread, controller: ActingController) -> None:
    aiokafka = pytest.importorskip("aiokafka")
    import asyncio

    topic = "aio-topic"
    controller.create_topic(topic, {0: [1]})
    sent = _records(200, "aio")

    async def scenario() -> list[tuple[bytes, bytes]]:
        producer = aiokafka.AIOKafkaProducer(bootstrap_servers=one_broker.bootstrap, acks="all",
                                             enable_idempotence=True, compression_type="lz4")
        await producer.start()
        try:
            futures = [await producer.send(topic, value=v, key=k, partition=0) for k, v in sent]
            metas = [await f for f in futures]
        finally:
            await producer.stop()
        assert [m.offset for m in metas] == list(range(len(sent)))
        consumer = aiokafka.AIOKafkaConsumer(bootstrap_servers=one_broker.bootstrap, group_id=None,
                                             enable_auto_commit=False, auto_offset_reset="earliest")
        await consumer.start()
        got: list[tuple[bytes, bytes]] = []
        try:
            tp = aiokafka.TopicPartition(topic, 0)
            consumer.assign([tp])
            consumer.seek(tp, 0)
            deadline = time.monotonic() + 30
            while len(got) < len(sent) and time.monotonic() < deadline:
                batch = await consumer.getmany(tp, timeout_ms=500)
                got.extend((m.key, m.value) for m in batch.get(tp, []))
        finally:
            await consumer.stop()
        return got

    assert asyncio.run(scenario()) == sent


def test_kcat_round_trip(one_broker: BrokerThread, controller: ActingController) -> None:
    import shutil
    import subprocess

    kcat = shutil.which("kcat") or shutil.which("kafkacat")
    if kcat is None:
        pytest.skip("kcat is not installed")
    topic = "kcat-topic"
    controller.create_topic(topic, {0: [1]})
    lines = [f"key{i}:value-{i}" for i in range(50)]
    subprocess.run([kcat, "-b", one_broker.bootstrap, "-P", "-t", topic, "-p", "0", "-K:",
                    "-X", "acks=all", "-z", "snappy"],
                   input="\n".join(lines) + "\n", text=True, check=True, timeout=60,
                   capture_output=True)
    out = subprocess.run([kcat, "-b", one_broker.bootstrap, "-C", "-t", topic, "-p", "0",
                          "-o", "beginning", "-e", "-f", "%k:%s:%o\\n"],
                         text=True, check=True, timeout=60, capture_output=True).stdout
    assert out.splitlines() == [f"{line}:{i}" for i, line in enumerate(lines)]


def test_confluent_admin_client_with_the_real_controller(
    zookeeper: object, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """librdkafka's AdminClient: create (waits for leaders), describe configs, list, delete."""
    confluent_kafka = pytest.importorskip("confluent_kafka")
    controller_mod = pytest.importorskip("tidelog.controller.controller")
    from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic
    from harness import broker_props

    zk = new_chroot(zookeeper)  # type: ignore[arg-type]
    b = BrokerThread(broker_props(1, zk, tmp_path_factory.mktemp("admin")),
                     controller_factory=controller_mod.KafkaController).start()
    admin: Any = None
    try:
        # librdkafka looks the controller up in the first metadata answers only: one that
        # names none (controller -1, as Kafka's broker answers until the controller's first
        # UpdateMetadata) leaves create_topics waiting for a controller past its timeout.
        wait_until(lambda: b.call(lambda: b.server.metadata_cache.controller_id) == b.broker_id,
                   timeout_s=60, what="the broker's metadata to name its controller")
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        futures = admin.create_topics([NewTopic("adm", 3, 1, config={"retention.ms": "60000"})],
                                      operation_timeout=15)
        futures["adm"].result(30)
        with pytest.raises(confluent_kafka.KafkaException) as exc:
            admin.create_topics([NewTopic("adm", 1, 1)], operation_timeout=5)["adm"].result(30)
        assert exc.value.args[0].code() == confluent_kafka.KafkaError.TOPIC_ALREADY_EXISTS
        md = admin.list_topics(timeout=10)
        assert sorted(md.topics["adm"].partitions) == [0, 1, 2]
        res = ConfigResource(ConfigResource.Type.TOPIC, "adm")
        configs = admin.describe_configs([res])[res].result(30)
        assert configs["retention.ms"].value == "60000"
        assert configs["cleanup.policy"].value == "delete"
        admin.delete_topics(["adm"], operation_timeout=15)["adm"].result(30)
        for _ in range(100):
            if "adm" not in admin.list_topics(timeout=10).topics:
                break
            time.sleep(0.1)
        assert "adm" not in admin.list_topics(timeout=10).topics
    finally:
        # Drop librdkafka's handle before the broker goes, also when the test failed (pytest
        # keeps a failed test's frames: a live handle would retry the stopped broker all session).
        admin = None
        b.stop()
