"""Kafka Streams with processing.guarantee=exactly_once_v2 on real tidelog processes (issue 17
item 4): interop/.../KTableApp.java counts the records of each key and writes every new count; the
broker coordinating the application's transactions is killed with -9 while it runs and more
input arrives. The table ends with every record counted once, and the output read with
read_committed holds for each key the counts 1..n, each once and in order: no update lost or
written twice across the coordinator's failover and the aborted transactions it causes."""

from __future__ import annotations

import asyncio
import struct
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import confluent_kafka
import pytest
from real_cluster_harness import RealCluster, produce_acked, running_cluster, wait_for

from tidelog.client.connection import BrokerConnection
from tidelog.protocol.messages import list_transactions as m_ltx
from tidelog.testing.kafka_cluster import kafka_tool

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]

APP = "tidelog.interop.KTableApp"
APP_ID = "eos-counts"
KEYS = 30
PER_KEY = 100
IN, OUT = "eos-in", "eos-out"


@pytest.fixture(scope="module")
def eos_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealCluster]:
    d: Path = tmp_path_factory.mktemp("streams-eos")
    with running_cluster(d) as c:
        yield c


def records(first: int, last: int) -> list[tuple[bytes, bytes]]:
    return [(f"k{i % KEYS}".encode(), b"v%d" % i) for i in range(first, last)]


def coordinating_broker(c: RealCluster, states: tuple[str, ...] = ("Ongoing",)) -> int | None:
    """The broker whose transaction coordinator holds a transaction of the application in one
    of ``states`` (every state when empty; ListTransactions on each broker)."""
    async def ask(address: str) -> bool:
        host, port = address.rsplit(":", 1)
        conn = BrokerConnection(host, int(port), request_timeout_ms=5000)
        await conn.connect(timeout_s=5)
        try:
            r = await conn.send(m_ltx.ListTransactionsRequest(state_filters=list(states)), 0)
            return any(s.transactional_id.startswith(APP_ID) for s in r.transaction_states)
        finally:
            await conn.close()

    for broker_id, address in enumerate(c.bootstrap.split(","), start=1):
        try:
            if asyncio.run(ask(address)):
                return broker_id
        except Exception:
            continue
    return None


def output_high_watermark(c: RealCluster) -> int:
    consumer = confluent_kafka.Consumer({"bootstrap.servers": c.bootstrap, "group.id": "hw"})
    try:
        return sum(int(consumer.get_watermark_offsets(confluent_kafka.TopicPartition(OUT, p),
                                                      timeout=10, cached=False)[1])
                   for p in range(3))
    finally:
        consumer.close()


def read_committed_counts(c: RealCluster) -> dict[str, list[int]]:
    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": c.bootstrap, "group.id": "eos-check",
        "isolation.level": "read_committed", "enable.partition.eof": True,
        "enable.auto.commit": False})
    out: dict[str, list[int]] = defaultdict(list)
    try:
        consumer.assign([confluent_kafka.TopicPartition(OUT, p, 0) for p in range(3)])
        at_end: set[int] = set()
        deadline = time.monotonic() + 60
        while len(at_end) < 3 and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error() is not None:
                assert msg.error().code() == confluent_kafka.KafkaError._PARTITION_EOF
                at_end.add(msg.partition())
                continue
            out[msg.key().decode()].append(struct.unpack(">q", msg.value())[0])
    finally:
        consumer.close()
    return out


def test_exactly_once_counts_survive_the_coordinator_killed(eos_cluster: RealCluster) -> None:
    c = eos_cluster
    c.create_topic(IN, partitions=3)
    c.create_topic(OUT, partitions=3)
    total = KEYS * PER_KEY
    p = confluent_kafka.Producer({"bootstrap.servers": c.bootstrap, "acks": "all",
                                  "enable.idempotence": True})
    produce_acked(p, IN, records(0, total // 2))
    result: dict[str, Any] = {}

    def run_app() -> None:
        result["r"] = kafka_tool(APP, c.bootstrap, APP_ID, IN, OUT, tempfile.mkdtemp(),
                                 str(total), "exactly_once_v2", timeout_s=400, heap_mb=512)

    app = threading.Thread(target=run_app, daemon=True)
    app.start()
    # Mid-run: the application is writing its transactions; kill their coordinator.
    wait_for(lambda: output_high_watermark(c) > 0, 120, "the application's first output")
    # The coordinator of its transactional id, whatever the state: on a loaded machine the
    # application may have caught up with the first half and hold no open transaction then.
    victim = wait_for(lambda: coordinating_broker(c, states=()), 60,
                      "the application's coordinator")
    c.kill(victim)
    produce_acked(p, IN, records(total // 2, total))
    app.join(400)
    c.start(victim)
    r = result["r"]
    assert r.returncode == 0, r.stderr[-3000:]
    assert dict(line.split("=") for line in r.stdout.split()) == {
        f"k{k}": str(PER_KEY) for k in range(KEYS)}
    # Every transaction of the application complete: the read_committed end is the HW.
    wait_for(lambda: coordinating_broker(c) is None, 60, "no open transaction left")
    counts = read_committed_counts(c)
    assert sorted(counts) == sorted(f"k{k}" for k in range(KEYS))
    for key, seen in counts.items():
        assert seen == list(range(1, PER_KEY + 1)), key
