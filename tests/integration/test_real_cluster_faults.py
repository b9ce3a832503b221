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

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from real_cluster_harness import (
    RealCluster,
    assert_replicas_agree,
    consume_all,
    produce_acked,
    producer,
    read_through_last_acked,
    tidelog,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def test_confluent_kafka_acks_all_rf3_round_trip(real_cluster: RealCluster) -> None:
    topic = "rt"
    real_cluster.create_topic(topic, partitions=3)
    values = [(f"k{i}".encode(), bytes([i % 256]) * (1 + (i * 37) % 3000)) for i in range(600)]
    p = producer(real_cluster.bootstrap, **{"compression.type": "lz4"})
    acked = produce_acked(p, topic, values)
    assert len(acked) == len(values)
    got = consume_all(real_cluster.bootstrap, topic, 3, len(values))
    sent_by_partition: dict[int, list[bytes]] = {}
    for part, _off, value in sorted(acked, key=lambda a: (a[0], a[1])):
        sent_by_partition.setdefault(part, []).append(value)
    for part in range(3):
        assert [v for _k, v, _o in got[part]] == sent_by_partition.get(part, [])
        assert [o for _k, _v, o in got[part]] == list(range(len(got[part])))
    # Every replica caught up: describe shows full ISRs and no lag.
    def caught_up() -> bool:
        out = tidelog("topics", "describe", "--bootstrap-server", real_cluster.bootstrap,
                      "--topic", topic).stdout
        rows = [ln for ln in out.splitlines() if "Replica:" in ln]
        return len(rows) == 9 and all("Lag: 0" in ln for ln in rows)

    wait_for(caught_up, 30, "every replica's LEO at the leader's")


def test_follower_kill9_isr_shrinks_then_it_rejoins(real_cluster: RealCluster) -> None:
    topic = "follower"
    real_cluster.create_topic(topic)
    before = real_cluster.state(topic)
    assert before is not None
    # Not the controller: the leader's ISR change goes to the controller as AlterPartition
    # (KIP-497), and a killed controller's successor would first take its replicas offline
    # (a new leader epoch), as Kafka's does at failover.
    controller = real_cluster.zk.get_controller_id()
    follower = next(b for b in before.isr if b not in (before.leader, controller))
    p = producer(real_cluster.bootstrap)
    produce_acked(p, topic, [(b"a", b"before-%d" % i) for i in range(50)])
    real_cluster.kill(follower)
    # The leader drops it after replica.lag.time.max.ms (its ISR update keeps the leader epoch;
    # the controller's, after the ZooKeeper session expired, would bump it).
    shrunk = wait_for(lambda: (s := real_cluster.state(topic)) and follower not in s.isr and s,
                      timeout_s=30, what="ISR without the killed follower")
    assert shrunk.leader == before.leader
    assert shrunk.leader_epoch == before.leader_epoch
    assert len(shrunk.isr) == 2
    # min.insync.replicas=2 still holds: acks=all writes are acknowledged.
    acked = produce_acked(p, topic, [(b"b", b"during-%d" % i) for i in range(100)])
    assert len(acked) == 100
    real_cluster.start(follower)
    wait_for(lambda: (s := real_cluster.state(topic)) and follower in s.isr, timeout_s=60,
             what="the restarted follower back in the ISR")
    got = consume_all(real_cluster.bootstrap, topic, 1, 150)
    assert [v for _k, v, _o in got[0]] == [b"before-%d" % i for i in range(50)] + [
        b"during-%d" % i for i in range(100)]
    # its log caught up with the leader's
    def lag_zero() -> bool:
        out = tidelog("topics", "describe", "--bootstrap-server", real_cluster.bootstrap,
                      "--topic", topic).stdout
        row = next((ln for ln in out.splitlines() if f"Replica: {follower}\t" in ln), "")
        return "LEO: 150" in row and "Lag: 0" in row

    wait_for(lag_zero, 30, "the follower's LEO at 150")
    assert_replicas_agree(real_cluster, topic)


def test_leader_kill9_during_acks_all_stream_loses_no_acked_write(real_cluster: RealCluster) -> None:
    topic = "leader"
    real_cluster.create_topic(topic)
    first = real_cluster.state(topic)
    assert first is not None
    old_leader = first.leader

    # Watch the partition state: every (leader epoch -> leader) ever seen.
    epochs: dict[int, set[int]] = {}
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            s = real_cluster.state(topic)
            if s is not None and s.leader >= 0:
                epochs.setdefault(s.leader_epoch, set()).add(s.leader)
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()

    acked: list[tuple[int, bytes]] = []
    failed: list[str] = []
    p = producer(real_cluster.bootstrap)

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
        real_cluster.kill(old_leader)
        t_kill = len(acked)
        new = wait_for(lambda: (s := real_cluster.state(topic)) and s.leader not in (-1, old_leader)
                       and s, timeout_s=60, what="a new leader")
        assert new.leader in first.isr
        assert new.leader_epoch > first.leader_epoch
        n = produce_until(lambda: len(acked) >= t_kill + 300, n, 90)
        assert p.flush(60) == 0
    finally:
        stop.set()
        watcher.join(5)
    assert len(acked) >= t_kill + 300, f"only {len(acked)} acked; errors: {failed[:3]}"

    got = read_through_last_acked(real_cluster.bootstrap, topic, acked)
    consumed = {v for _k, v, _o in got}
    lost = [v for _o, v in acked if v not in consumed]
    assert not lost, f"{len(lost)} acknowledged records lost, e.g. {lost[:5]}"
    by_offset = {o: v for _k, v, o in got}
    assert all(by_offset.get(o) == v for o, v in acked), "an acked offset holds another record"
    assert all(len(leaders) == 1 for leaders in epochs.values()), epochs

    real_cluster.start(old_leader)
    wait_for(lambda: (s := real_cluster.state(topic)) and old_leader in s.isr, timeout_s=60,
             what="the old leader back in the ISR")
    assert_replicas_agree(real_cluster, topic)
