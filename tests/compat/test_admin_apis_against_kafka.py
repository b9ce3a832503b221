"""Issue 14's admin APIs against Kafka 3.9 (ZooKeeper mode): CreatePartitions and its refusals
(codes and messages), DeleteRecords, ElectLeaders, DescribeCluster, DescribeLogDirs and
DescribeProducers answer as Kafka does."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import ElectionType, KafkaError, TopicPartition
from confluent_kafka.admin import NewPartitions
from differential import (
    Pair,
    Target,
    coordinator,
    create_ready,
    leader_address,
    outcome,
    produce,
    raw,
    topic_shape,
    watermarks,
)

from tidelog.protocol.messages import create_partitions as m_cp
from tidelog.protocol.messages import delete_groups as m_dg
from tidelog.protocol.messages import delete_records as m_dr
from tidelog.protocol.messages import describe_log_dirs as m_dld
from tidelog.protocol.messages import describe_producers as m_dp
from tidelog.protocol.messages import offset_delete as m_od

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def controller_address(t: Target) -> str:
    md = t.admin().list_topics(timeout=10)
    b = md.brokers[md.controller_id]
    return f"{b.host}:{b.port}"


def not_controller_address(t: Target) -> str:
    md = t.admin().list_topics(timeout=10)
    b = next(b for i, b in sorted(md.brokers.items()) if i != md.controller_id)
    return f"{b.host}:{b.port}"


def partition_count(t: Target, topic: str, want: int, timeout_s: float = 30.0) -> int:
    """The topic's partition count in the metadata, once it shows `want` (or the timeout)."""
    deadline = time.monotonic() + timeout_s
    while True:
        shape = topic_shape(t, topic, isr_size=3)
        if (not isinstance(shape, str) and shape[0] == want) or time.monotonic() >= deadline:
            return shape if isinstance(shape, str) else shape[0]
        time.sleep(0.2)


def test_create_partitions_grows_a_topic(pair: Pair) -> None:
    def scenario(t: Target) -> object:
        create_ready(t, "cp-grow", 2, 3)
        admin = t.admin()
        grown = outcome(admin.create_partitions([NewPartitions("cp-grow", 4)],
                                                operation_timeout=30)["cp-grow"])
        partition_count(t, "cp-grow", 4)
        return grown, topic_shape(t, "cp-grow", isr_size=3)

    assert pair.same(scenario) == (None, (4, [(3, 3, True)] * 4))


@pytest.mark.parametrize(("count", "assignment"), [
    (2, None), (1, None), (3, [[1, 9]]), (3, [[1, 1]]), (3, [[1]]), (4, [[1, 2]]), (3, [[]]),
])
def test_create_partitions_refusals(pair: Pair, count: int,
                                    assignment: list[list[int]] | None) -> None:
    topic = f"cp-bad-{count}-{'-'.join(''.join(map(str, a)) for a in assignment or [])}"

    def scenario(t: Target) -> object:
        create_ready(t, topic, 2, 2)
        assignments = (None if assignment is None
                       else [m_cp.CreatePartitionsAssignment(a) for a in assignment])
        r = raw(controller_address(t), m_cp.CreatePartitionsRequest(
            topics=[m_cp.CreatePartitionsTopic(topic, count, assignments)],
            timeout_ms=10000), 1)
        return ([(x.error_code, x.error_message) for x in r.results],
                topic_shape(t, topic)[0])

    pair.same(scenario)


def test_create_partitions_of_an_unknown_topic_or_twice(pair: Pair) -> None:
    def scenario(t: Target) -> object:
        create_ready(t, "cp-twice", 1, 1)
        request = m_cp.CreatePartitionsRequest(topics=[
            m_cp.CreatePartitionsTopic("cp-nowhere", 2, None),
            m_cp.CreatePartitionsTopic("cp-twice", 2, None),
            m_cp.CreatePartitionsTopic("cp-twice", 3, None)], timeout_ms=10000)
        return [sorted((x.name, x.error_code, x.error_message) for x in raw(at, request, 1).results)
                for at in (controller_address(t), not_controller_address(t))]

    pair.same(scenario)


def test_delete_records(pair: Pair) -> None:
    def scenario(t: Target) -> object:
        create_ready(t, "dr", 1, 3)
        produce(t, "dr", [b"r%d" % i for i in range(10)], acks="all")
        admin = t.admin()
        seen: list[object] = []
        for offset in (4, 11, -1, 3):
            tp = TopicPartition("dr", 0, offset)
            r = outcome(admin.delete_records([tp], operation_timeout=30)[tp])
            seen.append(r if isinstance(r, str) else r.low_watermark)
            seen.append(watermarks(t, "dr"))
        leader = leader_address(t, "dr")
        r = raw(leader, m_dr.DeleteRecordsRequest(topics=[
            m_dr.DeleteRecordsTopic("dr", [m_dr.DeleteRecordsPartition(0, -7),
                                           m_dr.DeleteRecordsPartition(5, 1)]),
            m_dr.DeleteRecordsTopic("dr-none", [m_dr.DeleteRecordsPartition(0, 1)])],
            timeout_ms=10000), 1)
        seen.append(sorted((x.name, p.partition_index, p.error_code, p.low_watermark)
                           for x in r.topics for p in x.partitions))
        return seen

    assert pair.same(scenario)[:8] == [4, (4, 10), "OFFSET_OUT_OF_RANGE", (4, 10), 10, (10, 10),
                                       10, (10, 10)]


