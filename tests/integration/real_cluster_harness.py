"""A real local cluster for the integration tests: `tidelog cluster up` (ZooKeeper + 3 broker
processes), real Kafka clients, and helpers to read the partition state in ZooKeeper."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import confluent_kafka

from tidelog.client.connection import BrokerConnection
from tidelog.cluster.local import LocalCluster, _pid_runs
from tidelog.controller.zk_client import KafkaZkClient
from tidelog.controller.zk_data import LeaderIsrAndControllerEpoch
from tidelog.protocol.messages.list_offsets import (
    ListOffsetsPartition,
    ListOffsetsRequest,
    ListOffsetsTopic,
)
from tidelog.protocol.records.batch import iter_batches
from tidelog.replication.types import TopicPartition
from tidelog.sim.invariants import BatchSig, check_replicas

TIDELOG = [sys.executable, "-m", "tidelog"]
LAG_MS = 1500
OVERRIDES = {
    "replica.lag.time.max.ms": str(LAG_MS),
    "zookeeper.session.timeout.ms": "6000",
    "min.insync.replicas": "2",
    "auto.leader.rebalance.enable": "false",
    "default.replication.factor": "3",
}


def tidelog(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    r = subprocess.run([*TIDELOG, *args], capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"tidelog {' '.join(args)} failed:\n{r.stdout}\n{r.stderr}"
    return r


def wait_for(cond: Callable[[], Any], timeout_s: float = 60.0, what: str = "") -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.1)


class RealCluster:
    def __init__(self, directory: Path, overrides: dict[str, str] | None = None) -> None:
        """`overrides`: broker keys over (or in addition to) OVERRIDES."""
        self.dir = directory
        props = {**OVERRIDES, **(overrides or {})}
        args = [a for k, v in props.items() for a in ("--override", f"{k}={v}")]
        r = tidelog("cluster", "up", "--dir", str(directory), "--brokers", "3", *args)
        self.bootstrap = r.stdout.strip().splitlines()[-1]
        state = json.loads((directory / "cluster.json").read_text())
        assert state["bootstrap_servers"] == self.bootstrap
        self.zk = KafkaZkClient(state["zookeeper"]).start(create_top_level_paths=False)

    def state(self, topic: str, partition: int = 0) -> LeaderIsrAndControllerEpoch | None:
        return self.zk.get_partition_state((topic, partition))

    def create_topic(self, topic: str, partitions: int = 1, rf: int = 3) -> None:
        tidelog("topics", "create", "--bootstrap-server", self.bootstrap, "--topic", topic,
                "--partitions", str(partitions), "--replication-factor", str(rf))
        for p in range(partitions):
            wait_for(lambda p=p: (s := self.state(topic, p)) and s.leader >= 0
                     and len(s.isr) == rf, what=f"{topic}-{p} online with a full ISR")

    def create_topic_with_assignment(self, topic: str, assignment: dict[int, list[int]]) -> None:
        """An explicit replica assignment, written as Kafka's AdminZkClient does."""
        from tidelog.controller.admin import AdminZkClient

        AdminZkClient(self.zk).create_topic(topic, 0, 0, replica_assignment=assignment)
        for p, replicas in assignment.items():
            wait_for(lambda p=p, r=replicas: (s := self.state(topic, p)) and s.leader == r[0]
                     and len(s.isr) == len(r), what=f"{topic}-{p} online with a full ISR")

    def stop(self, broker_id: int) -> None:
        """SIGTERM: a controlled shutdown; returns when the process has exited."""
        tidelog("cluster", "stop-broker", "--dir", str(self.dir), "--broker", str(broker_id))

    def kill(self, broker_id: int) -> None:
        tidelog("cluster", "stop-broker", "--dir", str(self.dir), "--broker", str(broker_id),
                "--kill")

    def start(self, broker_id: int) -> None:
        tidelog("cluster", "start-broker", "--dir", str(self.dir), "--broker", str(broker_id))

    def restart_stopped_brokers(self) -> list[int]:
        """Start every broker that is not running (a test that failed between stopping one and
        starting it again) and wait until all three are registered; returns those started."""
        local = LocalCluster.load(self.dir)
        started = [b for b in sorted(local.brokers) if not local.alive(b)]
        for b in started:
            self.start(b)
        wait_for(lambda: sorted(self.zk.get_all_broker_ids()) == sorted(local.brokers),
                 what="every broker registered")
        return started

    def close(self) -> None:
        self.zk.close()


