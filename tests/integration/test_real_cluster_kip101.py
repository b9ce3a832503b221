"""KIP-101 with real processes (correctness.md, marked P): truncating to a stale high watermark
loses acknowledged data.

RF=2, leader B (broker 1), follower A (broker 2), min.insync.replicas=1, acks=all. m1 commits.
m2: A fetches it; A's next fetch lets B advance the HW to 2 and acknowledge m2, but B's reply
(carrying HW=2) to A is lost (a frame-aware proxy on B's replication listener drops it), so A's
HW stays 1. A is killed with -9 and restarted while it still cannot hear from B. It must not
truncate to its HW (1): it asks B for OffsetsForLeaderEpoch and, until it gets an answer,
truncates nothing. Once the network heals A rejoins the ISR; B is killed; A leads with m2.
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from frame_proxy import FrameProxy, ProxiedRequest
from real_cluster_harness import (
    assert_replicas_agree,
    consume_all,
    producer,
    replica_leo,
    wait_for,
)

from tidelog.cluster.local import LocalCluster, _pid_runs
from tidelog.cluster.zookeeper import pick_free_port
from tidelog.controller.admin import AdminZkClient
from tidelog.controller.zk_client import KafkaZkClient
from tidelog.protocol.api_keys import ApiKey
from tidelog.storage.checkpoint import REPLICATION_OFFSET_CHECKPOINT, OffsetCheckpointFile
from tidelog.storage.file_io import OsFileIO

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TOPIC = "kip101"
SETTINGS = {
    "zookeeper.session.timeout.ms": "6000",
    "replica.socket.timeout.ms": "3000",
    "replica.lag.time.max.ms": "10000",
    "replica.high.watermark.checkpoint.interval.ms": "300",
    "auto.leader.rebalance.enable": "false",
    "unclean.leader.election.enable": "false",
}


def fetch_at_or_past(offset: int, topic_id: Any) -> Any:
    """A replica Fetch of TOPIC at ``offset`` or later (v13+ name it by ``topic_id``)."""
    def rule(req: ProxiedRequest) -> bool:
        if req.api_key != ApiKey.FETCH or req.body is None:
            return False
        return any((t.topic == TOPIC or t.topic_id == topic_id) and p.fetch_offset >= offset
                   for t in req.body.topics for p in t.partitions)
    return rule


def replication_silenced(req: ProxiedRequest) -> bool:
    return req.api_key in (ApiKey.FETCH, ApiKey.OFFSET_FOR_LEADER_EPOCH)


def checkpointed_hw(log_dir: str) -> int | None:
    """The partition's HW in a broker's `replication-offset-checkpoint` file."""
    try:
        hws = OffsetCheckpointFile.in_dir(OsFileIO(), log_dir, REPLICATION_OFFSET_CHECKPOINT).read()
    except Exception:  # noqa: BLE001 - not written yet
        return None
    return hws.get((TOPIC, 0))


def test_follower_restart_does_not_truncate_to_a_stale_high_watermark(tmp_path: Path) -> None:
    proxies: dict[int, FrameProxy] = {}

    def with_replication_proxy(broker_id: int, client_port: int) -> dict[str, str]:
        real = pick_free_port()
        proxies[broker_id] = FrameProxy(real).start()
        return {
            "listeners": f"PLAINTEXT://127.0.0.1:{client_port},REPLICATION://127.0.0.1:{real}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{client_port},"
                                    f"REPLICATION://127.0.0.1:{proxies[broker_id].port}",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,REPLICATION:PLAINTEXT",
            "inter.broker.listener.name": "REPLICATION",
        }

    cluster = LocalCluster(tmp_path / "kip101")
    zk: KafkaZkClient | None = None
    try:
        cluster.up(2, SETTINGS, broker_overrides=with_replication_proxy)
        zk = KafkaZkClient(cluster.zookeeper).start(create_top_level_paths=False)
        AdminZkClient(zk).create_topic(TOPIC, 0, 0, {"min.insync.replicas": "1"},
                                       replica_assignment={0: [1, 2]})
        wait_for(lambda: (s := zk.get_partition_state((TOPIC, 0))) and s.leader == 1
                 and s.isr == (1, 2), 30, "B leads with ISR [B, A]")
        a_port, b_port = cluster.brokers[2].port, cluster.brokers[1].port
        to_b = proxies[1]  # A's fetches from B go through B's replication proxy

        p = producer(cluster.bootstrap_servers, **{"linger.ms": 0})
        acked: list[tuple[int, bytes]] = []

        def on_delivery(err: Any, msg: Any) -> None:
            assert err is None, err
            acked.append((msg.offset(), msg.value()))

        p.produce(TOPIC, value=b"m1", partition=0, on_delivery=on_delivery)
        assert p.flush(30) == 0 and acked == [(0, b"m1")]
        wait_for(lambda: replica_leo(a_port, TOPIC, 0) == 1, 30, "A has m1")

        # From now on B's answers to A's fetches at offset >= 2 are lost on the way.
        to_b.drop_responses = fetch_at_or_past(2, zk.get_topic_id(TOPIC))
        p.produce(TOPIC, value=b"m2", partition=0, on_delivery=on_delivery)
        assert p.flush(30) == 0 and acked == [(0, b"m1"), (1, b"m2")]  # m2 is acknowledged
        assert replica_leo(a_port, TOPIC, 0) == 2  # A has m2, but believes HW = 1
        wait_for(lambda: to_b.dropped, 10, "B's reply carrying HW=2 dropped")
        wait_for(lambda: checkpointed_hw(cluster.brokers[2].log_dir) == 1, 30,
                 "A's HW checkpoint (every 300 ms) holding 1")

        # A crashes and comes back while it cannot hear from B at all.
        to_b.drop_responses = replication_silenced
        cluster.stop_broker(2, kill=True)
        silenced_before = len(to_b.dropped)
        cluster.start_broker(2, timeout_s=60)

        def most_asked() -> int:
            kinds = Counter(r.api_key for r in to_b.dropped[silenced_before:]
                            if r.client_id and r.client_id.startswith("broker-2"))
            return max(kinds.values(), default=0)

        # A asks again only once its first request failed (one of a kind in flight, timed out
        # after replica.socket.timeout.ms): it has started as a follower and handled a failure.
        wait_for(lambda: most_asked() >= 2, 30, "the restarted A asking B twice, unanswered")
        assert replica_leo(a_port, TOPIC, 0) == 2  # B unreachable: A truncates nothing

        # The network heals: A catches up and rejoins the ISR.
        to_b.drop_responses = None
        to_b.cut_connections()
        wait_for(lambda: (s := zk.get_partition_state((TOPIC, 0))) and s.isr == (1, 2), 60,
                 "A back in the ISR")
        assert replica_leo(b_port, TOPIC, 0) == replica_leo(a_port, TOPIC, 0) == 2

        # B dies; A, in the ISR, leads and still has m2.
        cluster.stop_broker(1, kill=True)
        wait_for(lambda: (s := zk.get_partition_state((TOPIC, 0))) and s.leader == 2, 60,
                 "A elected")
        a_only = f"127.0.0.1:{a_port}"
        got = consume_all(a_only, TOPIC, 1, 2, timeout_s=60)[0]
        assert [(o, v) for _k, v, o in got] == acked
        # The simulator's end-of-run replica checks, on these processes' logs.
        assert_replicas_agree(cluster, TOPIC, zk=zk)
    finally:
        if zk is not None:
            zk.close()
        if (cluster.dir / "cluster.json").exists():
            cluster.down(timeout_s=10)
        for b in cluster.brokers.values():  # backstop, by PID, only if still that broker
            if _pid_runs(b.pid, b.config):
                os.kill(b.pid, signal.SIGKILL)  # type: ignore[arg-type]
        for proxy in proxies.values():
            proxy.stop()
