"""KIP-392's preferred read replica at the wire level, Kafka 3.9 against tidelog: two clusters of
their own (3 brokers, broker i in rack-i, ``replica.selector.class`` =
Kafka's RackAwareReplicaSelector), raw Fetch requests from a consumer naming a rack. The leader
names the follower in the consumer's rack with no records (and its own offsets), nobody else is
named, the follower serves the consumer up to its HW, and the usual errors keep their order.

The partition's replicas are described by role (the leader, the follower in the consumer's rack)
since the two clusters may place the leader on different brokers."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest
from confluent_kafka import ElectionType, TopicPartition
from differential import (
    Pair,
    Target,
    address_of,
    create_ready,
    partition_metadata,
    raw,
    reassign,
)
from tidelog_clusters import running_local_cluster

from tidelog.cluster.local import ClusterError, LocalCluster
from tidelog.protocol.errors import ErrorCode
from tidelog.protocol.messages import describe_log_dirs as m_dld
from tidelog.protocol.messages import fetch as m_fetch
from tidelog.protocol.messages import list_offsets as m_lo
from tidelog.protocol.messages import produce as m_produce
from tidelog.protocol.records.batch import iter_batches
from tidelog.protocol.records.builder import Record, build_batch
from tidelog.testing.kafka_cluster import KafkaCluster, KafkaClusterError

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOPIC = "nearby"
# A broker stopped (SIGSTOP) stays registered for the session's 20 s, and in the ISR: a new
# leader's HW then stays behind (test_a_new_leader_whose_hw_has_not_caught_up).
SETTINGS = {"zookeeper.session.timeout.ms": "20000",
            "replica.selector.class": "org.apache.kafka.common.replica.RackAwareReplicaSelector"}
# Each cluster's broker id -> its process id.
PID_OF: dict[str, Callable[[int], int]] = {}
# Fixed timestamps (a minute ago): the same bytes on both clusters.
BATCH = bytes(build_batch([Record(b"a", b"k"), Record(b"b"), Record(b"c")],
                          base_timestamp=int(time.time() * 1000) - 60_000))


def rack_of(broker_id: int) -> dict[str, str]:
    return {"broker.rack": f"rack-{broker_id}"}


class RackedKafkaCluster(KafkaCluster):
    def broker_properties(self, broker_id: int, port: int, n_brokers: int,
                          overrides: Mapping[str, str]) -> dict[str, str]:
        return {**super().broker_properties(broker_id, port, n_brokers, overrides),
                **rack_of(broker_id)}


def _noop(_broker_id: int) -> None:
    raise AssertionError("this module's clusters do not restart brokers")


@pytest.fixture(scope="module")
def racked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    kafka = RackedKafkaCluster(tmp_path_factory.mktemp("kafka-racks"))
    try:
        kafka.up(3, overrides=SETTINGS)
        with running_local_cluster(tmp_path_factory.mktemp("tidelog-racks"), 3, SETTINGS,
                                   lambda broker_id, _port: rack_of(broker_id)) as tidelog:
            PID_OF["kafka"] = lambda b: kafka.brokers[b].proc.pid  # type: ignore[union-attr]
            PID_OF["tidelog"] = lambda b: tidelog.brokers[b].pid  # type: ignore[return-value]
            yield Pair(Target("kafka", kafka.bootstrap_servers, _noop, _noop),
                       Target("tidelog", tidelog.bootstrap_servers, _noop, _noop))
    finally:
        kafka.down()


def _request(rack_id: str, *, offset: int = 0, epoch: int = 0, session_epoch: int = -1,
             session_id: int = 0, topic: str = TOPIC) -> m_fetch.FetchRequest:
    """A consumer's Fetch (max_wait 0) of partition 0."""
    return m_fetch.FetchRequest(
        max_wait_ms=0, min_bytes=1, rack_id=rack_id, session_id=session_id,
        session_epoch=session_epoch,
        topics=[m_fetch.FetchTopic(topic, partitions=[m_fetch.FetchPartition(
            0, current_leader_epoch=epoch, fetch_offset=offset, partition_max_bytes=1 << 20)])])


def _describe(response: m_fetch.FetchResponse, roles: Mapping[int, str]) -> tuple[object, ...]:
    """(error, HW, LSO, log start, records from their magic byte on, the preferred read replica
    by role, whether a session was opened), or that the partition was left out."""
    if not response.responses:
        return ("not in the response", response.session_id != 0)
    p = response.responses[0].partitions[0]
    return (ErrorCode(p.error_code).name, p.high_watermark, p.last_stable_offset,
            p.log_start_offset, bytes(p.records or b"")[16:],
            roles.get(p.preferred_read_replica, p.preferred_read_replica),
            response.session_id != 0)


def _replica_hw(address: str, topic: str = TOPIC) -> int:
    """The HW a replica itself holds (Kafka's debugging replica id -2, which any replica
    answers)."""
    request = m_fetch.FetchRequest(
        replica_id=-2, max_wait_ms=0, min_bytes=0, topics=[m_fetch.FetchTopic(
            topic, partitions=[m_fetch.FetchPartition(0, fetch_offset=0, partition_max_bytes=1)])])
    p = raw(address, request, 12).responses[0].partitions[0]
    return int(p.high_watermark) if p.error_code == 0 else -1