@contextmanager
def running_cluster(d: Path, overrides: dict[str, str] | None = None) -> Iterator[RealCluster]:
    """A RealCluster in `d` for the `with` block; every process stopped by PID at the end, even
    when a test failed (a broker that did not go down in time is killed, only if still that
    broker)."""
    c: RealCluster | None = None
    try:
        c = RealCluster(d, overrides=overrides)
        yield c
    finally:
        if c is not None:
            c.close()
        if (d / "cluster.json").exists():
            local = LocalCluster.load(d)
            local.down(timeout_s=15)
            for b in local.brokers.values():
                if _pid_runs(b.pid, b.config):
                    os.kill(b.pid, signal.SIGKILL)  # type: ignore[arg-type]


class FileReplica:
    """A broker's replica of a partition, read from its segment files (the page cache that other
    processes see: what the broker appended, flushed or not)."""

    def __init__(self, partition_dir: Path) -> None:
        self.sigs: list[BatchSig] = []
        for segment in sorted(partition_dir.glob("*.log")):
            for b in iter_batches(segment.read_bytes()):
                self.sigs.append((b.base_offset, b.last_offset, b.partition_leader_epoch, b.crc))

    @property
    def log_end_offset(self) -> int:
        return self.sigs[-1][1] + 1 if self.sigs else 0

    def batches(self, start: int = 0, end: int | None = None) -> list[BatchSig]:
        return [s for s in self.sigs if s[1] >= start and (end is None or s[0] < end)]

    def batch_at(self, offset: int) -> BatchSig | None:
        return next((s for s in self.sigs if s[0] <= offset <= s[1]), None)


class RealClusterView:
    """The invariant checker's ClusterView of a running local cluster (`tidelog cluster`, a
    RealCluster's or a test's own LocalCluster in `directory`): partition states from ZooKeeper,
    the leader's HW from the leader, each replica's batches from its log files."""

    def __init__(self, directory: Path, zk: KafkaZkClient, topic: str,
                 partitions: int = 1) -> None:
        self.dir = directory
        self.zk = zk
        self.local = LocalCluster.load(directory)
        self.tps = [TopicPartition(topic, p) for p in range(partitions)]

    def partitions(self) -> list[TopicPartition]:
        return self.tps

    def assigned_replicas(self, tp: TopicPartition) -> list[int]:
        return (self.zk.get_topic_assignment(tp.topic) or {}).get(tp.partition, [])

    def zk_state(self, tp: TopicPartition) -> LeaderIsrAndControllerEpoch | None:
        return self.zk.get_partition_state((tp.topic, tp.partition))

    def leader_high_watermark(self, tp: TopicPartition) -> int | None:
        s = self.zk_state(tp)
        if s is None or s.leader < 0 or not self.running(s.leader):
            return None
        return high_watermark(self.local.brokers[s.leader].port, tp.topic, tp.partition)

    def running(self, broker_id: int) -> bool:
        return self.local.alive(broker_id)

    def replica(self, broker_id: int, tp: TopicPartition) -> FileReplica | None:
        d = Path(self.local.brokers[broker_id].log_dir) / f"{tp.topic}-{tp.partition}"
        return FileReplica(d) if d.is_dir() else None


def assert_replicas_agree(cluster: RealCluster | LocalCluster, topic: str, partitions: int = 1,
                          zk: KafkaZkClient | None = None) -> None:
    """DESIGN's replica invariants (sim/invariants.check_replicas, as the simulator runs them at
    the end of a run) on the real cluster: LeaderInIsr, StrongIsr, ValidHighWatermark at once,
    then every replica identical batch by batch once the followers caught up (bounded). A
    LocalCluster comes with the test's own ZooKeeper client `zk`."""
    if isinstance(cluster, RealCluster):
        zk = cluster.zk
    assert zk is not None, "a LocalCluster's check needs a ZooKeeper client"
    view = RealClusterView(cluster.dir, zk, topic, partitions)
    found = check_replicas(view, converged=False)
    assert not found, found
    deadline = time.monotonic() + 30
    while (found := check_replicas(view, converged=True)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not found, found


def producer(bootstrap: str, **extra: Any) -> Any:
    conf = {
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "linger.ms": 5,
        "message.timeout.ms": 60000,
        "request.timeout.ms": 10000,
        "retry.backoff.ms": 100,
        "enable.idempotence": False,
    }
    conf.update(extra)
    return confluent_kafka.Producer(conf)


def consume_all(bootstrap: str, topic: str, partitions: int, expected: int,
                timeout_s: float = 60) -> dict[int, list[tuple[bytes | None, bytes | None, int]]]:
    """Every record of `topic` by partition assignment, from the beginning."""
    c = confluent_kafka.Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": f"g-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
    })
    try:
        c.assign([confluent_kafka.TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING)
                  for p in range(partitions)])
        out: dict[int, list[tuple[bytes | None, bytes | None, int]]] = {
            p: [] for p in range(partitions)}
        deadline = time.monotonic() + timeout_s
        while sum(len(v) for v in out.values()) < expected and time.monotonic() < deadline:
            for m in c.consume(500, timeout=1.0):
                if m.error():
                    continue
                out[m.partition()].append((m.key(), m.value(), m.offset()))
        return out
    finally:
        c.close()


