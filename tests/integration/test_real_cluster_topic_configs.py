"""A topic's own configuration is what its partitions enforce, with real processes (issue 11).

The brokers run with the default min.insync.replicas=1; the topic is created with
`tidelog topics create ... --replication-factor 3 --config min.insync.replicas=2`. After both
followers are killed with -9 and the ISR has shrunk to the leader alone, confluent-kafka's acks=all
sends must fail with NOT_ENOUGH_REPLICAS (19), as Apache Kafka answers, and nothing is appended;
acks=1 sends still succeed (min.insync.replicas only applies to acks=all). Once the followers are
back in the ISR, acks=all sends succeed again.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import confluent_kafka
import pytest
from real_cluster_harness import (
    RealCluster,
    produce_acked,
    producer,
    replica_leo,
    running_cluster,
    tidelog,
    wait_for,
)

from tidelog.cluster.local import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def default_min_isr_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealCluster]:
    """A 3-broker cluster whose brokers keep Kafka's default min.insync.replicas (1)."""
    d: Path = tmp_path_factory.mktemp("topic-configs")
    with running_cluster(d, {"min.insync.replicas": "1"}) as c:
        yield c


def _send(bootstrap: str, topic: str, n: int, acks: str) -> tuple[list[int], list[Any]]:
    """n sends, no retries: (offsets acknowledged, delivery errors)."""
    p = producer(bootstrap, acks=acks, retries=0, **{"message.timeout.ms": 20000})
    offsets: list[int] = []
    errors: list[Any] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(err)
        else:
            offsets.append(msg.offset())

    for i in range(n):
        p.produce(topic, value=b"v%d" % i, partition=0, on_delivery=on_delivery)
    assert p.flush(30) == 0
    return offsets, errors


def test_topic_min_insync_replicas_refuses_acks_all_when_isr_shrinks(
    default_min_isr_cluster: RealCluster,
) -> None:
    c = default_min_isr_cluster
    topic = f"minisr-{uuid.uuid4().hex[:6]}"
    tidelog("topics", "create", "--bootstrap-server", c.bootstrap, "--topic", topic,
            "--partitions", "1", "--replication-factor", "3",
            "--config", "min.insync.replicas=2")
    state = wait_for(lambda: (s := c.state(topic)) and s.leader >= 0 and len(s.isr) == 3 and s,
                     what="the topic online with a full ISR")
    leader = state.leader
    followers = [b for b in state.isr if b != leader]
    assert len(produce_acked(producer(c.bootstrap), topic, [(b"k", b"before")] * 5, 0)) == 5

    local = LocalCluster.load(c.dir)
    for b in followers:
        c.kill(b)
    wait_for(lambda: (s := c.state(topic)) and list(s.isr) == [leader], timeout_s=60,
             what=f"the ISR to shrink to [{leader}]")
    leader_port = local.brokers[leader].port
    assert replica_leo(leader_port, topic, 0) == 5

    offsets, errors = _send(c.bootstrap, topic, 5, acks="all")
    assert offsets == [], f"acks=all writes acknowledged at {offsets} with ISR [{leader}]"
    assert [e.code() for e in errors] == [confluent_kafka.KafkaError.NOT_ENOUGH_REPLICAS] * 5, \
        [str(e) for e in errors]
    assert replica_leo(leader_port, topic, 0) == 5  # refused before the append: nothing written

    # min.insync.replicas does not apply to acks=1: the partition is still writable, but
    # nothing commits on one replica (KIP-966): the leader's own row shows LEO 7, HW 5.
    offsets, errors = _send(c.bootstrap, topic, 2, acks="1")
    assert (offsets, errors) == ([5, 6], [])
    assert f"Replica: {leader}\t(leader)\tLEO: 7\tHW: 5\t" in _describe(c, topic)

    for b in followers:
        c.start(b)
    wait_for(lambda: (s := c.state(topic)) and len(s.isr) == 3, timeout_s=60,
             what="the followers back in the ISR")
    offsets, errors = _send(c.bootstrap, topic, 3, acks="all")
    assert (offsets, errors) == ([7, 8, 9], [])
    # Each replica's row shows its own HW, read from its own broker.
    wait_for(lambda: all(f"Replica: {b}\t" in row and "LEO: 10\tHW: 10\t" in row
                         for b, row in zip(sorted(state.isr), _replica_rows(c, topic),
                                           strict=False))
             and len(_replica_rows(c, topic)) == 3, timeout_s=30,
             what="every replica at LEO 10 and HW 10")


def _describe(c: RealCluster, topic: str) -> str:
    return tidelog("topics", "describe", "--bootstrap-server", c.bootstrap, "--topic", topic).stdout


def _replica_rows(c: RealCluster, topic: str) -> list[str]:
    rows = [ln for ln in _describe(c, topic).splitlines() if "Replica:" in ln]
    return sorted(rows, key=lambda r: int(r.split("Replica: ")[1].split("\t")[0]))


def test_min_insync_replicas_changed_live_with_tidelog_configs(
    default_min_isr_cluster: RealCluster,
) -> None:
    """No restart: `tidelog configs alter` (IncrementalAlterConfigs to one broker, a
    /config/changes notification to all) and the leader enforces the new value at once."""
    c = default_min_isr_cluster
    topic = f"live-{uuid.uuid4().hex[:6]}"
    tidelog("topics", "create", "--bootstrap-server", c.bootstrap, "--topic", topic,
            "--partitions", "1", "--replication-factor", "3")
    state = wait_for(lambda: (s := c.state(topic)) and s.leader >= 0 and len(s.isr) == 3 and s,
                     what="the topic online with a full ISR")
    followers = [b for b in state.isr if b != state.leader]
    for b in followers:
        c.kill(b)
    wait_for(lambda: (s := c.state(topic)) and list(s.isr) == [state.leader], timeout_s=60,
             what="the ISR shrunk to the leader")
    assert _send(c.bootstrap, topic, 2, acks="all") == ([0, 1], [])  # the broker default: 1

    out = tidelog("configs", "alter", "--bootstrap-server", c.bootstrap, "--topic", topic,
                  "--add-config", "min.insync.replicas=2,retention.ms=3600000").stdout
    assert out.strip() == f"Completed updating config for topic {topic}."
    described = tidelog("configs", "describe", "--bootstrap-server", c.bootstrap,
                        "--topic", topic).stdout
    assert "  min.insync.replicas=2 sensitive=false synonyms={DYNAMIC_TOPIC_CONFIG:" in described

    def refused() -> bool:
        offsets, errors = _send(c.bootstrap, topic, 1, acks="all")
        assert offsets == [] or errors == []
        return [e.code() for e in errors] == [confluent_kafka.KafkaError.NOT_ENOUGH_REPLICAS]

    wait_for(refused, timeout_s=30, what="the leader refusing acks=all after the change")
    tidelog("configs", "alter", "--bootstrap-server", c.bootstrap, "--topic", topic,
            "--delete-config", "min.insync.replicas")
    wait_for(lambda: _send(c.bootstrap, topic, 1, acks="all")[1] == [], timeout_s=30,
             what="acks=all accepted again once the override is gone")
    for b in followers:
        c.start(b)