def test_the_leader_names_the_follower_in_the_consumers_rack(racked: Pair) -> None:
    def scenario(t: Target) -> object:
        create_ready(t, TOPIC, 1, 3)
        p, brokers = partition_metadata(t, TOPIC)
        leader, near, far = p.leader, *(r for r in p.replicas if r != p.leader)
        roles = {leader: "leader", near: "the follower in the rack", far: "the other follower",
                 -1: "none"}
        at_leader, at_near = address_of(brokers, leader), address_of(brokers, near)
        _produce_replicated(brokers, leader, (near, far), TOPIC)
        rack = f"rack-{near}"

        def fetch(address: str, rack_id: str, version: int = 12, **kw: int) -> object:
            return _describe(raw(address, _request(rack_id, **kw), version), roles)

        opened = raw(at_leader, _request(rack, session_epoch=0), 12)
        return {
            "leader, the follower's rack": fetch(at_leader, rack),
            "leader, the leader's rack": fetch(at_leader, f"rack-{leader}"),
            "leader, no rack": fetch(at_leader, ""),
            "leader, a rack with no replica": fetch(at_leader, "rack-9"),
            "leader, v11": fetch(at_leader, rack, version=11),
            "leader, v10 (no rack on the wire)": fetch(at_leader, rack, version=10),
            "leader, past every replica's end": fetch(at_leader, rack, offset=10),
            "leader, future epoch": fetch(at_leader, rack, epoch=5),
            "leader, no epoch": fetch(at_leader, rack, epoch=-1),
            "leader, new session": _describe(opened, roles),
            "leader, the session's next fetch, nothing listed": fetch(
                at_leader, rack, session_id=opened.session_id, session_epoch=1),
            "follower, its rack": fetch(at_near, rack),
            "follower, at its HW": fetch(at_near, rack, offset=3),
            "follower, past its end": fetch(at_near, rack, offset=10),
            "follower, v10": fetch(at_near, rack, version=10),
        }

    got = racked.same(scenario)
    assert got["leader, the follower's rack"][0] == "NONE"
    assert got["leader, the follower's rack"][4:6] == (b"", "the follower in the rack")
    assert got["leader, the leader's rack"][4] == BATCH[16:]
    assert got["follower, its rack"][4] == BATCH[16:]


def test_a_new_leader_whose_hw_has_not_caught_up(racked: Pair) -> None:
    """A follower is stopped (SIGSTOP: still registered and in the ISR), a batch is written
    with acks=1 (the other follower copies it), and the lead moves to that other follower (its
    epoch starts at 6, its HW stays 3 while the stopped one is in the ISR). A consumer in the
    old leader's rack fetching at the new leader: Kafka 3.9 names the old leader
    (preferred_read_replica, with HW 3), and reads the 3 records below the HW for a consumer
    with no rack; tidelog answers OFFSET_NOT_AVAILABLE to both until the HW reaches the epoch
    start (its consumer_hw_guard, docs/replication.md: a consumer never sees the HW go back
    from the 6 the old leader may have shown). ListOffsets LATEST is OFFSET_NOT_AVAILABLE on
    both (KIP-207), and a Fetch with Kafka's debugging replica id reads to the HW on both."""
    topic = "fresh-leader"

    def scenario(t: Target) -> object:
        create_ready(t, topic, 1, 3)
        p, brokers = partition_metadata(t, topic)
        # The stopped follower is not the controller (it must move the lead meanwhile).
        controller = t.admin().list_topics(timeout=10).controller_id
        old = p.leader
        stopped = next(r for r in p.replicas if r not in (old, controller))
        new = next(r for r in p.replicas if r not in (old, stopped))
        roles = {old: "the old leader", new: "the new leader", stopped: "the stopped follower",
                 -1: "none"}
        at_old, at_new = address_of(brokers, old), address_of(brokers, new)
        _produce_replicated(brokers, old, (new, stopped), topic)
        deadline = time.monotonic() + 30
        pid = PID_OF[t.name](stopped)
        os.kill(pid, signal.SIGSTOP)
        try:
            _produce(at_old, topic, 1)
            while _replica_bytes(at_new, topic) < 2 * len(BATCH):
                assert time.monotonic() < deadline, "the new leader did not copy the batch"
                time.sleep(0.1)
            reassign(t, topic, [new, old, stopped])  # the preferred replica, then the lead
            admin = t.admin()  # kept referenced: a destroyed client fails its futures
            result = admin.elect_leaders(ElectionType.PREFERRED,
                                         [TopicPartition(topic, 0)]).result(30)
            assert all(e is None for e in result.values()), result
            while partition_metadata(t, topic)[0].leader != new:
                assert time.monotonic() < deadline, "the lead did not move"
                time.sleep(0.1)
            # Kafka names a replica only once it fetched from the new leader (its LEO is
            # unknown there until then): asked again, briefly, while the answer names nobody.
            seen = {}
            for label, rack in (("the old leader's rack", f"rack-{old}"), ("no rack", "")):
                while True:
                    r = raw(at_new, _request(rack, epoch=-1, topic=topic), 12)
                    seen[label] = _describe(r, roles)[:6]
                    if not rack or seen[label][::5] != ("NONE", "none") \
                            or time.monotonic() > deadline:
                        break
                    time.sleep(0.1)
            seen["ListOffsets LATEST"] = _latest(at_new, topic)
            seen["new leader's HW"] = _replica_hw(at_new, topic)
            seen["debug fetch, batches"] = _debug_batches(at_new, topic)
            return seen
        finally:
            os.kill(pid, signal.SIGCONT)

    on_kafka, on_tidelog = racked.run(scenario)
    assert on_kafka == {
        "the old leader's rack": ("NONE", 3, 3, 0, b"", "the old leader"),
        "no rack": ("NONE", 3, 3, 0, BATCH[16:], "none"),
        "ListOffsets LATEST": "OFFSET_NOT_AVAILABLE",
        "new leader's HW": 3,
        "debug fetch, batches": 1}, on_kafka
    assert on_tidelog == {
        "the old leader's rack": ("OFFSET_NOT_AVAILABLE", -1, -1, -1, b"", "none"),
        "no rack": ("OFFSET_NOT_AVAILABLE", -1, -1, -1, b"", "none"),
        "ListOffsets LATEST": "OFFSET_NOT_AVAILABLE",
        "new leader's HW": 3,
        "debug fetch, batches": 1}, on_tidelog


