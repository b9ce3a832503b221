"""Issue 14 item 4: partition reassignment on a 4-broker cluster with Apache Kafka 3.9's own
kafka-reassign-partitions, against Kafka and against tidelog.

- The tool's outputs (execute with a throttle, list, verify until complete and the throttles
  cleared, a refused target, a cancel with nothing to cancel) are the same on both clusters,
  and both end with the partition on [2, 3, 4].
- The proof on tidelog: [1, 2, 3] -> [2, 3, 4] under an acks=all stream, throttled so that the
  move lasts, the controller killed -9 in the middle; afterwards every acknowledged record is
  consumed, the ISR is [2, 3, 4] and broker 1's directory for the partition is gone. Then the
  same through the legacy /admin/reassign_partitions znode, and `tidelog reassign` itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicCollection
from confluent_kafka import TopicPartition as CkTopicPartition
from confluent_kafka.admin import AdminClient
from kazoo.client import KazooClient
from tidelog_clusters import running_local_cluster

from tidelog.cluster.local import LocalCluster
from tidelog.testing.kafka_cluster import KafkaCluster, kafka_tool

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]

REASSIGN = "org.apache.kafka.tools.reassign.ReassignPartitionsCommand"
TOPICS = "org.apache.kafka.tools.TopicCommand"
SETTINGS = {"zookeeper.session.timeout.ms": "6000"}


@pytest.fixture(scope="module")
def kafka4(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    cluster = KafkaCluster(tmp_path_factory.mktemp("kafka4"))
    cluster.up(4, overrides=SETTINGS)
    try:
        yield cluster
    finally:
        cluster.down()


@pytest.fixture(scope="module")
def tidelog4(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with running_local_cluster(tmp_path_factory.mktemp("tidelog4"), 4, SETTINGS) as cluster:
        yield cluster


def tool(bootstrap: str, *args: str) -> tuple[int, str]:
    r = kafka_tool(REASSIGN, "--bootstrap-server", bootstrap, *args)
    return r.returncode, r.stdout + ("" if r.returncode == 0 else r.stderr.split("\n")[0])


def plan_file(d: Path, topic: str, replicas: list[int]) -> str:
    path = d / f"{topic}-{'-'.join(map(str, replicas))}.json"
    path.write_text(json.dumps({"version": 1, "partitions": [
        {"topic": topic, "partition": 0, "replicas": replicas}]}))
    return str(path)


def create(bootstrap: str, topic: str, assignment: str = "1:2:3") -> None:
    r = kafka_tool(TOPICS, "--bootstrap-server", bootstrap, "--create", "--topic", topic,
                   "--replica-assignment", assignment)
    assert r.returncode == 0, r.stderr


def describe(bootstrap: str, topic: str) -> tuple[list[int], list[int], int]:
    """(replicas, ISR, leader) of partition 0."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    td = admin.describe_topics(TopicCollection([topic]))[topic].result(30)
    p = td.partitions[0]
    return [r.id for r in p.replicas], sorted(r.id for r in p.isr), p.leader.id


def produce_acked(bootstrap: str, topic: str, values: list[bytes]) -> list[bytes]:
    acked: list[bytes] = []
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    for v in values:
        p.produce(topic, v, partition=0,
                  on_delivery=lambda e, m: acked.append(m.value()) if e is None else None)
    p.flush(60)
    return acked


def consume_all(bootstrap: str, topic: str, n: int, timeout_s: float = 60) -> list[bytes]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{time.time_ns()}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.assign([CkTopicPartition(topic, 0, 0)])
    out: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(out) < n and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                out.append(m.value())
    finally:
        c.close()
    return out


def wait_until(cond: Any, timeout_s: float, what: str) -> Any:
    """Polls `cond`; a client error (a broker restarting, a slow answer) counts as not yet."""
    deadline = time.monotonic() + timeout_s
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            got = cond()
        except (KafkaException, TimeoutError) as e:
            last, got = e, None
        if got:
            return got
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what} (last error: {last!r})")


def verified(bootstrap: str, plan: str) -> tuple[int, str]:
    """verify, repeated until it reports the move complete (it then clears the throttles)."""
    return wait_until(lambda: (r := tool(bootstrap, "--verify", "--reassignment-json-file",
                                         plan)) and "is completed" in r[1] and r,
                      180, "the reassignment to complete")