def test_elect_leaders_when_no_election_is_needed(pair: Pair) -> None:
    def scenario(t: Target) -> object:
        create_ready(t, "el", 2, 3)
        admin = t.admin()
        out = []
        for kind in (ElectionType.PREFERRED, ElectionType.UNCLEAN):
            result = admin.elect_leaders(kind, [TopicPartition("el", 0),
                                                TopicPartition("el", 7)]).result(60)
            out.append(sorted((tp.topic, tp.partition, None if e is None else e.name())
                              for tp, e in result.items()))
        return out

    assert pair.same(scenario)[0] == [("el", 0, "ELECTION_NOT_NEEDED"),
                                      ("el", 7, "UNKNOWN_TOPIC_OR_PART")]


def test_describe_cluster(pair: Pair) -> None:
    def scenario(t: Target) -> object:
        admin = t.admin()  # kept referenced: a destroyed client fails its futures
        d = admin.describe_cluster(include_authorized_operations=True).result(30)
        return (len(d.nodes), d.controller.id in {n.id for n in d.nodes},
                sorted(op.name for op in d.authorized_operations), bool(d.cluster_id))

    pair.same(scenario)


def test_describe_log_dirs_and_producers(pair: Pair) -> None:
    def scenario(t: Target) -> object:
        create_ready(t, "ld", 2, 3)
        produce(t, "ld", [b"x" * 100] * 3, partition=1, acks="all", **{"enable.idempotence": True})
        leader = leader_address(t, "ld", 1)
        r = raw(leader, m_dld.DescribeLogDirsRequest(
            topics=[m_dld.DescribableLogDirTopic("ld", [1, 5])]), 4)
        dirs = [(d.error_code, [(x.name, [(p.partition_index, p.offset_lag, p.partition_size > 0,
                                            p.is_future_key) for p in x.partitions])
                                for x in d.topics if x.name == "ld"],
                 d.total_bytes >= d.usable_bytes > 0) for d in r.results]
        p = raw(leader, m_dp.DescribeProducersRequest(topics=[
            m_dp.TopicRequest("ld", [1]), m_dp.TopicRequest("ld-none", [0])]), 0)
        producers = [(x.name, q.partition_index, q.error_code,
                      [(s.producer_epoch, s.last_sequence, s.coordinator_epoch,
                        s.current_txn_start_offset) for s in q.active_producers])
                     for x in p.topics for q in x.partitions]
        return dirs, producers

    dirs, producers = pair.same(scenario)
    assert dirs == [(0, [("ld", [(1, 0, True, False)])], True)]
    assert producers[0] == ("ld", 1, 0, [(0, 2, -1, -1)])
    assert producers[1][2] == KafkaError.UNKNOWN_TOPIC_OR_PART


def test_offset_delete_and_delete_groups_with_a_member(pair: Pair) -> None:
    """A group with one member subscribed to one topic and offsets committed for two:
    OffsetDelete keeps the subscribed topic's (GROUP_SUBSCRIBED_TO_TOPIC), removes the other's,
    answers an unknown topic per partition; DeleteGroups refuses the group (NON_EMPTY_GROUP);
    once the member left, deleting the last offset of the Empty group removes the group itself
    (DeleteGroups then GROUP_ID_NOT_FOUND)."""
    def scenario(t: Target) -> object:
        create_ready(t, "od-sub", 1, 3)
        create_ready(t, "od-other", 1, 3)
        at = coordinator(t, "g-od")
        c = t.consumer(**{"group.id": "g-od", "auto.offset.reset": "earliest"})
        seen: list[object] = []

        def offset_delete(group: str, *topics: str) -> object:
            r = raw(at, m_od.OffsetDeleteRequest(group_id=group, topics=[
                m_od.OffsetDeleteRequestTopic(x, [m_od.OffsetDeleteRequestPartition(0)])
                for x in topics]), 0)
            return r.error_code, sorted((x.name, p.partition_index, p.error_code)
                                        for x in r.topics for p in x.partitions)

        def delete_group(group: str) -> object:
            r = raw(at, m_dg.DeleteGroupsRequest(groups_names=[group]), 2)
            return [(g.group_id, g.error_code) for g in r.results]

        try:
            c.subscribe(["od-sub"])
            deadline = time.monotonic() + 60
            while not c.assignment():
                assert time.monotonic() < deadline, "no assignment in time"
                c.poll(0.2)
            c.commit(offsets=[TopicPartition("od-sub", 0, 1), TopicPartition("od-other", 0, 1)],
                     asynchronous=False)
            seen.append(offset_delete("g-od", "od-sub", "od-other", "od-none"))
            seen.append(delete_group("g-od"))
        finally:
            c.close()
        seen.append(offset_delete("g-od", "od-sub"))
        seen.append(delete_group("g-od"))
        seen.append(offset_delete("g-od", "od-sub"))
        seen.append(delete_group("g-od"))
        return seen

    assert pair.same(scenario) == [
        (0, [("od-none", 0, 3), ("od-other", 0, 0), ("od-sub", 0, 86)]),
        [("g-od", 68)],
        (0, [("od-sub", 0, 0)]),
        [("g-od", 69)],
        (69, []),
        [("g-od", 69)],
    ]
