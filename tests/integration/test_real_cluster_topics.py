"""`tidelog topics ...` against the real 3-broker cluster: create (with a config override),
list, describe (Kafka's lines plus every replica's LEO, the HW and lag), delete (the controller
stops and deletes every replica, then the topic's znodes go)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from real_cluster_harness import RealCluster, produce_acked, producer, tidelog, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def test_topics_create_list_describe_delete(real_cluster: RealCluster) -> None:
    bs = real_cluster.bootstrap
    topic = "tools"
    out = tidelog("topics", "create", "--bootstrap-server", bs, "--topic", topic,
                  "--partitions", "2", "--replication-factor", "3",
                  "--config", "retention.ms=3600000").stdout
    assert out.strip() == f"Created topic {topic}."
    assert real_cluster.zk.get_topic_config(topic) == {"retention.ms": "3600000"}
    again = subprocess.run([sys.executable, "-m", "tidelog", "topics", "create",
                            "--bootstrap-server", bs, "--topic", topic, "--partitions", "1"],
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 1 and "TOPIC_ALREADY_EXISTS" in again.stderr
    tidelog("topics", "create", "--bootstrap-server", bs, "--topic", topic, "--if-not-exists")
    for p in (0, 1):
        wait_for(lambda p=p: (s := real_cluster.state(topic, p)) and len(s.isr) == 3, 30,
                 f"{topic}-{p} with a full ISR")
    assert topic in tidelog("topics", "list", "--bootstrap-server", bs).stdout.split()

    produce_acked(producer(bs), topic, [(b"k", b"v%d" % i) for i in range(40)], partition=1)

    def described() -> str | None:
        text = tidelog("topics", "describe", "--bootstrap-server", bs, "--topic", topic).stdout
        rows = [ln for ln in text.splitlines() if "Replica:" in ln]
        return text if len(rows) == 6 and all("Lag: 0" in r for r in rows) else None

    text = wait_for(described, 30, "replicas caught up")
    lines = text.splitlines()
    assert lines[0].startswith(f"Topic: {topic}\tPartitionCount: 2\tReplicationFactor: 3")
    p1 = next(ln for ln in lines if f"\tTopic: {topic}\tPartition: 1\t" in ln)
    state = real_cluster.state(topic, 1)
    assert state is not None
    assert f"Leader: {state.leader}\t" in p1
    assert f"Isr: {','.join(map(str, state.isr))}\t" in p1
    assert "HW: 40" in p1
    replica_rows = [ln for ln in lines[lines.index(p1) + 1:][:3]]
    assert all("LEO: 40" in r for r in replica_rows), replica_rows
    p0 = next(ln for ln in lines if f"\tTopic: {topic}\tPartition: 0\t" in ln)
    assert "HW: 0" in p0

    out = tidelog("topics", "delete", "--bootstrap-server", bs, "--topic", topic).stdout
    assert out.strip() == f"Deleted topic {topic}."
    # The deletion marker goes last, after the topic's znodes (Kafka's completeDeleteTopic).
    wait_for(lambda: not real_cluster.zk.topic_exists(topic)
             and real_cluster.zk.get_topic_deletions() == set(), 60,
             "the topic's znodes and deletion marker deleted")
    wait_for(lambda: topic not in tidelog("topics", "list", "--bootstrap-server", bs).stdout.split(),
             30, "the topic gone from the metadata")
    data_dirs = [Path(real_cluster.dir) / f"broker-{b}" / "data" for b in (1, 2, 3)]
    wait_for(lambda: not [p for d in data_dirs for p in d.glob(f"{topic}-[0-9]")], 30,
             "the replicas' logs deleted on every broker")
    missing = subprocess.run([sys.executable, "-m", "tidelog", "topics", "delete",
                              "--bootstrap-server", bs, "--topic", topic],
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 1 and "UNKNOWN_TOPIC_OR_PARTITION" in missing.stderr
