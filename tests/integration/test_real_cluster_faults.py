"""A real 3-broker cluster (`tidelog cluster up`: ZooKeeper + 3 broker processes) used by real
Kafka clients, with kill -9 faults.

- confluent-kafka produces with acks=all to an RF=3 topic and consumes it back byte for byte;
- a follower killed with -9 leaves the ISR after `replica.lag.time.max.ms` (the leader shrinks
  it: same leader epoch), acks=all writes go on with min.insync.replicas=2, and after a restart
  it catches up and rejoins the ISR;
- a leader killed with -9 during an acks=all stream: a new leader from the ISR, no acknowledged
  write lost, one leader per leader epoch, and the old leader rejoins after a restart.

Every process is started by the `tidelog cluster` tool and stopped by PID in the finalizer.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tidelog.cluster.local import LocalCluster, _pid_runs
from tidelog.controller.zk_client import KafkaZkClient
from tidelog.controller.zk_data import LeaderIsrAndControllerEpoch

confluent_kafka = pytest.importorskip("confluent_kafka")

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

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
    def __init__(self, directory: Path) -> None:
        self.dir = directory
        overrides = [a for k, v in OVERRIDES.items() for a in ("--override", f"{k}={v}")]
        r = tidelog("cluster", "up", "--dir", str(directory), "--brokers", "3", *overrides)
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

    def kill(self, broker_id: int) -> None:
        tidelog("cluster", "stop-broker", "--dir", str(self.dir), "--broker", str(broker_id),
                "--kill")

    def start(self, broker_id: int) -> None:
        tidelog("cluster", "start-broker", "--dir", str(self.dir), "--broker", str(broker_id))

    def close(self) -> None:
        self.zk.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealCluster]:
    d = tmp_path_factory.mktemp("real-cluster")
    c: RealCluster | None = None
    try:
        c = RealCluster(d)
        yield c
    finally:
        if c is not None:
            c.close()
        if (d / "cluster.json").exists():
            local = LocalCluster.load(d)
            local.down(timeout_s=15)
            for b in local.brokers.values():  # backstop, by PID, only if still that broker
                if _pid_runs(b.pid, b.config):
                    os.kill(b.pid, signal.SIGKILL)  # type: ignore[arg-type]


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


def test_confluent_kafka_acks_all_rf3_round_trip(cluster: RealCluster) -> None:
    topic = "rt"
    cluster.create_topic(topic, partitions=3)
    values = [(f"k{i}".encode(), bytes([i % 256]) * (1 + (i * 37) % 3000)) for i in range(600)]
    p = producer(cluster.bootstrap, **{"compression.type": "lz4"})
    acked = produce_acked(p, topic, values)
    assert len(acked) == len(values)
    got = consume_all(cluster.bootstrap, topic, 3, len(values))
    sent_by_partition: dict[int, list[bytes]] = {}
    for part, _off, value in sorted(acked, key=lambda a: (a[0], a[1])):
        sent_by_partition.setdefault(part, []).append(value)
    for part in range(3):
        assert [v for _k, v, _o in got[part]] == sent_by_partition.get(part, [])
        assert [o for _k, _v, o in got[part]] == list(range(len(got[part])))
    # Every replica caught up: describe shows full ISRs and no lag.
    def caught_up() -> bool:
        out = tidelog("topics", "describe", "--bootstrap-server", cluster.bootstrap,
                      "--topic", topic).stdout
        rows = [ln for ln in out.splitlines() if "Replica:" in ln]
        return len(rows) == 9 and all("Lag: 0" in ln for ln in rows)

    wait_for(caught_up, 30, "every replica's LEO at the leader's")


def test_follower_kill9_isr_shrinks_then_it_rejoins(cluster: RealCluster) -> None:
    topic = "follower"
    cluster.create_topic(topic)
    before = cluster.state(topic)
    assert before is not None
    follower = next(b for b in before.isr if b != before.leader)
    p = producer(cluster.bootstrap)
    produce_acked(p, topic, [(b"a", b"before-%d" % i) for i in range(50)])
    cluster.kill(follower)
    # The leader drops it after replica.lag.time.max.ms (its ISR update keeps the leader epoch;
    # the controller's, after the ZooKeeper session expired, would bump it).
    shrunk = wait_for(lambda: (s := cluster.state(topic)) and follower not in s.isr and s,
                      timeout_s=30, what="ISR without the killed follower")
    assert shrunk.leader == before.leader
    assert shrunk.leader_epoch == before.leader_epoch
    assert len(shrunk.isr) == 2
    # min.insync.replicas=2 still holds: acks=all writes are acknowledged.
    acked = produce_acked(p, topic, [(b"b", b"during-%d" % i) for i in range(100)])
    assert len(acked) == 100
    cluster.start(follower)
    wait_for(lambda: (s := cluster.state(topic)) and follower in s.isr, timeout_s=60,
             what="the restarted follower back in the ISR")
    got = consume_all(cluster.bootstrap, topic, 1, 150)
    assert [v for _k, v, _o in got[0]] == [b"before-%d" % i for i in range(50)] + [
        b"during-%d" % i for i in range(100)]
    # its log caught up with the leader's
    def lag_zero() -> bool:
        out = tidelog("topics", "describe", "--bootstrap-server", cluster.bootstrap,
                      "--topic", topic).stdout
        row = next((ln for ln in out.splitlines() if f"Replica: {follower}\t" in ln), "")
        return "LEO: 150" in row and "Lag: 0" in row

    wait_for(lag_zero, 30, "the follower's LEO at 150")


def test_leader_kill9_during_acks_all_stream_loses_no_acked_write(cluster: RealCluster) -> None:
    topic = "leader"
    cluster.create_topic(topic)
    first = cluster.state(topic)
    assert first is not None
    old_leader = first.leader

    # Watch the partition state: every (leader epoch -> leader) ever seen.
    epochs: dict[int, set[int]] = {}
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            s = cluster.state(topic)
            if s is not None and s.leader >= 0:
                epochs.setdefault(s.leader_epoch, set()).add(s.leader)
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()

    acked: list[tuple[int, bytes]] = []
    failed: list[str] = []
    p = producer(cluster.bootstrap)

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            failed.append(str(err))
        else:
            acked.append((msg.offset(), msg.value()))

    def produce_until(cond: Callable[[], bool], start: int, limit_s: float) -> int:
        i = start
        deadline = time.monotonic() + limit_s
        while not cond() and time.monotonic() < deadline:
            p.produce(topic, value=b"v-%06d" % i, on_delivery=on_delivery)
            p.poll(0)
            i += 1
            time.sleep(0.002)
        return i

    try:
        n = produce_until(lambda: len(acked) >= 300, 0, 60)
        cluster.kill(old_leader)
        t_kill = len(acked)
        new = wait_for(lambda: (s := cluster.state(topic)) and s.leader not in (-1, old_leader)
                       and s, timeout_s=60, what="a new leader")
        assert new.leader in first.isr
        assert new.leader_epoch > first.leader_epoch
        n = produce_until(lambda: len(acked) >= t_kill + 300, n, 90)
        assert p.flush(60) == 0
    finally:
        stop.set()
        watcher.join(5)
    assert len(acked) >= t_kill + 300, f"only {len(acked)} acked; errors: {failed[:3]}"

    got = consume_all(cluster.bootstrap, topic, 1, len(acked))[0]
    consumed = {v for _k, v, _o in got}
    lost = [v for _o, v in acked if v not in consumed]
    assert not lost, f"{len(lost)} acknowledged records lost, e.g. {lost[:5]}"
    by_offset = {o: v for _k, v, o in got}
    assert all(by_offset.get(o) == v for o, v in acked), "an acked offset holds another record"
    assert all(len(leaders) == 1 for leaders in epochs.values()), epochs

    cluster.start(old_leader)
    wait_for(lambda: (s := cluster.state(topic)) and old_leader in s.isr, timeout_s=60,
             what="the old leader back in the ISR")
