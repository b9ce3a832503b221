"""KIP-392 with real processes: three brokers in three racks with
``replica.selector.class=org.apache.kafka.common.replica.RackAwareReplicaSelector``; consumers
that name a ``client.rack`` read from the replica in their rack.

Every broker's client listener is advertised at a frame-aware proxy (the brokers replicate over
a separate listener), so the test counts, per broker, the record bytes its answers to consumer
fetches carried: the records must come from the follower in the consumer's rack, and the leader
must have answered with ``preferred_read_replica`` and no records."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from typing import Any

import confluent_kafka
import pytest
from frame_proxy import FrameProxy, ProxiedRequest
from real_cluster_harness import producer, wait_for

from tidelog.client import KafkaClient
from tidelog.client.consumer import Consumer
from tidelog.client.metadata import TopicPartition
from tidelog.cluster.local import LocalCluster
from tidelog.cluster.zookeeper import pick_free_port
from tidelog.controller.admin import AdminZkClient
from tidelog.controller.zk_client import KafkaZkClient
from tidelog.protocol.api_keys import ApiKey
from tidelog.protocol.codec import decode_response
from tidelog.testing.kafka_cluster import kafka_tool

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

TOPIC = "nearby"
TP = TopicPartition(TOPIC, 0)
RECORDS = 300
SETTINGS = {
    "zookeeper.session.timeout.ms": "6000",
    "auto.leader.rebalance.enable": "false",
    "replica.selector.class": "org.apache.kafka.common.replica.RackAwareReplicaSelector",
}
CONSOLE_CONSUMER = "org.apache.kafka.tools.consumer.ConsoleConsumer"


class ConsumerFetches:
    """What one broker's answers to consumer fetches (replica id -1, no replica state) of TOPIC
    carried, seen at the proxy in front of its client listener."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.record_bytes = 0
        self.preferred: Counter[int] = Counter()

    def watch(self, req: ProxiedRequest, frame: bytes) -> None:
        body = req.body
        if req.api_key != ApiKey.FETCH or body is None or body.replica_id >= 0 \
                or getattr(body, "replica_state", None) is not None:
            return
        _, response = decode_response(req.api_key, req.api_version, frame)
        with self.lock:
            for t in response.responses:
                for p in t.partitions:
                    self.record_bytes += len(p.records or b"")
                    if p.preferred_read_replica >= 0:
                        self.preferred[p.preferred_read_replica] += 1

    def snapshot(self) -> tuple[int, Counter[int]]:
        with self.lock:
            return self.record_bytes, Counter(self.preferred)


@pytest.fixture(scope="module")
def racks(tmp_path_factory: pytest.TempPathFactory) -> Any:
    proxies: dict[int, FrameProxy] = {}
    seen: dict[int, ConsumerFetches] = {}

    def overrides(broker_id: int, client_port: int) -> dict[str, str]:
        replication = pick_free_port()
        proxies[broker_id] = FrameProxy(client_port).start()
        seen[broker_id] = ConsumerFetches()
        proxies[broker_id].on_response = seen[broker_id].watch
        return {
            "broker.rack": f"rack-{broker_id}",
            "listeners": f"PLAINTEXT://127.0.0.1:{client_port},"
                         f"REPLICATION://127.0.0.1:{replication}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{proxies[broker_id].port},"
                                    f"REPLICATION://127.0.0.1:{replication}",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,REPLICATION:PLAINTEXT",
            "inter.broker.listener.name": "REPLICATION",
        }

    cluster = LocalCluster(tmp_path_factory.mktemp("racks"))
    zk: KafkaZkClient | None = None
    try:
        cluster.up(3, SETTINGS, broker_overrides=overrides)
        zk = KafkaZkClient(cluster.zookeeper).start(create_top_level_paths=False)
        AdminZkClient(zk).create_topic(TOPIC, 0, 0, {}, replica_assignment={0: [1, 2, 3]})
        wait_for(lambda: (s := zk.get_partition_state((TOPIC, 0))) and s.leader == 1  # type: ignore[union-attr]
                 and s.isr == (1, 2, 3), 30, "1 leads with ISR [1,2,3]")
        p = producer(cluster.bootstrap_servers, **{"linger.ms": 0})
        for i in range(RECORDS):
            p.produce(TOPIC, value=f"v{i}".encode() * 20, partition=0)
        assert p.flush(60) == 0
        del p  # its threads go now, not reconnecting to the stopped cluster at the end
        yield cluster, seen
    finally:
        if zk is not None:
            zk.close()
        cluster.down(timeout_s=15)
        for proxy in proxies.values():
            proxy.stop()


def expected_values() -> list[bytes]:
    return [f"v{i}".encode() * 20 for i in range(RECORDS)]


async def read_all(bootstrap: str, client_rack: str) -> list[bytes]:
    async with KafkaClient(bootstrap) as client:
        consumer = Consumer(client, client_rack=client_rack, auto_offset_reset="earliest")
        consumer.assign([(TP, 0)])
        values: list[bytes] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        try:
            while len(values) < RECORDS and loop.time() < deadline:
                values += [r.value or b"" for r in await consumer.poll(timeout_ms=1000)]
        finally:
            await consumer.close()
        return values