def read_through_last_acked(bootstrap: str, topic: str, acked: list[tuple[int, bytes]],
                            timeout_s: float = 60) -> list[tuple[bytes | None, bytes | None, int]]:
    """Partition 0 of `topic` read up to the last of the `acked` (offset, value) pairs, not
    len(acked) records: a produce the client saw fail (a timeout,
    NOT_ENOUGH_REPLICAS_AFTER_APPEND) may still be in the log, as on Kafka, and puts the acked
    records past len(acked)."""
    expected = max((o for o, _v in acked), default=-1) + 1
    return consume_all(bootstrap, topic, 1, expected, timeout_s=timeout_s)[0]


def produce_acked(p: Any, topic: str, values: list[tuple[bytes, bytes]],
                  partition: int | None = None) -> list[tuple[int, int, bytes]]:
    acked: list[tuple[int, int, bytes]] = []
    errors: list[str] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            acked.append((msg.partition(), msg.offset(), msg.value()))

    for key, value in values:
        kw = {"partition": partition} if partition is not None else {}
        p.produce(topic, value=value, key=key, on_delivery=on_delivery, **kw)
        p.poll(0)
    assert p.flush(60) == 0
    assert not errors, errors[:3]
    return acked


def replica_leo(port: int, topic: str, partition: int) -> int | None:
    """The replica's log end offset, from its own broker (ListOffsets, replica id -2)."""
    return _latest_offset(port, topic, partition, replica_id=-2)


def high_watermark(port: int, topic: str, partition: int) -> int | None:
    """The leader's high watermark (ListOffsets LATEST as a consumer asks it, replica id -1)."""
    return _latest_offset(port, topic, partition, replica_id=-1)


def _latest_offset(port: int, topic: str, partition: int, replica_id: int) -> int | None:
    async def ask() -> int | None:
        conn = BrokerConnection("127.0.0.1", port, request_timeout_ms=3000)
        try:
            await conn.connect(timeout_s=3)
            r = await conn.send(ListOffsetsRequest(
                replica_id=replica_id, topics=[ListOffsetsTopic(topic, [
                    ListOffsetsPartition(partition, -1, -1, max_num_offsets=1)])]))
            p = r.topics[0].partitions[0]
            return None if p.error_code else int(p.offset)
        except Exception:  # noqa: BLE001 - not up yet
            return None
        finally:
            await conn.close()

    return asyncio.run(ask())


def read_committed_to_the_end(bootstrap: str, topic: str, partitions: list[int],
                              group: str) -> list[Any]:
    """Every record a read_committed consumer reads from `partitions` of `topic`, from the start
    to the end, once every transaction is decided and its markers are in (the read_committed end,
    the LSO, equals the HW of each partition)."""
    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": bootstrap, "group.id": group, "isolation.level": "read_committed",
        "auto.offset.reset": "earliest", "enable.auto.commit": False,
        "enable.partition.eof": True})
    plain = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": f"{group}-hw"})
    tps = [confluent_kafka.TopicPartition(topic, p, 0) for p in partitions]
    got: list[Any] = []
    try:
        wait_for(lambda: all(
            consumer.get_watermark_offsets(tp, timeout=10, cached=False)[1]
            == plain.get_watermark_offsets(tp, timeout=10, cached=False)[1] for tp in tps),
            what="every transaction decided and its markers replicated")
        consumer.assign(tps)
        at_end: set[int] = set()
        deadline = time.monotonic() + 60
        while len(at_end) < len(tps) and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error() is not None:
                assert msg.error().code() == confluent_kafka.KafkaError._PARTITION_EOF, msg.error()
                at_end.add(msg.partition())
                continue
            got.append(msg)
        assert len(at_end) == len(tps), "the read_committed reader did not reach the end"
    finally:
        consumer.close()
        plain.close()
    return got