def scenario(bootstrap: str, d: Path) -> list[Any]:
    create(bootstrap, "moving")
    assert len(produce_acked(bootstrap, "moving", [b"v%d" % i for i in range(200)])) == 200
    to_234 = plan_file(d, "moving", [2, 3, 4])
    seen: list[Any] = [
        tool(bootstrap, "--execute", "--reassignment-json-file", to_234, "--throttle",
             "10000000"),
        verified(bootstrap, to_234),
        tool(bootstrap, "--list"),
        tool(bootstrap, "--cancel", "--reassignment-json-file", to_234),
        tool(bootstrap, "--execute", "--reassignment-json-file",
             plan_file(d, "moving", [2, 3, 9])),
    ]
    replicas, isr, leader = describe(bootstrap, "moving")
    seen.append((sorted(replicas), isr, leader in (2, 3, 4)))
    seen.append(len(consume_all(bootstrap, "moving", 200)))
    return seen


def test_kafka_reassign_partitions_prints_the_same_on_kafka_and_tidelog(
        kafka4: KafkaCluster, tidelog4: LocalCluster) -> None:
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        on_kafka = scenario(kafka4.bootstrap_servers, Path(a))
        on_tidelog = scenario(tidelog4.bootstrap_servers, Path(b))

    def normal(seen: list[Any]) -> list[Any]:
        # the rollback JSON names no broker-specific thing; the temp paths differ
        return [x if not isinstance(x, tuple) or not isinstance(x[1], str)
                else (x[0], x[1].replace(a, "D").replace(b, "D")) for x in seen]

    assert normal(on_tidelog) == normal(on_kafka), (on_kafka, on_tidelog)
    assert on_kafka[-2:] == [([2, 3, 4], [2, 3, 4], True), 200]


def _stream(bootstrap: str, topic: str, stop: threading.Event, acked: list[bytes]) -> None:
    """acks=all, one record every few ms until stopped (bounded: at most 20,000)."""
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5,
                  "message.timeout.ms": 120000, "enable.idempotence": True})
    for i in range(20_000):
        if stop.is_set():
            break
        p.produce(topic, b"s%06d" % i, partition=0,
                  on_delivery=lambda e, m: acked.append(m.value()) if e is None else None)
        p.poll(0)
        time.sleep(0.005)
    p.flush(120)


def _controller(bootstrap: str) -> int:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    return int(admin.describe_cluster().result(30).controller.id)


def _partition_dirs(cluster: LocalCluster, broker: int, topic: str) -> list[Path]:
    return list((cluster.dir / f"broker-{broker}" / "data").glob(f"{topic}-0"))


THROTTLE = "100000"  # bytes/s, of the moves a controller kill interrupts


def _move_under_load(cluster: LocalCluster, topic: str, start_move: Any) -> None:
    bs = cluster.bootstrap_servers
    create(bs, topic)
    # 3 MB of history so that a 100 kB/s throttle keeps the move going for ~20 s: the quota
    # (replication.quota.window.num 11 windows of 1 s, counted as at least 10 s) lets the first
    # ~1 MB through at once. At 300 kB/s that first ~3 MB was the whole history, so the new
    # replica could catch up in one round and, with AlterPartition (KIP-497), the controller
    # completes the move at once: the kill came after the move
    assert len(produce_acked(bs, topic, [os.urandom(1000) for _ in range(3000)])) == 3000
    history = 3000
    stop, acked = threading.Event(), []  # type: ignore[var-annotated]
    streamer = threading.Thread(target=_stream, args=(bs, topic, stop, acked), daemon=True)
    streamer.start()
    try:
        start_move()
        wait_until(lambda: 4 in describe(bs, topic)[0], 60, "broker 4 added to the replicas")
        assert sorted(describe(bs, topic)[1]) != [2, 3, 4], "the move ended before the kill"
        victim = _controller(bs)
        cluster.stop_broker(victim, kill=True)
        cluster.start_broker(victim, timeout_s=120)
        wait_until(lambda: describe(bs, topic)[:2] == ([2, 3, 4], [2, 3, 4]), 240,
                   "replicas and ISR [2, 3, 4]")
    finally:
        stop.set()
        streamer.join(180)
    wait_until(lambda: not _partition_dirs(cluster, 1, topic), 60, "broker 1's directory gone")
    got = consume_all(bs, topic, history + len(acked), timeout_s=120)
    assert set(acked) <= set(got), f"{len(set(acked) - set(got))} acked records lost"
    assert len(got) >= history + len(acked)
    assert _partition_dirs(cluster, 4, topic)