def test_consumers_read_from_the_replica_in_their_rack(racks: Any) -> None:
    cluster, seen = racks
    before = {b: seen[b].snapshot()[0] for b in seen}

    # A consumer in rack-2: the leader (rack-1) names follower 2, which serves every record.
    assert asyncio.run(read_all(cluster.bootstrap_servers, "rack-2")) == expected_values()
    served = {b: seen[b].snapshot()[0] - before[b] for b in seen}
    assert served[1] == 0 and served[3] == 0, served
    assert served[2] >= RECORDS * 40, served  # at least every value's bytes
    assert seen[1].snapshot()[1][2] >= 1  # the leader's answer named broker 2

    # A consumer in the leader's rack reads from the leader.
    before = {b: seen[b].snapshot()[0] for b in seen}
    assert asyncio.run(read_all(cluster.bootstrap_servers, "rack-1")) == expected_values()
    served = {b: seen[b].snapshot()[0] - before[b] for b in seen}
    assert served[1] >= RECORDS * 40 and served[2] == 0 and served[3] == 0, served


def test_kafkas_java_consumer_reads_from_the_replica_in_its_rack(racks: Any) -> None:
    cluster, seen = racks
    before = {b: seen[b].snapshot() for b in seen}
    r = kafka_tool(CONSOLE_CONSUMER, "--bootstrap-server", cluster.bootstrap_servers,
                   "--topic", TOPIC, "--partition", "0", "--offset", "earliest",
                   "--max-messages", str(RECORDS), "--timeout-ms", "60000",
                   "--consumer-property", "client.rack=rack-3", timeout_s=180)
    assert r.returncode == 0, r.stderr[-2000:]
    assert [line.encode() for line in r.stdout.splitlines()] == expected_values()
    served = {b: seen[b].snapshot()[0] - before[b][0] for b in seen}
    assert served[1] == 0 and served[2] == 0, served
    assert served[3] >= RECORDS * 40, served
    assert seen[1].snapshot()[1][3] > before[1][1][3]  # the leader's answer named broker 3


def test_librdkafka_reads_from_the_replica_in_its_rack(racks: Any) -> None:
    cluster, seen = racks
    before = {b: seen[b].snapshot()[0] for b in seen}
    c = confluent_kafka.Consumer({"bootstrap.servers": cluster.bootstrap_servers,
                                  "group.id": "nearby-librdkafka", "enable.auto.commit": False,
                                  "client.rack": "rack-2"})
    values: list[bytes] = []
    try:
        c.assign([confluent_kafka.TopicPartition(TOPIC, 0, confluent_kafka.OFFSET_BEGINNING)])
        deadline = time.monotonic() + 60
        while len(values) < RECORDS and time.monotonic() < deadline:
            values += [m.value() for m in c.consume(500, timeout=1.0) if not m.error()]
    finally:
        c.close()
    assert values == expected_values()
    served = {b: seen[b].snapshot()[0] - before[b] for b in seen}
    assert served[1] == 0 and served[3] == 0, served
    assert served[2] >= RECORDS * 40, served


def test_a_fetch_held_at_the_follower_is_answered_when_its_hw_moves(racks: Any) -> None:
    """Kafka's follower completes the consumer fetches held on a partition whose HW its
    fetcher just moved (ReplicaFetcherThread.completeDelayedFetchRequests): a fetch at the
    follower's HW waiting up to 60 s is answered with the next record once it is committed."""
    cluster, _ = racks

    async def held_fetch_then_produce() -> tuple[Any, float]:
        async with KafkaClient(cluster.bootstrap_servers) as client:
            await client.refresh_metadata([TOPIC])
            end = (await client.list_offsets({TP: -1}))[TP].offset

            async def follower_hw() -> int:
                _, _, got = await client.fetch_from(2, {TP: end}, max_wait_ms=0, min_bytes=0,
                                                    rack_id="rack-2")
                return got[TP].high_watermark

            while await follower_hw() < end:  # bounded by the test's timeout
                await asyncio.sleep(0.05)
            held = asyncio.ensure_future(client.fetch_from(
                2, {TP: end}, max_wait_ms=60_000, min_bytes=1, rack_id="rack-2"))
            p = producer(cluster.bootstrap_servers, **{"linger.ms": 0})
            p.produce(TOPIC, value=b"late", partition=0)
            assert await asyncio.to_thread(p.flush, 30) == 0
            del p
            committed = time.monotonic()
            _, _, got = await held
            return got[TP], time.monotonic() - committed

    answer, waited_s = asyncio.run(held_fetch_then_produce())
    assert answer.error == 0 and b"late" in bytes(answer.records)
    # The follower learns the HW within replica.fetch.wait.max.ms (500 ms) of the commit.
    assert waited_s < 10, waited_s
