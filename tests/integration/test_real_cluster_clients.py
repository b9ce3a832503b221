"""Every real client against the real 3-broker cluster: kafka-python (its default idempotent
producer), aiokafka and kcat each create an RF=3 topic (through their own admin API where they
have one), produce with acks=all in every compression, and consume it back by partition
assignment, byte for byte and in offset order."""

from __future__ import annotations

import asyncio
import base64
import random
import shutil
import subprocess
from typing import Any

import pytest
from real_cluster_harness import RealCluster, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

COMPRESSIONS = ["none", "gzip", "snappy", "lz4", "zstd"]
PARTITIONS = 2


def records(seed: int, n: int = 120) -> list[tuple[bytes, bytes]]:
    rng = random.Random(seed)
    return [(b"key-%d" % i, rng.randbytes(rng.randint(0, 2000))) for i in range(n)]


def expected_by_partition(sent: list[tuple[int, int, bytes, bytes]]) -> dict[int, list[tuple[bytes, bytes]]]:
    out: dict[int, list[tuple[bytes, bytes]]] = {}
    for part, _offset, key, value in sorted(sent):
        out.setdefault(part, []).append((key, value))
    return out


def wait_online(real_cluster: RealCluster, topic: str) -> None:
    for p in range(PARTITIONS):
        wait_for(lambda p=p: (s := real_cluster.state(topic, p)) and s.leader >= 0
                 and len(s.isr) == 3, 30, f"{topic}-{p} online")


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_kafka_python(real_cluster: RealCluster, compression: str) -> None:
    kafka = pytest.importorskip("kafka")
    from kafka.admin import KafkaAdminClient, NewTopic

    topic = f"kp-{compression}"
    admin = KafkaAdminClient(bootstrap_servers=real_cluster.bootstrap)
    try:
        admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS, replication_factor=3)])
    finally:
        admin.close()
    wait_online(real_cluster, topic)
    producer = kafka.KafkaProducer(
        bootstrap_servers=real_cluster.bootstrap, acks="all",
        compression_type=None if compression == "none" else compression)
    sent = []
    data = records(1)
    try:
        futures = [(k, v, producer.send(topic, key=k, value=v)) for k, v in data]
        producer.flush(60)
        for k, v, f in futures:
            md = f.get(timeout=60)
            sent.append((md.partition, md.offset, k, v))
    finally:
        producer.close(10)
    consumer = kafka.KafkaConsumer(bootstrap_servers=real_cluster.bootstrap,
                                   enable_auto_commit=False, group_id=None)
    got: dict[int, list[tuple[bytes, bytes, int]]] = {}
    try:
        tps = [kafka.TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)

        def drained() -> bool:
            for tp, msgs in consumer.poll(timeout_ms=500).items():
                got.setdefault(tp.partition, []).extend((m.key, m.value, m.offset) for m in msgs)
            return sum(len(v) for v in got.values()) >= len(data)

        wait_for(drained, 60, "kafka-python consumer")
    finally:
        consumer.close()
    want = expected_by_partition(sent)
    for p in range(PARTITIONS):
        assert [(k, v) for k, v, _ in got.get(p, [])] == want.get(p, [])
        assert [o for _, _, o in got.get(p, [])] == list(range(len(got.get(p, []))))


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_aiokafka(real_cluster: RealCluster, compression: str) -> None:
    aiokafka = pytest.importorskip("aiokafka")
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    topic = f"aio-{compression}"
    data = records(2)

    async def main() -> tuple[list[Any], dict[int, list[tuple[bytes, bytes, int]]]]:
        admin = AIOKafkaAdminClient(bootstrap_servers=real_cluster.bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS,
                                                replication_factor=3)])
        finally:
            await admin.close()
        await asyncio.to_thread(wait_online, real_cluster, topic)
        producer = aiokafka.AIOKafkaProducer(
            bootstrap_servers=real_cluster.bootstrap, acks="all", enable_idempotence=True,
            compression_type=None if compression == "none" else compression)
        await producer.start()
        sent = []
        try:
            futures = [(k, v, await producer.send(topic, key=k, value=v)) for k, v in data]
            for k, v, f in futures:
                md = await asyncio.wait_for(f, 60)
                sent.append((md.partition, md.offset, k, v))
        finally:
            await producer.stop()
        consumer = aiokafka.AIOKafkaConsumer(bootstrap_servers=real_cluster.bootstrap,
                                             enable_auto_commit=False, group_id=None)
        await consumer.start()
        got: dict[int, list[tuple[bytes, bytes, int]]] = {}
        try:
            tps = [aiokafka.TopicPartition(topic, p) for p in range(PARTITIONS)]
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            async with asyncio.timeout(60):
                while sum(len(v) for v in got.values()) < len(data):
                    batch = await consumer.getmany(timeout_ms=500)
                    for tp, msgs in batch.items():
                        got.setdefault(tp.partition, []).extend(
                            (m.key, m.value, m.offset) for m in msgs)
        finally:
            await consumer.stop()
        return sent, got

    sent, got = asyncio.run(main())
    want = expected_by_partition(sent)
    for p in range(PARTITIONS):
        assert [(k, v) for k, v, _ in got.get(p, [])] == want.get(p, [])
        assert [o for _, _, o in got.get(p, [])] == list(range(len(got.get(p, []))))


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_kcat(real_cluster: RealCluster, compression: str) -> None:
    kcat = shutil.which("kcat")
    if kcat is None:
        pytest.skip("kcat is not installed")
    topic = f"kcat-{compression}"
    real_cluster.create_topic(topic, partitions=PARTITIONS)
    # kcat reads delimited text: values are base64 of random bytes (no delimiter inside).
    lines = {p: [base64.b64encode(v).decode() for _k, v in records(10 + p, 80)]
             for p in range(PARTITIONS)}
    for p, values in lines.items():
        subprocess.run(
            [kcat, "-P", "-b", real_cluster.bootstrap, "-t", topic, "-p", str(p),
             "-X", "acks=all", "-z", compression, "-D", "\n"],
            input="\n".join(values) + "\n", text=True, check=True, timeout=60,
            capture_output=True)
    for p, values in lines.items():
        r = subprocess.run(
            [kcat, "-C", "-b", real_cluster.bootstrap, "-t", topic, "-p", str(p),
             "-o", "beginning", "-e", "-q", "-f", "%o %s\n"],
            text=True, check=True, timeout=60, capture_output=True)
        rows = [ln.split(" ", 1) for ln in r.stdout.splitlines() if ln]
        assert [int(o) for o, _ in rows] == list(range(len(values)))
        assert [v for _, v in rows] == values