def test_a_move_under_acks_all_survives_the_controller_killed_with_the_tool(
        tidelog4: LocalCluster) -> None:
    bs = tidelog4.bootstrap_servers
    with tempfile.TemporaryDirectory() as d:
        plan = plan_file(Path(d), "proof", [2, 3, 4])

        def start() -> None:
            code, out = tool(bs, "--execute", "--reassignment-json-file", plan,
                             "--throttle", THROTTLE)
            assert code == 0 and "Successfully started" in out, out

        _move_under_load(tidelog4, "proof", start)
        code, out = verified(bs, plan)
        assert code == 0 and "Clearing topic-level throttles on topic proof" in out


def test_a_move_through_the_legacy_znode_survives_the_controller_killed(
        tidelog4: LocalCluster) -> None:
    zk = KazooClient(hosts=tidelog4.zookeeper)
    zk.start(timeout=30)
    try:
        def start() -> None:
            # the throttle the tool would set, by hand: the move lasts while the controller dies
            for b in (1, 2, 3, 4):
                _configs(tidelog4, "--broker", str(b), "--add-config",
                         f"leader.replication.throttled.rate={THROTTLE},"
                         f"follower.replication.throttled.rate={THROTTLE}")
            _configs(tidelog4, "--topic", "znode", "--add-config",
                     "leader.replication.throttled.replicas=[0:1,0:2,0:3],"
                     "follower.replication.throttled.replicas=0:4")
            zk.create("/admin/reassign_partitions", json.dumps({"version": 1, "partitions": [
                {"topic": "znode", "partition": 0, "replicas": [2, 3, 4]}]}).encode())

        _move_under_load(tidelog4, "znode", start)
        wait_until(lambda: zk.exists("/admin/reassign_partitions") is None, 60,
                   "the legacy znode deleted once the move completed")
    finally:
        zk.stop()
        zk.close()


def _configs(cluster: LocalCluster, *args: str) -> None:
    r = subprocess.run([sys.executable, "-m", "tidelog", "configs", "alter",
                        "--bootstrap-server", cluster.bootstrap_servers, *args],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_tidelog_reassign_moves_back_and_clears_the_throttles(tidelog4: LocalCluster) -> None:
    bs = tidelog4.bootstrap_servers

    def cli(*args: str) -> str:
        r = subprocess.run([sys.executable, "-m", "tidelog", "reassign", *args,
                            "--bootstrap-server", bs], capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0, r.stderr
        return r.stdout

    create(bs, "cli-move", "2:3:4")
    assert len(produce_acked(bs, "cli-move", [b"c%d" % i for i in range(100)])) == 100
    with tempfile.TemporaryDirectory() as d:
        topics = Path(d) / "topics.json"
        topics.write_text(json.dumps({"version": 1, "topics": [{"topic": "cli-move"}]}))
        generated = cli("generate", "--topics-to-move-json-file", str(topics),
                        "--broker-list", "1,2,3")
        proposed = json.loads(generated.split("Proposed partition reassignment "
                                              "configuration\n")[1])
        assert sorted(proposed["partitions"][0]["replicas"]) == [1, 2, 3]
        plan = plan_file(Path(d), "cli-move", [1, 2, 3])
        out = cli("execute", "--reassignment-json-file", plan, "--throttle", "10000000")
        assert "Successfully started partition reassignment for cli-move-0" in out
        out = wait_until(lambda: (o := cli("verify", "--reassignment-json-file", plan))
                         and "is completed" in o and o, 120, "completed")
        assert "Clearing broker-level throttles on brokers 1,2,3,4" in out
        assert "No partition reassignments found." in cli("list")
    assert describe(bs, "cli-move")[:2] == ([1, 2, 3], [1, 2, 3])
    assert len(consume_all(bs, "cli-move", 100)) == 100
