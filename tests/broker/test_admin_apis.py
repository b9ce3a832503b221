"""Issue 14's admin APIs on a 3-broker cluster with the real controller, through confluent-kafka's
AdminClient where it has the call and raw requests otherwise; each refusal carries Kafka's error
code and changes nothing."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import BrokerThread, broker_props, send, wait_until
from zk_chroot import new_chroot

from tidelog.broker.replica_manager import now_ms
from tidelog.controller.controller import KafkaController
from tidelog.controller.zk_client import KafkaZkClient
from tidelog.coordinator.offsets import GROUP_METADATA_TOPIC_NAME, load_partition
from tidelog.protocol.api_keys import ApiKey
from tidelog.protocol.errors import ErrorCode
from tidelog.protocol.messages import create_partitions as m_cp
from tidelog.protocol.messages import delete_records as m_dr
from tidelog.protocol.messages import describe_cluster as m_dcl
from tidelog.protocol.messages import describe_log_dirs as m_dld
from tidelog.protocol.messages import describe_producers as m_dp
from tidelog.protocol.messages import elect_leaders as m_el
from tidelog.protocol.messages import find_coordinator as m_fc
from tidelog.protocol.messages import offset_delete as m_od
from tidelog.replication.types import TopicPartition

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic  # noqa: E402

pytestmark = pytest.mark.integration


class Cluster:
    def __init__(self, zk_connect: str, brokers: list[BrokerThread]) -> None:
        self.zk_connect = zk_connect
        self.brokers = {b.broker_id: b for b in brokers}
        self.zk = KafkaZkClient(zk_connect).start(create_top_level_paths=False)
        self.bootstrap = ",".join(b.bootstrap for b in brokers)
        self.admin = AdminClient({"bootstrap.servers": self.bootstrap})

    def create_topic(self, topic: str, partitions: int, rf: int = 3) -> None:
        self.admin.create_topics([NewTopic(topic, partitions, rf)],
                                 operation_timeout=20)[topic].result(30)

    def leaders_everywhere(self, topic: str, count: int) -> bool:
        for b in self.brokers.values():
            parts = b.call(lambda b=b: b.server.metadata_cache.topic_partitions(topic))
            if sorted(parts) != list(range(count)) or any(p.leader < 0 for p in parts.values()):
                return False
        return True

    def stop(self, broker_id: int) -> None:
        self.brokers.pop(broker_id).stop()

    def restart(self, broker_id: int, props: dict[str, str]) -> None:
        self.brokers[broker_id] = BrokerThread(props, controller_factory=KafkaController).start()
        wait_until(lambda: all(
            broker_id in b.call(lambda b=b: b.server.metadata_cache.alive_broker_ids())
            for b in self.brokers.values()), what=f"broker {broker_id} known to all")
        # Clients bootstrapped from the brokers running now (a restarted one has a new port).
        self.bootstrap = ",".join(b.bootstrap for b in self.brokers.values())
        self.wait_for_controller_known()
        self.admin = AdminClient({"bootstrap.servers": self.bootstrap})

    def wait_for_controller_known(self) -> None:
        """A barrier before a new AdminClient: librdkafka looks the controller up in its first
        metadata answers only, and one naming none (controller -1 until the controller's first
        UpdateMetadata reached that broker) or an old one leaves its controller requests
        waiting past their timeout (test_real_clients.py); so every broker it may ask first
        must name the active controller."""
        def known() -> bool:
            active = next((b.broker_id for b in self.brokers.values()
                           if b.server.controller.is_active), None)
            return active is not None and all(
                b.call(lambda b=b: b.server.metadata_cache.controller_id) == active
                for b in self.brokers.values())

        wait_until(known, timeout_s=60, what="every broker's metadata to name the controller")

    def state(self, topic: str, partition: int = 0) -> Any:
        return self.zk.get_partition_state((topic, partition))

    def leader(self, topic: str, partition: int = 0) -> BrokerThread:
        state = self.zk.get_partition_state((topic, partition))
        assert state is not None
        return self.brokers[state.leader]

    def log_start_offsets(self, topic: str, partition: int = 0) -> dict[int, int]:
        out = {}
        for b in self.brokers.values():
            p = b.partition(topic, partition)
            if p is not None:
                out[b.broker_id] = p.log_start_offset
        return out

    def produce(self, topic: str, n: int, partition: int = 0) -> None:
        producer = confluent_kafka.Producer({"bootstrap.servers": self.bootstrap, "acks": "all"})
        for i in range(n):
            producer.produce(topic, f"r{i}".encode(), partition=partition)
        assert producer.flush(20) == 0

    def active(self) -> BrokerThread:
        """The broker whose controller is active."""
        return wait_until(lambda: next((b for b in self.brokers.values()
                                        if b.server.controller.is_active), None),
                          what="an active controller")

    def controller(self) -> KafkaController:
        return next(b.server.controller for b in self.brokers.values()
                    if b.server.controller.is_active)

    def settle(self) -> None:
        """A barrier: the controller has handled every ZooKeeper change seen so far."""
        active = wait_until(lambda: next((b for b in self.brokers.values()
                                          if b.server.controller.is_active), None),
                            what="an active controller")
        active.run(active.server.controller.wait_idle())


@pytest.fixture(scope="module")
def cluster(zookeeper: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    zk = new_chroot(zookeeper)
    brokers: list[BrokerThread] = []
    try:
        for i in (1, 2, 3):
            brokers.append(BrokerThread(
                broker_props(i, zk, tmp_path_factory.mktemp(f"admin{i}"),
                             **{"auto.leader.rebalance.enable": "false",
                                "offsets.topic.num.partitions": "3",
                                "replica.lag.time.max.ms": "1000",
                                "group.initial.rebalance.delay.ms": "0"}),
                controller_factory=KafkaController).start())
        c = Cluster(zk, brokers)
        wait_until(lambda: any(b.server.controller.is_active for b in brokers),
                   what="a controller")
        wait_until(lambda: all(len(b.server.metadata_cache.brokers) == 3 for b in brokers),
                   what="every broker knows the three")
        yield c
        del c.admin
        c.zk.close()
        brokers.extend(c.brokers.values())  # restarted ones too
    finally:
        for b in brokers:
            b.stop()


def _error_code(future: Any) -> int:
    with pytest.raises(confluent_kafka.KafkaException) as e:
        future.result(30)
    return int(e.value.args[0].code())


# ---------------------------------------------------------------------- CreatePartitions
def test_create_partitions_grows_the_topic_keeping_its_id(cluster: Cluster) -> None:
    cluster.create_topic("grow", 2)
    topic_id = cluster.zk.get_topic_id("grow")
    before = cluster.zk.get_topic_assignment("grow")
    cluster.admin.create_partitions([NewPartitions("grow", 5)],
                                    operation_timeout=20)["grow"].result(30)
    after = cluster.zk.get_topic_assignment("grow")
    assert after is not None and sorted(after) == [0, 1, 2, 3, 4]
    assert {p: after[p] for p in (0, 1)} == before  # the old partitions untouched
    assert all(len(set(after[p])) == 3 for p in (2, 3, 4))
    assert cluster.zk.get_topic_id("grow") == topic_id
    # The controller created the new partitions: a leader in the answering broker's metadata
    # at once (the answer waited for it), in every broker's soon after, and a partition state
    # in ZooKeeper with the full ISR.
    active = cluster.active()
    parts = active.call(lambda: active.server.metadata_cache.topic_partitions("grow"))
    assert sorted(parts) == [0, 1, 2, 3, 4] and all(p.leader >= 0 for p in parts.values())
    wait_until(lambda: cluster.leaders_everywhere("grow", 5), what="every broker's metadata")
    for p in (2, 3, 4):
        state = cluster.zk.get_partition_state(("grow", p))
        assert state is not None and state.leader == after[p][0]
        assert sorted(state.isr) == sorted(after[p])
    # Records go to a new partition and come back.
    producer = confluent_kafka.Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
    producer.produce("grow", b"to-4", partition=4)
    assert producer.flush(20) == 0
    consumer = confluent_kafka.Consumer({"bootstrap.servers": cluster.bootstrap,
                                         "group.id": "grow-reader"})
    consumer.assign([confluent_kafka.TopicPartition("grow", 4, 0)])
    try:
        msg = None
        deadline = time.monotonic() + 20
        while msg is None and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
        assert msg is not None and msg.error() is None and msg.value() == b"to-4"
    finally:
        consumer.close()


def test_create_partitions_with_an_explicit_assignment(cluster: Cluster) -> None:
    cluster.create_topic("placed", 1, rf=2)
    cluster.admin.create_partitions([NewPartitions("placed", 3, [[3, 1], [2, 3]])],
                                    operation_timeout=20)["placed"].result(30)
    after = cluster.zk.get_topic_assignment("placed")
    assert after is not None and after[1] == [3, 1] and after[2] == [2, 3]
    state = cluster.zk.get_partition_state(("placed", 1))
    assert state is not None and state.leader == 3


def test_validate_only_writes_nothing(cluster: Cluster) -> None:
    cluster.create_topic("dry", 2)
    before = cluster.zk.get_topic_assignment("dry")
    cluster.admin.create_partitions([NewPartitions("dry", 4)], validate_only=True,
                                    operation_timeout=20)["dry"].result(30)
    cluster.settle()
    assert cluster.zk.get_topic_assignment("dry") == before
    assert cluster.leaders_everywhere("dry", 2)


@pytest.mark.parametrize(
    ("count", "assignment", "code", "message"),
    [
        (2, None, ErrorCode.INVALID_PARTITIONS, "Topic already has 2 partitions."),
        (1, None, ErrorCode.INVALID_PARTITIONS,
         "Topic currently has 2 partitions, which is higher than the requested 1."),
        (3, [[1, 9]], ErrorCode.INVALID_REPLICA_ASSIGNMENT,
         "Unknown broker(s) in replica assignment: 9."),
        (3, [[1, 1]], ErrorCode.INVALID_REPLICA_ASSIGNMENT,
         "Duplicate brokers not allowed in replica assignment: 1, 1 for partition id 2."),
        (3, [[1]], ErrorCode.INVALID_REPLICA_ASSIGNMENT,
         "Inconsistent replication factor between partitions, partition 0 has 2 while"
         " partitions [2] have replication factors [1], respectively."),
        (4, [[1, 2]], ErrorCode.INVALID_REPLICA_ASSIGNMENT,
         "Increasing the number of partitions by 2 but 1 assignments provided."),
        (3, [[]], ErrorCode.INVALID_REPLICA_ASSIGNMENT,
         "Cannot have replication factor of 0 for partition id 2."),
    ],
)
def test_create_partitions_refusals_change_nothing(
        cluster: Cluster, count: int, assignment: list[list[int]] | None, code: int,
        message: str) -> None:
    topic = f"bad-{count}-{len(assignment or [])}-{code}-{abs(hash(message)) % 1000}"
    cluster.create_topic(topic, 2, rf=2)
    before = cluster.zk.get_topic_assignment(topic)
    broker = cluster.active()
    assignments = (None if assignment is None
                   else [m_cp.CreatePartitionsAssignment(a) for a in assignment])
    resp = send(broker.port, m_cp.CreatePartitionsRequest(
        topics=[m_cp.CreatePartitionsTopic(topic, count, assignments)], timeout_ms=5000))
    (result,) = resp.results
    assert (result.error_code, result.error_message) == (code, message)
    cluster.settle()
    assert cluster.zk.get_topic_assignment(topic) == before


def test_create_partitions_of_an_unknown_topic_or_twice_in_a_request(cluster: Cluster) -> None:
    assert _error_code(cluster.admin.create_partitions(
        [NewPartitions("nowhere", 3)], operation_timeout=10)["nowhere"]) == \
        confluent_kafka.KafkaError.UNKNOWN_TOPIC_OR_PART
    assert not cluster.zk.topic_exists("nowhere")
    cluster.create_topic("twice", 1)
    broker = cluster.active()
    resp = send(broker.port, m_cp.CreatePartitionsRequest(
        topics=[m_cp.CreatePartitionsTopic("twice", 2, None),
                m_cp.CreatePartitionsTopic("twice", 3, None)], timeout_ms=5000))
    assert [(r.name, r.error_code, r.error_message) for r in resp.results] == [
        ("twice", ErrorCode.INVALID_REQUEST, "Duplicate topic in request.")]
    assert sorted(cluster.zk.get_topic_assignment("twice") or {}) == [0]


def test_a_recreated_topic_grows_through_a_new_watch(cluster: Cluster) -> None:
    cluster.create_topic("again", 1)
    cluster.settle()
    assert cluster.active().call(lambda: "again" in cluster.controller()._partition_watches)
    cluster.admin.delete_topics(["again"], operation_timeout=20)["again"].result(30)
    wait_until(lambda: not cluster.zk.topic_exists("again"), what="the topic deleted")
    cluster.settle()
    # The deleted topic's watch is gone with it.
    assert cluster.active().call(lambda: "again" not in cluster.controller()._partition_watches)
    cluster.create_topic("again", 1)
    cluster.admin.create_partitions([NewPartitions("again", 2)],
                                    operation_timeout=20)["again"].result(30)
    wait_until(lambda: cluster.leaders_everywhere("again", 2), what="every broker's metadata")


def test_followers_replicate_a_topic_deleted_and_created_again(cluster: Cluster) -> None:
    """The replica fetchers' sessions are keyed by topic id (Fetch v13+): after the topic is
    deleted and created under the same name, both followers fetch the new topic, so acks=all
    with min.insync.replicas=3 is answered (a follower still fetching the old id would be
    answered INCONSISTENT_TOPIC_ID and leave the ISR: NOT_ENOUGH_REPLICAS)."""
    from confluent_kafka import Producer

    def create() -> None:
        cluster.admin.create_topics(
            [NewTopic("reborn", 1, 3, config={"min.insync.replicas": "3"})],
            operation_timeout=20)["reborn"].result(30)

    def produce_all(n: int) -> None:
        producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all",
                             "message.timeout.ms": 30000, "enable.idempotence": False})
        failed: list[Any] = []
        for i in range(n):
            producer.produce("reborn", str(i).encode(), partition=0,
                             on_delivery=lambda err, _m: failed.append(err) if err else None)
        assert producer.flush(45) == 0
        assert failed == []

    create()
    produce_all(20)
    cluster.admin.delete_topics(["reborn"], operation_timeout=20)["reborn"].result(30)
    wait_until(lambda: not cluster.zk.topic_exists("reborn"), what="the topic deleted")
    cluster.settle()
    create()
    produce_all(20)
    leader = wait_until(lambda: next((b for b in cluster.brokers.values()
                                      if (p := b.partition("reborn", 0)) is not None
                                      and p.leader_id == b.broker_id), None),
                        what="the new topic's leader")
    assert leader.partition("reborn", 0).isr == {1, 2, 3}


def test_create_partitions_elsewhere_than_the_controller(cluster: Cluster) -> None:
    cluster.create_topic("cp-nc", 1)
    other = next(b for b in cluster.brokers.values() if b is not cluster.active())
    resp = send(other.port, m_cp.CreatePartitionsRequest(
        topics=[m_cp.CreatePartitionsTopic("cp-nc", 2, None),
                m_cp.CreatePartitionsTopic("cp-nc", 3, None)], timeout_ms=5000))
    assert [(r.name, r.error_code, r.error_message) for r in resp.results] == [
        ("cp-nc", ErrorCode.NOT_CONTROLLER, None)]
    assert sorted(cluster.zk.get_topic_assignment("cp-nc") or {}) == [0]


def test_create_partitions_of_a_topic_being_deleted(cluster: Cluster) -> None:
    # A replica on a broker that never registered keeps the deletion pending (the controller
    # waits for every replica), so the topic stays queued for deletion.
    from tidelog.controller.admin import new_topic_id

    cluster.zk.create_topic("doomed", {0: [1, 4]}, topic_id=new_topic_id())
    cluster.zk.create_delete_topic_path("doomed")
    cluster.settle()
    broker = cluster.active()
    resp = send(broker.port, m_cp.CreatePartitionsRequest(
        topics=[m_cp.CreatePartitionsTopic("doomed", 3, None)], timeout_ms=5000))
    (result,) = resp.results
    assert (result.error_code, result.error_message) == (
        ErrorCode.INVALID_TOPIC_EXCEPTION, "The topic is queued for deletion.")
    assert cluster.zk.get_topic_assignment("doomed") == {0: [1, 4]}


# ---------------------------------------------------------------------- DeleteRecords
def _delete_records(broker: BrokerThread, topic: str, offsets: dict[int, int],
                    timeout_ms: int = 10000) -> dict[int, tuple[int, int]]:
    resp = send(broker.port, m_dr.DeleteRecordsRequest(
        topics=[m_dr.DeleteRecordsTopic(topic, [m_dr.DeleteRecordsPartition(p, o)
                                                for p, o in offsets.items()])],
        timeout_ms=timeout_ms))
    return {r.partition_index: (r.error_code, r.low_watermark)
            for t in resp.topics for r in t.partitions}


def test_delete_records_moves_the_log_start_on_every_replica_before_answering(
        cluster: Cluster) -> None:
    cluster.create_topic("trim", 1)
    cluster.produce("trim", 10)
    tp = confluent_kafka.TopicPartition("trim", 0, 4)
    deleted = cluster.admin.delete_records([tp], operation_timeout=20)[tp].result(30)
    assert deleted.low_watermark == 4
    # The answer waited for the low watermark: every follower had already advanced its log
    # start offset (a follower learns it from a fetch response, then reports it in its next
    # fetch request), not only the leader.
    assert cluster.log_start_offsets("trim") == {1: 4, 2: 4, 3: 4}
    consumer = confluent_kafka.Consumer({"bootstrap.servers": cluster.bootstrap,
                                         "group.id": "trim-reader",
                                         "auto.offset.reset": "earliest"})
    try:
        low, high = consumer.get_watermark_offsets(
            confluent_kafka.TopicPartition("trim", 0), timeout=10)
        assert (low, high) == (4, 10)
        consumer.assign([confluent_kafka.TopicPartition("trim", 0, 0)])  # out of range: reset
        got: list[int] = []
        deadline = time.monotonic() + 20
        while len(got) < 6 and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                got.append(msg.offset())
        assert got == [4, 5, 6, 7, 8, 9]
    finally:
        consumer.close()


def test_delete_records_to_the_high_watermark(cluster: Cluster) -> None:
    cluster.create_topic("trim-all", 1)
    cluster.produce("trim-all", 7)
    tp = confluent_kafka.TopicPartition("trim-all", 0, confluent_kafka.OFFSET_END)  # -1
    deleted = cluster.admin.delete_records([tp], operation_timeout=20)[tp].result(30)
    assert deleted.low_watermark == 7
    assert cluster.log_start_offsets("trim-all") == {1: 7, 2: 7, 3: 7}


def test_delete_records_beyond_the_high_watermark_changes_nothing(cluster: Cluster) -> None:
    cluster.create_topic("trim-far", 1)
    cluster.produce("trim-far", 3)
    leader = cluster.leader("trim-far")
    assert _delete_records(leader, "trim-far", {0: 4}) == {
        0: (ErrorCode.OFFSET_OUT_OF_RANGE, -1)}
    assert _delete_records(leader, "trim-far", {0: -5}) == {
        0: (ErrorCode.OFFSET_OUT_OF_RANGE, -1)}
    assert cluster.log_start_offsets("trim-far") == {1: 0, 2: 0, 3: 0}
    tp = confluent_kafka.TopicPartition("trim-far", 0, 4)
    assert _error_code(cluster.admin.delete_records([tp], operation_timeout=10)[tp]) == \
        confluent_kafka.KafkaError.OFFSET_OUT_OF_RANGE


def test_delete_records_times_out_while_the_followers_lag(cluster: Cluster) -> None:
    """timeout_ms=0: the leader moves at once, but no follower has reported the new log start
    yet, so the low watermark is still the old one: REQUEST_TIMED_OUT carrying it."""
    cluster.create_topic("trim-now", 1)
    cluster.produce("trim-now", 5)
    leader = cluster.leader("trim-now")
    assert _delete_records(leader, "trim-now", {0: 2}, timeout_ms=0) == {
        0: (ErrorCode.REQUEST_TIMED_OUT, 0)}
    assert cluster.log_start_offsets("trim-now")[leader.broker_id] == 2
    # The followers still catch up through their fetches.
    wait_until(lambda: set(cluster.log_start_offsets("trim-now").values()) == {2},
               what="the followers' log start offsets")


def test_delete_records_is_answered_by_the_follower_fetch_that_raises_the_low_watermark(
        cluster: Cluster) -> None:
    """Kafka's DelayedDeleteRecords completes from the follower fetch that raises the low
    watermark (tryCompleteDelayedRequests on its partition), in that same turn: no poll."""
    cluster.create_topic("trim-event", 1)
    cluster.produce("trim-event", 5)
    leader = cluster.leader("trim-event")
    tp = TopicPartition("trim-event", 0)
    handle = leader.server.apis.handlers[ApiKey.DELETE_RECORDS]
    request = m_dr.DeleteRecordsRequest(topics=[m_dr.DeleteRecordsTopic(
        "trim-event", [m_dr.DeleteRecordsPartition(0, 2)])], timeout_ms=30_000)

    async def scenario() -> tuple[bool, Any]:
        core = leader.server.replica_manager.core
        answer = asyncio.ensure_future(handle(None, request))
        await asyncio.sleep(0)  # the leader moved its log start; the answer waits
        p = core.partition(tp)
        for follower in p.remote_replicas:  # each reports the new log start in a fetch
            core.fetch_messages(follower, 0, 0, 1 << 20, {
                tp: (p.log_end_offset, p.leader_epoch, 2, 1 << 20)}, now_ms())
        await asyncio.sleep(0)  # one turn for the answer's task to resume
        return answer.done(), await answer

    done, response = leader.run(scenario())
    assert done
    (result,) = response.topics[0].partitions
    assert (result.error_code, result.low_watermark) == (ErrorCode.NONE, 2)


def test_delete_records_elsewhere_than_the_leader(cluster: Cluster) -> None:
    cluster.create_topic("trim-where", 1)
    cluster.produce("trim-where", 3)
    leader = cluster.leader("trim-where")
    follower = next(b for i, b in cluster.brokers.items() if i != leader.broker_id)
    assert _delete_records(follower, "trim-where", {0: 1}) == {
        0: (ErrorCode.NOT_LEADER_OR_FOLLOWER, -1)}
    assert _delete_records(follower, "trim-where", {7: 1}) == {
        7: (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1)}
    assert _delete_records(follower, "no-such-topic", {0: 1}) == {
        0: (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1)}
    assert cluster.log_start_offsets("trim-where") == {1: 0, 2: 0, 3: 0}


# ---------------------------------------------------------------------- DeleteGroups / OffsetDelete
def _coordinator(cluster: Cluster, group: str) -> BrokerThread:
    def ask() -> int | None:
        r = send(next(iter(cluster.brokers.values())).port,
                 m_fc.FindCoordinatorRequest(key=group, key_type=0), 2)
        return r.node_id if r.error_code == 0 else None

    return cluster.brokers[wait_until(ask, what=f"the coordinator of {group}")]


def _stored(cluster: Cluster, group: str) -> tuple[set[tuple[str, int]], bool]:
    """What a newly elected coordinator would load for the group from its offsets partition:
    (its committed partitions, whether its metadata is there)."""
    coordinator = _coordinator(cluster, group)
    partition = coordinator.call(
        lambda: coordinator.server.group_apis.coordinator.partition_for(group))
    p = coordinator.partition(GROUP_METADATA_TOPIC_NAME, partition)
    loaded = coordinator.call(lambda: load_partition(p.log.batches(p.log.log_start_offset)))
    return set(loaded.offsets.get(group, {})), group in loaded.groups


def _consumer(cluster: Cluster, group: str) -> Any:
    return confluent_kafka.Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": group,
                                     "enable.auto.commit": False,
                                     "auto.offset.reset": "earliest"})


def _join(consumer: Any, topic: str) -> None:
    consumer.subscribe([topic])
    deadline = time.monotonic() + 30
    while not consumer.assignment() and time.monotonic() < deadline:
        consumer.poll(0.2)
    assert consumer.assignment(), "the consumer never got its assignment"


def test_delete_groups_removes_an_empty_group_and_its_offsets(cluster: Cluster) -> None:
    cluster.create_topic("grp-a", 1)
    cluster.produce("grp-a", 3)
    c = _consumer(cluster, "g-gone")
    try:
        _join(c, "grp-a")
        c.commit(offsets=[confluent_kafka.TopicPartition("grp-a", 0, 2)], asynchronous=False)
    finally:
        c.close()  # leaves: the group is Empty, its offsets and metadata stored
    assert _stored(cluster, "g-gone") == ({("grp-a", 0)}, True)
    futures = cluster.admin.delete_consumer_groups(["g-gone"], request_timeout=20)
    futures["g-gone"].result(30)
    assert _stored(cluster, "g-gone") == (set(), False)  # tombstones for both
    coordinator = _coordinator(cluster, "g-gone")
    assert coordinator.call(
        lambda: "g-gone" not in coordinator.server.group_apis.coordinator.groups)
    assert _error_code(cluster.admin.delete_consumer_groups(
        ["g-gone"], request_timeout=20)["g-gone"]) == confluent_kafka.KafkaError.GROUP_ID_NOT_FOUND


def test_delete_groups_refuses_a_group_with_members(cluster: Cluster) -> None:
    cluster.create_topic("grp-b", 1)
    c = _consumer(cluster, "g-busy")
    try:
        _join(c, "grp-b")
        c.commit(offsets=[confluent_kafka.TopicPartition("grp-b", 0, 0)], asynchronous=False)
        assert _error_code(cluster.admin.delete_consumer_groups(
            ["g-busy"], request_timeout=20)["g-busy"]) == \
            confluent_kafka.KafkaError.NON_EMPTY_GROUP
        assert _stored(cluster, "g-busy") == ({("grp-b", 0)}, True)
    finally:
        c.close()


def test_offset_delete_keeps_the_offsets_of_subscribed_topics(cluster: Cluster) -> None:
    cluster.create_topic("od-sub", 1)
    cluster.create_topic("od-other", 1)
    c = _consumer(cluster, "g-od")
    try:
        _join(c, "od-sub")
        c.commit(offsets=[confluent_kafka.TopicPartition("od-sub", 0, 1),
                          confluent_kafka.TopicPartition("od-other", 0, 1)], asynchronous=False)
        coordinator = _coordinator(cluster, "g-od")
        resp = send(coordinator.port, m_od.OffsetDeleteRequest(group_id="g-od", topics=[
            m_od.OffsetDeleteRequestTopic("od-sub", [m_od.OffsetDeleteRequestPartition(0)]),
            m_od.OffsetDeleteRequestTopic("od-other", [m_od.OffsetDeleteRequestPartition(0)]),
            m_od.OffsetDeleteRequestTopic("od-none", [m_od.OffsetDeleteRequestPartition(0)]),
        ]))
        assert resp.error_code == 0
        got = {(t.name, p.partition_index): p.error_code for t in resp.topics
               for p in t.partitions}
        assert got == {("od-sub", 0): ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC,
                       ("od-other", 0): ErrorCode.NONE,
                       ("od-none", 0): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}
        assert _stored(cluster, "g-od")[0] == {("od-sub", 0)}
    finally:
        c.close()
    # Empty now: the subscribed topic's offsets may go too.
    resp = send(coordinator.port, m_od.OffsetDeleteRequest(group_id="g-od", topics=[
        m_od.OffsetDeleteRequestTopic("od-sub", [m_od.OffsetDeleteRequestPartition(0)])]))
    assert (resp.error_code, [(p.partition_index, p.error_code) for t in resp.topics
                              for p in t.partitions]) == (0, [(0, 0)])
    # Its last offset gone, the Empty group is gone too (Kafka's cleanupGroupMetadata).
    assert _stored(cluster, "g-od") == (set(), False)
    assert _error_code(cluster.admin.delete_consumer_groups(
        ["g-od"], request_timeout=20)["g-od"]) == confluent_kafka.KafkaError.GROUP_ID_NOT_FOUND


def test_offset_delete_group_errors(cluster: Cluster) -> None:
    cluster.create_topic("od-x", 1)
    coordinator = _coordinator(cluster, "g-never")
    resp = send(coordinator.port, m_od.OffsetDeleteRequest(group_id="g-never", topics=[
        m_od.OffsetDeleteRequestTopic("od-x", [m_od.OffsetDeleteRequestPartition(0)])]))
    assert (resp.error_code, resp.topics) == (ErrorCode.GROUP_ID_NOT_FOUND, [])
    resp = send(coordinator.port, m_od.OffsetDeleteRequest(group_id="", topics=[]))
    assert resp.error_code == ErrorCode.INVALID_GROUP_ID


# ---------------------------------------------------------------------- ElectLeaders
def _elect(cluster: Cluster, election_type: Any, partitions: list[tuple[str, int]]
           ) -> dict[tuple[str, int], int]:
    # Bootstrapped from the brokers running now (a stopped one may be the only one known),
    # once each of them names the controller (leadership may just have moved).
    cluster.wait_for_controller_known()
    admin = AdminClient({"bootstrap.servers": ",".join(
        b.bootstrap for b in cluster.brokers.values())})
    future = admin.elect_leaders(
        election_type, [confluent_kafka.TopicPartition(t, p) for t, p in partitions])
    return {(tp.topic, tp.partition): 0 if err is None else int(err.code())
            for tp, err in future.result(40).items()}


def _raw_elect(broker: BrokerThread, election_type: int, topic: str, partitions: list[int]
               ) -> list[tuple[int, int, str | None]]:
    resp = send(broker.port, m_el.ElectLeadersRequest(
        election_type=election_type, topic_partitions=[m_el.TopicPartitions(topic, partitions)],
        timeout_ms=10000), 1)
    return [(r.partition_id, r.error_code, r.error_message)
            for t in resp.replica_election_results for r in t.partition_result]


def test_preferred_leader_election(cluster: Cluster) -> None:
    preferred = confluent_kafka.ElectionType.PREFERRED
    cluster.admin.create_topics([NewTopic("pref", 1, replica_assignment=[[1, 2, 3]])],
                                operation_timeout=20)["pref"].result(30)
    wait_until(lambda: (s := cluster.state("pref")) and s.leader == 1 and len(s.isr) == 3,
               what="pref online")
    assert _elect(cluster, preferred, [("pref", 0)]) == {
        ("pref", 0): confluent_kafka.KafkaError.ELECTION_NOT_NEEDED}
    props = dict(cluster.brokers[1].props)
    cluster.stop(1)
    wait_until(lambda: cluster.state("pref").leader in (2, 3), what="a new leader")
    cluster.settle()
    active = next(b for b in cluster.brokers.values() if b.server.controller.is_active)
    assert _raw_elect(active, 0, "pref", [0]) == [
        (0, ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE,
         "Failed to elect leader for partition pref-0 under strategy"
         " PreferredReplicaPartitionLeaderElectionStrategy")]
    other = cluster.state("pref").leader
    cluster.restart(1, props)
    wait_until(lambda: 1 in cluster.state("pref").isr, what="broker 1 back in the ISR")
    cluster.settle()
    assert cluster.state("pref").leader == other  # no automatic rebalance here
    assert _elect(cluster, preferred, [("pref", 0), ("pref", 5)]) == {
        ("pref", 0): 0, ("pref", 5): confluent_kafka.KafkaError.UNKNOWN_TOPIC_OR_PART}
    state = cluster.state("pref")
    assert state.leader == 1 and sorted(state.isr) == [1, 2, 3]
    # The answer waited for the new leader to be in the metadata (of the controller, which
    # answered; the others follow with the same UpdateMetadata).
    wait_until(lambda: all(b.call(lambda b=b: b.server.metadata_cache.partition(
        TopicPartition("pref", 0))).leader == 1 for b in cluster.brokers.values()),
        what="every broker's metadata")


def test_preferred_election_of_every_partition(cluster: Cluster) -> None:
    """Null partitions: every partition; those that needed no election are left out."""
    cluster.admin.create_topics([NewTopic("pref-all", 1, replica_assignment=[[2, 1, 3]])],
                                operation_timeout=20)["pref-all"].result(30)
    wait_until(lambda: (s := cluster.state("pref-all")) and s.leader == 2 and len(s.isr) == 3,
               what="pref-all online")
    props = dict(cluster.brokers[2].props)
    cluster.stop(2)
    wait_until(lambda: cluster.state("pref-all").leader in (1, 3), what="a new leader")
    cluster.restart(2, props)

    def every_isr_full() -> bool:
        for topic in cluster.zk.get_all_topics() - cluster.zk.get_topic_deletions():
            for p, replicas in (cluster.zk.get_topic_assignment(topic) or {}).items():
                state = cluster.state(topic, p)
                if state is not None and sorted(state.isr) != sorted(
                        r for r in replicas if r in cluster.brokers):
                    return False
        return True

    wait_until(every_isr_full, timeout_s=30, what="broker 2 back in every ISR")
    cluster.settle()
    resp = send(cluster.active().port, m_el.ElectLeadersRequest(
        election_type=0, topic_partitions=None, timeout_ms=10000), 1)
    results = {(t.topic, r.partition_id): r.error_code for t in resp.replica_election_results
               for r in t.partition_result}
    assert results.get(("pref-all", 0)) == 0
    assert set(results.values()) == {0}, results
    cluster.settle()
    # (A topic queued for deletion is not the controller's to elect any more.)
    for topic in cluster.zk.get_all_topics() - cluster.zk.get_topic_deletions():
        for p, replicas in (cluster.zk.get_topic_assignment(topic) or {}).items():
            state = cluster.state(topic, p)
            if state is not None and replicas[0] in cluster.brokers:
                assert state.leader == replicas[0], (topic, p, state)


def test_elect_leaders_of_a_topic_being_deleted(cluster: Cluster) -> None:
    from tidelog.controller.admin import new_topic_id

    # A replica on a broker that never registered keeps the deletion pending.
    cluster.zk.create_topic("doomed-el", {0: [1, 4]}, topic_id=new_topic_id())
    wait_until(lambda: (s := cluster.state("doomed-el")) and s.leader == 1, what="online")
    cluster.zk.create_delete_topic_path("doomed-el")
    cluster.settle()
    assert _raw_elect(cluster.active(), 0, "doomed-el", [0]) == [
        (0, ErrorCode.INVALID_TOPIC_EXCEPTION, "The topic is being deleted")]


def test_elect_leaders_at_a_broker_that_is_not_the_controller(cluster: Cluster) -> None:
    cluster.create_topic("nc", 1)
    cluster.settle()
    other = next(b for b in cluster.brokers.values() if not b.server.controller.is_active)
    assert _raw_elect(other, 0, "nc", [0]) == [(0, ErrorCode.NOT_CONTROLLER, None)]


def test_unclean_leader_election(cluster: Cluster) -> None:
    unclean = confluent_kafka.ElectionType.UNCLEAN
    cluster.admin.create_topics([NewTopic("uncl", 1, replica_assignment=[[2, 3]]),
                                 NewTopic("lonely", 1, replica_assignment=[[2]])],
                                operation_timeout=20)["uncl"].result(30)
    wait_until(lambda: (s := cluster.state("uncl")) and s.leader == 2 and len(s.isr) == 2,
               what="uncl online")
    assert _elect(cluster, unclean, [("uncl", 0)]) == {
        ("uncl", 0): confluent_kafka.KafkaError.ELECTION_NOT_NEEDED}
    props = {i: dict(cluster.brokers[i].props) for i in (2, 3)}
    cluster.stop(3)
    wait_until(lambda: list(cluster.state("uncl").isr) == [2], what="the ISR shrunk to [2]")
    cluster.stop(2)
    wait_until(lambda: cluster.state("uncl").leader == -1, what="uncl offline")
    cluster.restart(3, props[3])
    cluster.settle()
    state = cluster.state("uncl")
    assert (state.leader, list(state.isr)) == (-1, [2])  # 3 is out of sync: no clean election
    active = next(b for b in cluster.brokers.values() if b.server.controller.is_active)
    assert _raw_elect(active, 1, "lonely", [0]) == [
        (0, ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE,
         "Failed to elect leader for partition lonely-0 under strategy"
         " OfflinePartitionLeaderElectionStrategy(true)")]
    assert _elect(cluster, unclean, [("uncl", 0)]) == {("uncl", 0): 0}
    state = cluster.state("uncl")
    assert (state.leader, list(state.isr)) == (3, [3])
    cluster.restart(2, props[2])
    wait_until(lambda: sorted(cluster.state("uncl").isr) == [2, 3], what="2 back in the ISR")


# ---------------------------------------------------------------------- DescribeCluster
def test_describe_cluster(cluster: Cluster) -> None:
    cluster.settle()
    desc = cluster.admin.describe_cluster(include_authorized_operations=True,
                                          request_timeout=20).result(30)
    active = next(b for b in cluster.brokers.values() if b.server.controller.is_active)
    assert desc.cluster_id == active.server.cluster_id == cluster.zk.get_or_create_cluster_id()
    assert desc.controller.id == active.broker_id
    assert sorted((n.id, n.host, n.port) for n in desc.nodes) == sorted(
        (b.broker_id, "127.0.0.1", b.port) for b in cluster.brokers.values())
    # No authorizer: every operation a cluster supports.
    assert sorted(op.name for op in desc.authorized_operations) == sorted(
        ["ALTER", "ALTER_CONFIGS", "CLUSTER_ACTION", "CREATE", "DESCRIBE", "DESCRIBE_CONFIGS",
         "IDEMPOTENT_WRITE"])
    broker = next(iter(cluster.brokers.values()))
    resp = send(broker.port, m_dcl.DescribeClusterRequest(endpoint_type=2), 1)
    assert (resp.error_code, resp.error_message, resp.brokers) == (
        ErrorCode.MISMATCHED_ENDPOINT_TYPE, "The request was sent to an endpoint of type BROKER,"
        " but we wanted an endpoint of type CONTROLLER", [])
    resp = send(broker.port, m_dcl.DescribeClusterRequest(endpoint_type=3), 1)
    assert (resp.error_code, resp.error_message) == (ErrorCode.UNSUPPORTED_ENDPOINT_TYPE,
                                                     "Unsupported endpoint type 3")
    resp = send(broker.port, m_dcl.DescribeClusterRequest(), 0)
    assert resp.error_code == 0 and resp.cluster_authorized_operations == -(1 << 31)


# ---------------------------------------------------------------------- DescribeLogDirs
def test_describe_log_dirs(cluster: Cluster) -> None:
    cluster.create_topic("dirs", 2)
    cluster.create_topic("dirs-other", 1)
    cluster.produce("dirs", 5, partition=1)
    leader = cluster.leader("dirs", 1)
    resp = send(leader.port, m_dld.DescribeLogDirsRequest(
        topics=[m_dld.DescribableLogDirTopic("dirs", [1])]), 4)
    (result,) = resp.results
    log_dir = leader.props["log.dirs"]
    assert result.error_code == 0 and result.log_dir == str(Path(log_dir).resolve())
    assert 0 < result.usable_bytes <= result.total_bytes
    topics = {t.name: t.partitions for t in result.topics}
    (p1,) = topics["dirs"]
    size = leader.call(lambda: leader.server.log_manager.get_log("dirs", 1).size)
    assert (p1.partition_index, p1.partition_size, p1.offset_lag) == (1, size, 0)
    assert size > 0
    # Every topic with a log in the dir is listed; only the partitions asked for are described.
    assert topics["dirs-other"] == []
    resp = send(leader.port, m_dld.DescribeLogDirsRequest(topics=None), 1)
    described = {(t.name, p.partition_index) for r in resp.results for t in r.topics
                 for p in t.partitions}
    assert described == set(leader.call(lambda: set(leader.server.log_manager.logs)))


def test_describe_log_dirs_with_an_offline_dir(zookeeper: Any, tmp_path: Path) -> None:
    """A log dir that cannot be used (a file stands where it should be) is KAFKA_STORAGE_ERROR;
    the other is described."""
    blocked = tmp_path / "blocked"
    blocked.write_text("not a directory")
    good = tmp_path / "good"
    b = BrokerThread(broker_props(7, new_chroot(zookeeper), good,
                                  **{"log.dirs": f"{good},{blocked}"})).start()
    try:
        resp = send(b.port, m_dld.DescribeLogDirsRequest(topics=None), 4)
        got = sorted((r.log_dir, r.error_code, r.topics) for r in resp.results)
        assert got == sorted([(str(good.resolve()), 0, []),
                              (str(blocked.resolve()), ErrorCode.KAFKA_STORAGE_ERROR, [])])
    finally:
        b.stop()


# ---------------------------------------------------------------------- DescribeProducers
def test_describe_producers(cluster: Cluster) -> None:
    cluster.create_topic("prod", 1)
    producer = confluent_kafka.Producer({"bootstrap.servers": cluster.bootstrap,
                                         "enable.idempotence": True, "linger.ms": 0})
    before = int(time.time() * 1000)
    for i in range(3):
        producer.produce("prod", f"v{i}".encode(), partition=0)
        assert producer.flush(20) == 0  # three batches of one record: sequences 0, 1, 2
    leader = cluster.leader("prod")

    def describe(broker: BrokerThread, topic: str = "prod") -> Any:
        resp = send(broker.port, m_dp.DescribeProducersRequest(
            topics=[m_dp.TopicRequest(topic, [0])]))
        return resp.topics[0].partitions[0]

    got = describe(leader)
    assert got.error_code == 0
    (state,) = got.active_producers
    assert (state.producer_epoch, state.last_sequence, state.coordinator_epoch,
            state.current_txn_start_offset) == (0, 2, -1, -1)
    assert state.producer_id >= 0 and state.last_timestamp >= before
    # A follower answers from the batches it replicated (once it has them all).
    follower = next(b for i, b in cluster.brokers.items() if i != leader.broker_id)
    wait_until(lambda: follower.partition("prod", 0).log_end_offset == 3, what="replicated")
    assert describe(follower).active_producers == got.active_producers
    assert describe(leader, "no-such").error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


# ---------------------------------------------------------------------- the CLI
def test_topics_alter_and_elect_leaders_commands(cluster: Cluster) -> None:
    from click.testing import CliRunner

    from tidelog.cli.topics_cmd import topics

    cluster.create_topic("cli-grow", 1)
    runner = CliRunner()
    r = runner.invoke(topics, ["alter", "--bootstrap-server", cluster.bootstrap,
                               "--topic", "cli-grow", "--partitions", "3"])
    assert r.exit_code == 0, r.output
    assert r.output == "Topic cli-grow now has 3 partitions.\n"
    assert sorted(cluster.zk.get_topic_assignment("cli-grow") or {}) == [0, 1, 2]
    r = runner.invoke(topics, ["alter", "--bootstrap-server", cluster.bootstrap,
                               "--topic", "cli-grow", "--partitions", "2"])
    assert r.exit_code == 1
    assert "INVALID_PARTITIONS: Topic currently has 3 partitions, which is higher than the" \
        " requested 2." in r.output
    r = runner.invoke(topics, ["elect-leaders", "--bootstrap-server", cluster.bootstrap,
                               "--election-type", "preferred", "--topic", "cli-grow",
                               "--partition", "0"])
    assert r.exit_code == 0, r.output
    assert "Error completing leader election (PREFERRED) for partition: cli-grow-0:" \
        " ELECTION_NOT_NEEDED" in r.output


def test_topics_delete_records_command(cluster: Cluster) -> None:
    from click.testing import CliRunner

    from tidelog.cli.topics_cmd import topics

    cluster.create_topic("cli-trim", 2)
    cluster.produce("cli-trim", 6, partition=0)
    cluster.produce("cli-trim", 2, partition=1)
    r = CliRunner().invoke(topics, ["delete-records", "--bootstrap-server", cluster.bootstrap,
                                    "--topic", "cli-trim", "--partition", "0", "--offset", "5"])
    assert r.exit_code == 0, r.output
    assert r.output == ("Records delete operation completed:\n"
                        "partition: cli-trim-0\tlow_watermark: 5\n")
    assert set(cluster.log_start_offsets("cli-trim").values()) == {5}
    r = CliRunner().invoke(topics, ["delete-records", "--bootstrap-server", cluster.bootstrap,
                                    "--topic", "cli-trim", "--partition", "1", "--offset", "3"])
    assert r.exit_code == 1
    assert "partition: cli-trim-1\terror: OFFSET_OUT_OF_RANGE" in r.output
    assert set(cluster.log_start_offsets("cli-trim", 1).values()) == {0}