def _produce_replicated(brokers: Any, leader: int, followers: tuple[int, ...],
                        topic: str) -> None:
    """BATCH with acks=-1, then until both followers hold it and its HW (learnt on their next
    fetch)."""
    _produce(address_of(brokers, leader), topic, -1)
    deadline = time.monotonic() + 30
    for follower in followers:
        while _replica_hw(address_of(brokers, follower), topic) < 3:
            assert time.monotonic() < deadline, "a follower's HW did not reach 3"
            time.sleep(0.1)


def _produce(address: str, topic: str, acks: int) -> None:
    """BATCH to partition 0 at its leader, once that leader takes it."""
    request = m_produce.ProduceRequest(acks=acks, timeout_ms=10000, topic_data=[
        m_produce.TopicProduceData(topic, [m_produce.PartitionProduceData(0, BATCH)])])
    deadline = time.monotonic() + 30
    while (answer := raw(address, request, 8).responses[0].partition_responses[0]
           ).error_code in (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                            ErrorCode.NOT_LEADER_OR_FOLLOWER):
        assert time.monotonic() < deadline, "the leader did not take the batch in time"
        time.sleep(0.2)
    assert answer.error_code == 0, answer


def _debug_batches(address: str, topic: str) -> int:
    """The batches a Fetch v12 with Kafka's debugging replica id (-2) reads from offset 0:
    Kafka 3.9 reads it as a consumer's (FetchIsolation.of: up to the HW)."""
    request = m_fetch.FetchRequest(
        replica_id=-2, max_wait_ms=0, min_bytes=0, topics=[m_fetch.FetchTopic(
            topic, partitions=[m_fetch.FetchPartition(0, fetch_offset=0,
                                                      partition_max_bytes=1 << 20)])])
    p = raw(address, request, 12).responses[0].partitions[0]
    assert p.error_code == 0, p
    return sum(1 for _ in iter_batches(bytes(p.records or b"")))


def _replica_bytes(address: str, topic: str) -> int:
    """The bytes of partition 0's log on that broker (DescribeLogDirs: any replica, its LEO)."""
    r = raw(address, m_dld.DescribeLogDirsRequest(
        topics=[m_dld.DescribableLogDirTopic(topic, [0])]), 4)
    return sum(p.partition_size for d in r.results for t in d.topics if t.name == topic
               for p in t.partitions)


def _latest(address: str, topic: str) -> str:
    request = m_lo.ListOffsetsRequest(replica_id=-1, topics=[m_lo.ListOffsetsTopic(
        topic, [m_lo.ListOffsetsPartition(0, current_leader_epoch=-1, timestamp=-1)])])
    return ErrorCode(raw(address, request, 5).topics[0].partitions[0].error_code).name


def test_an_unknown_replica_selector_class_stops_the_broker_at_start_up(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """Kafka loads the class when the broker starts (CoreUtils.createObject) and exits; tidelog
    refuses the setting with the same exception's text."""
    bad = {"replica.selector.class": "com.example.NearestSelector"}
    expected = "java.lang.ClassNotFoundException: com.example.NearestSelector"
    kafka = KafkaCluster(tmp_path_factory.mktemp("kafka-bad-selector"))
    try:
        with pytest.raises(KafkaClusterError):
            kafka.up(1, overrides=bad)
        assert expected in kafka.brokers[1].log_file.read_text()
    finally:
        kafka.down()
    tidelog = LocalCluster(tmp_path_factory.mktemp("tidelog-bad-selector"), die_with_parent=True)
    try:
        with pytest.raises(ClusterError, match=expected):
            tidelog.up(1, overrides=bad, timeout_s=60)
    finally:
        tidelog.down(timeout_s=15)
