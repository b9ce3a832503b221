"""The maximal-ISR rule with real processes (correctness.md, marked P).

While an ISR expansion is being written to ZooKeeper, the leader must compute the high
watermark over the current and the proposed members. Counterexample without it: ISR [1,2], the
leader starts adding 3; the HW advances on [1,2] while 3 has nothing; the write lands ISR
[1,2,3]; 1 and 2 die; 3 is elected; the acknowledged records are lost.

The leader (broker 1) proposes the expansion to the controller (AlterPartition, KIP-497), which
writes it to ZooKeeper: every broker's ZooKeeper connection goes through a proxy, and the
controller's write `"isr":[1,2,3]` is held in flight (the leader's proposal stays pending until
it lands and the answer comes back), while a frame-aware proxy on broker 1's replication
listener starves broker 3 of data; records produced meanwhile must not be acknowledged, and
after 1 and 2 are killed and 3 leads, every acknowledged record is there.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

import pytest
from frame_proxy import FrameProxy, HoldProxy, ProxiedRequest, replication_listener
from real_cluster_harness import (
    assert_replicas_agree,
    high_watermark,
    producer,
    read_through_last_acked,
    replica_leo,
    wait_for,
)

from tidelog.cluster.local import LocalCluster, _pid_runs
from tidelog.cluster.zookeeper import pick_free_port
from tidelog.controller.admin import AdminZkClient
from tidelog.controller.zk_client import KafkaZkClient
from tidelog.protocol.api_keys import ApiKey

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TOPIC = "maxisr"
SETTINGS = {
    # The leader's ZooKeeper traffic is held for a few seconds: its session (and kazoo's ping
    # deadline, 2/3 of it) must outlast that even on a loaded machine.
    "zookeeper.session.timeout.ms": "15000",
    "replica.socket.timeout.ms": "3000",
    "replica.lag.time.max.ms": "2000",
    "auto.leader.rebalance.enable": "false",
}


def starve(broker_id: int) -> Any:
    prefix = f"broker-{broker_id}-"

    def rule(req: ProxiedRequest) -> bool:
        return req.api_key == ApiKey.FETCH and bool(req.client_id) and \
            req.client_id.startswith(prefix)  # type: ignore[union-attr]
    return rule


def answered_fetch_past(proxy: FrameProxy, broker_id: int, offset: int) -> threading.Event:
    """Set once the leader has answered, through `proxy`, a fetch of `broker_id` for partition
    0 (of the one topic) from `offset` or beyond: the leader took that follower's position, and
    its HW with it, into account before answering. Install it before the follower gets there:
    in an incremental fetch session (KIP-227) only the first fetch from a new offset lists the
    partition."""
    answered = threading.Event()
    prefix = f"broker-{broker_id}-"

    def watch(req: ProxiedRequest, _frame: bytes) -> None:
        if req.api_key == ApiKey.FETCH and req.body is not None and \
                (req.client_id or "").startswith(prefix) and \
                any(p.partition == 0 and p.fetch_offset >= offset
                    for t in req.body.topics for p in t.partitions):
            answered.set()

    proxy.on_response = watch
    return answered


def test_hw_waits_for_a_replica_being_added_to_the_isr(tmp_path: Path) -> None:
    proxies: dict[int, FrameProxy] = {}
    cluster = LocalCluster(tmp_path / "maxisr")
    zk_hold: dict[int, HoldProxy] = {}

    def overrides(broker_id: int, client_port: int) -> dict[str, str]:
        real = pick_free_port()
        proxies[broker_id] = FrameProxy(real).start()
        out = replication_listener(proxies[broker_id], real, client_port)
        # Whichever broker is the controller, its ZooKeeper writes go through a hold proxy.
        zk_port = int(cluster.zookeeper.rsplit(":", 1)[1])
        zk_hold[broker_id] = HoldProxy(zk_port).start()
        out["zookeeper.connect"] = f"127.0.0.1:{zk_hold[broker_id].port}"
        return out

    zk: KafkaZkClient | None = None
    try:
        cluster.up(3, SETTINGS, broker_overrides=overrides)
        to_1 = proxies[1]
        zk = KafkaZkClient(cluster.zookeeper).start(create_top_level_paths=False)

        def state() -> Any:
            return zk.get_partition_state((TOPIC, 0))  # type: ignore[union-attr]

        AdminZkClient(zk).create_topic(TOPIC, 0, 0, {"min.insync.replicas": "2"},
                                       replica_assignment={0: [1, 2, 3]})
        wait_for(lambda: (s := state()) and s.leader == 1 and s.isr == (1, 2, 3), 30,
                 "1 leads with ISR [1,2,3]")

        acked: list[tuple[int, bytes]] = []
        lock = threading.Lock()
        p = producer(cluster.bootstrap_servers, **{"linger.ms": 0, "message.timeout.ms": 20000})

        def on_delivery(err: Any, msg: Any) -> None:
            if err is None:
                with lock:
                    acked.append((msg.offset(), msg.value()))

        def send(prefix: bytes, n: int, via: Any = p) -> None:
            for i in range(n):
                via.produce(TOPIC, value=b"%s-%d" % (prefix, i), partition=0,
                            on_delivery=on_delivery)
            via.poll(0)

        send(b"first", 20)
        assert p.flush(30) == 0 and len(acked) == 20

        # 3 falls behind and leaves the ISR (the leader shrinks it after the lag time).
        to_1.drop_responses = starve(3)
        wait_for(lambda: (s := state()) and s.isr == (1, 2), 30, "ISR [1,2]")
        send(b"second", 20)
        assert p.flush(30) == 0 and len(acked) == 40

        # 3 may fetch again: it catches up and the leader proposes ISR [1,2,3] to the
        # controller; the controller's write is held on its way to ZooKeeper.
        for h in zk_hold.values():
            h.arm(b'"isr":[1,2,3]')
        to_1.drop_responses = None
        to_1.cut_connections()
        wait_for(lambda: any(h.holding.is_set() for h in zk_hold.values()), 30,
                 "the controller writing the ISR [1,2,3] the leader proposed")
        # 3 gets nothing more from now on; records produced now are on 1 and 2 only.
        to_1.drop_responses = starve(3)
        before = len(acked)
        # The ten go in one produce request (sent when the tenth is queued): a connection's
        # requests are handled one at a time (Kafka mutes the channel), so a second request
        # would wait behind the first, whose acks=all answer waits for 3, and never reach the
        # leader. (Sent at linger.ms=0, a loaded machine split them 9 + 1: both clean-clone
        # failures, "broker 2's LEO went [49]", and the leader's LEO was 49 too.)
        one_request = producer(cluster.bootstrap_servers, **{
            "linger.ms": 10000, "batch.num.messages": 10, "message.timeout.ms": 20000})
        past = answered_fetch_past(to_1, 2, 50)
        send(b"during", 10, via=one_request)
        # They reach 2, and 2 fetches past them: the leader knows 2 has them all, so over ISR
        # [1,2] alone its HW would be 50 and the records acknowledged.
        two = cluster.brokers[2].port
        wait_for(lambda: (replica_leo(two, TOPIC, 0) or 0) >= 50, 60, "broker 2 has the records")
        assert past.wait(30), "broker 2 never fetched past the records"
        to_1.on_response = None
        hw = high_watermark(cluster.brokers[1].port, TOPIC, 0)
        assert hw == before == 40, f"HW {hw} with 3, being added, at 40"
        p.poll(0)
        one_request.poll(0)
        with lock:
            during = len(acked) - before
        assert during == 0, f"{during} records acknowledged without the replica being added"
        for h in zk_hold.values():
            h.release()
        wait_for(lambda: (s := state()) and s.isr == (1, 2, 3), 30, "ISR [1,2,3] written")

        # 1 and 2 die; 3 is the only one left in the ISR: it leads.
        cluster.stop_broker(1, kill=True)
        cluster.stop_broker(2, kill=True)
        wait_for(lambda: (s := state()) and s.leader == 3, 60, "3 elected")
        p.flush(30)
        one_request.flush(30)
        three = f"127.0.0.1:{cluster.brokers[3].port}"
        got = read_through_last_acked(three, TOPIC, acked, timeout_s=30)
        by_offset = {o: v for _k, v, o in got}
        lost = [(o, v) for o, v in acked if by_offset.get(o) != v]
        assert not lost, f"acknowledged records lost: {lost[:5]}"
        # The simulator's end-of-run replica checks, on these processes' logs.
        assert_replicas_agree(cluster, TOPIC, zk=zk)
    finally:
        if zk is not None:
            zk.close()
        for h in zk_hold.values():
            h.release()
        if (cluster.dir / "cluster.json").exists():
            cluster.down(timeout_s=10)
        for b in cluster.brokers.values():  # backstop, by PID, only if still that broker
            if _pid_runs(b.pid, b.config):
                os.kill(b.pid, signal.SIGKILL)  # type: ignore[arg-type]
        for proxy in proxies.values():
            proxy.stop()
        for h in zk_hold.values():
            h.stop()
