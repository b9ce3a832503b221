"""Consumer groups on a real 3-broker cluster with real clients: confluent-kafka `subscribe()`
with two members sharing the partitions, committing, and a restarted member resuming from the
committed offsets; kafka-python and aiokafka group consumers; `kcat -G`; the coordinator is the
leader of the group's `__consumer_offsets` partition, and after that broker is killed the next
leader serves the same committed offsets."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
import uuid
from typing import Any

import confluent_kafka
import pytest
from confluent_kafka.admin import AdminClient
from real_cluster_harness import RealCluster, produce_acked, producer, wait_for

from tidelog.coordinator.offsets import GROUP_METADATA_TOPIC_NAME, partition_for

pytestmark = pytest.mark.integration

OFFSETS_PARTITIONS = 50  # offsets.topic.num.partitions (Kafka's default)


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _topic_with_records(cluster: RealCluster, partitions: int, n: int, start: int = 0,
                        topic: str | None = None) -> tuple[str, set[bytes]]:
    topic = topic or _name("cg")
    if start == 0:
        cluster.create_topic(topic, partitions, 3)
    p = producer(cluster.bootstrap)
    values = [(f"k{i}".encode(), f"v{i}".encode()) for i in range(start, start + n)]
    produce_acked(p, topic, values)
    return topic, {v for _, v in values}


def _consumer_conf(cluster: RealCluster, group: str) -> dict[str, Any]:
    return {
        "bootstrap.servers": cluster.bootstrap,
        "group.id": group,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "session.timeout.ms": 10000,
        "heartbeat.interval.ms": 500,
    }


def _coordinator_of(cluster: RealCluster, group: str) -> int:
    """The broker that should coordinate `group`: the leader of its offsets partition."""
    state = wait_for(lambda: cluster.state(GROUP_METADATA_TOPIC_NAME,
                                           partition_for(group, OFFSETS_PARTITIONS)),
                     what="the offsets topic")
    return int(state.leader)


def test_confluent_two_members_share_partitions_commit_and_resume(real_cluster: RealCluster) -> None:
    topic, first = _topic_with_records(real_cluster, 4, 200)
    group = _name("cf-group")
    conf = _consumer_conf(real_cluster, group)
    c1, c2 = confluent_kafka.Consumer(conf), confluent_kafka.Consumer(conf)
    try:
        c1.subscribe([topic])
        c2.subscribe([topic])
        seen: dict[int, set[bytes]] = {1: set(), 2: set()}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for i, c in ((1, c1), (2, c2)):
                for m in c.consume(200, timeout=0.3):
                    if m.error() is None:
                        seen[i].add(m.value())
            a1 = {tp.partition for tp in c1.assignment()}
            a2 = {tp.partition for tp in c2.assignment()}
            if seen[1] | seen[2] == first and a1 and a2:
                break
        assert seen[1] | seen[2] == first
        # Both members hold partitions, none twice, all four covered.
        assert a1 and a2 and not a1 & a2 and a1 | a2 == {0, 1, 2, 3}
        for c in (c1, c2):
            c.commit(asynchronous=False)
        committed = c1.committed([confluent_kafka.TopicPartition(topic, p) for p in range(4)],
                                 timeout=10)
        ends = [c1.get_watermark_offsets(confluent_kafka.TopicPartition(topic, p), timeout=10)[1]
                for p in range(4)]
        assert [tp.offset for tp in committed] == ends and sum(ends) == 200
        # The coordinator is the leader of the group's offsets partition; the group is Stable.
        admin = AdminClient({"bootstrap.servers": real_cluster.bootstrap})
        desc = admin.describe_consumer_groups([group])[group].result(timeout=15)
        assert desc.coordinator.id == _coordinator_of(real_cluster, group)
        assert str(desc.state).endswith("STABLE") and len(desc.members) == 2
        listed = admin.list_consumer_groups().result(timeout=15)
        assert group in {g.group_id for g in listed.valid}
    finally:
        c1.close()
        c2.close()
    # A member started later resumes from the committed offsets: only the new records.
    _, more = _topic_with_records(real_cluster, 4, 40, start=200, topic=topic)
    c3 = confluent_kafka.Consumer(conf)
    try:
        c3.subscribe([topic])
        got: list[bytes] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(got) < 40:
            got += [m.value() for m in c3.consume(100, timeout=0.5) if m.error() is None]
        got += [m.value() for m in c3.consume(100, timeout=1.0) if m.error() is None]
        assert sorted(got) == sorted(more)
    finally:
        c3.close()


def test_kafka_python_group_consumer(real_cluster: RealCluster) -> None:
    import kafka

    topic, values = _topic_with_records(real_cluster, 3, 60)
    group = _name("kp-group")
    c = kafka.KafkaConsumer(topic, bootstrap_servers=real_cluster.bootstrap, group_id=group,
                            auto_offset_reset="earliest", enable_auto_commit=False,
                            consumer_timeout_ms=20000)
    try:
        got: set[bytes] = set()
        for m in c:
            got.add(m.value)
            if got == values:
                break
        assert got == values
        assert {tp.partition for tp in c.assignment()} == {0, 1, 2}
        c.commit()
        committed = {p: c.committed(kafka.TopicPartition(topic, p)) for p in range(3)}
        assert sum(committed.values()) == 60
    finally:
        c.close()


def test_aiokafka_group_consumer(real_cluster: RealCluster) -> None:
    import aiokafka

    topic, values = _topic_with_records(real_cluster, 3, 60)
    group = _name("aio-group")

    async def go() -> None:
        c = aiokafka.AIOKafkaConsumer(topic, bootstrap_servers=real_cluster.bootstrap,
                                      group_id=group, auto_offset_reset="earliest",
                                      enable_auto_commit=False)
        await c.start()
        try:
            got: set[bytes] = set()
            deadline = time.monotonic() + 60
            while got != values and time.monotonic() < deadline:
                batches = await c.getmany(timeout_ms=500)
                for records in batches.values():
                    got.update(r.value for r in records)
            assert got == values
            await c.commit()
            committed = [await c.committed(aiokafka.TopicPartition(topic, p)) for p in range(3)]
            assert sum(committed) == 60
        finally:
            await c.stop()

    asyncio.run(go())


def test_kcat_balanced_consumer(real_cluster: RealCluster) -> None:
    topic, values = _topic_with_records(real_cluster, 2, 30)
    group = _name("kcat-group")
    proc = subprocess.Popen(
        ["kcat", "-b", real_cluster.bootstrap, "-G", group, "-X", "auto.offset.reset=earliest",
         "-c", "30", "-q", "-f", "%s\n", topic],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(5)
    assert proc.returncode == 0, err
    assert {line.encode() for line in out.split()} == values


def test_committed_offsets_survive_killing_the_coordinator(real_cluster: RealCluster) -> None:
    topic, _ = _topic_with_records(real_cluster, 2, 20)
    group = _name("move-group")
    conf = _consumer_conf(real_cluster, group)
    c = confluent_kafka.Consumer(conf)
    tps = [confluent_kafka.TopicPartition(topic, 0, 7), confluent_kafka.TopicPartition(topic, 1, 3)]
    try:
        c.commit(offsets=tps, asynchronous=False)
    finally:
        c.close()
    offsets_partition = partition_for(group, OFFSETS_PARTITIONS)
    coordinator = _coordinator_of(real_cluster, group)
    real_cluster.kill(coordinator)
    try:
        wait_for(lambda: (s := real_cluster.state(GROUP_METADATA_TOPIC_NAME, offsets_partition))
                 and s.leader not in (-1, coordinator), timeout_s=60,
                 what="a new leader of the group's offsets partition")
        c = confluent_kafka.Consumer(conf)
        try:
            def committed() -> list[int] | None:
                try:
                    got = c.committed([confluent_kafka.TopicPartition(topic, p) for p in (0, 1)],
                                      timeout=5)
                except confluent_kafka.KafkaException:
                    return None
                return [tp.offset for tp in got]
            assert wait_for(committed, timeout_s=60, what="the committed offsets") == [7, 3]
        finally:
            c.close()
    finally:
        real_cluster.start(coordinator)
        wait_for(lambda: (s := real_cluster.state(GROUP_METADATA_TOPIC_NAME, offsets_partition))
                 and coordinator in s.isr, timeout_s=60, what="the restarted broker in the ISR")


def test_the_offsets_topic_is_compacted(real_cluster: RealCluster) -> None:
    """A group lookup creates the offsets topic, compacted as Kafka's (the cleaner keeps the
    latest commit per key; nothing is deleted by time)."""
    group = _name("keep")
    c = confluent_kafka.Consumer(_consumer_conf(real_cluster, group))
    try:
        c.committed([confluent_kafka.TopicPartition("any", 0)], timeout=30)  # finds the coordinator
    finally:
        c.close()
    _coordinator_of(real_cluster, group)
    config = real_cluster.zk.get_topic_config(GROUP_METADATA_TOPIC_NAME)
    assert config.get("cleanup.policy") == "compact"


def test_group_apis_per_version_over_the_wire(real_cluster: RealCluster) -> None:
    """The version-dependent parts of the protocol, spoken raw to the brokers."""
    from tidelog.client.connection import BrokerConnection
    from tidelog.protocol.errors import ErrorCode as E
    from tidelog.protocol.messages import describe_groups as m_dg
    from tidelog.protocol.messages import find_coordinator as m_fc
    from tidelog.protocol.messages import heartbeat as m_hb
    from tidelog.protocol.messages import join_group as m_jg
    from tidelog.protocol.messages import leave_group as m_lg
    from tidelog.protocol.messages import offset_commit as m_oc
    from tidelog.protocol.messages import offset_fetch as m_of
    from tidelog.protocol.messages import sync_group as m_sg

    topic, _ = _topic_with_records(real_cluster, 1, 1)
    group = _name("wire-group")
    host, port = real_cluster.bootstrap.split(",")[0].rsplit(":", 1)

    async def connect(h: str, p: int) -> BrokerConnection:
        conn = BrokerConnection(h, p, client_id="wire-test")
        await conn.connect(timeout_s=10)
        return conn

    def join(member_id: str = "") -> m_jg.JoinGroupRequest:
        return m_jg.JoinGroupRequest(
            group_id=group, session_timeout_ms=10000, rebalance_timeout_ms=10000,
            member_id=member_id, protocol_type="consumer",
            protocols=[m_jg.JoinGroupRequestProtocol("range", b"meta")])

    async def go() -> None:
        boot = await connect(host, int(port))
        try:
            # v4: batched keys.
            r = None
            for _ in range(100):
                r = await boot.send(m_fc.FindCoordinatorRequest(
                    key_type=0, coordinator_keys=[group, group + "-b"]), 4)
                if all(c.error_code == 0 for c in r.coordinators):
                    break
                await asyncio.sleep(0.2)
            assert r is not None and [c.key for c in r.coordinators] == [group, group + "-b"]
            assert all(c.error_code == 0 for c in r.coordinators)
            coord = r.coordinators[0]
            assert coord.node_id == _coordinator_of(real_cluster, group)
            # A transactional id's coordinator: the leader of its __transaction_state
            # partition, once the first lookup has created that topic.
            for _ in range(150):
                txn = await boot.send(m_fc.FindCoordinatorRequest(key="tx", key_type=1), 2)
                if txn.error_code != E.COORDINATOR_NOT_AVAILABLE:
                    break
                await asyncio.sleep(0.2)
            state = real_cluster.state("__transaction_state", partition_for("tx", 50))
            assert txn.error_code == 0 and state is not None and txn.node_id == state.leader
            v0 = await boot.send(m_fc.FindCoordinatorRequest(key=group), 0)
            assert (v0.error_code, v0.node_id, v0.port) == (0, coord.node_id, coord.port)
            # The wrong broker answers NOT_COORDINATOR.
            others = [b for b in real_cluster.bootstrap.split(",")
                      if not b.endswith(f":{coord.port}")]
            wrong = await connect(*others[0].rsplit(":", 1))
            try:
                hb = await wrong.send(m_hb.HeartbeatRequest(group, 1, "m"), 0)
                assert hb.error_code == E.NOT_COORDINATOR
            finally:
                await wrong.close()
        finally:
            await boot.close()
        c = await connect(coord.host, coord.port)
        try:
            # v4+: a new member first gets its id with MEMBER_ID_REQUIRED.
            r4 = await c.send(join(), 4)
            assert r4.error_code == E.MEMBER_ID_REQUIRED and r4.member_id.startswith("wire-test-")
            # v7 answers with the protocol type; the group's first rebalance waits
            # group.initial.rebalance.delay.ms.
            r7 = await c.send(join(r4.member_id), 7, timeout_ms=30000)
            assert r7.error_code == 0 and r7.generation_id == 1 and r7.protocol_type == "consumer"
            assert r7.protocol_name == "range" and r7.leader == r4.member_id
            assert [(m.member_id, m.metadata) for m in r7.members] == [(r4.member_id, b"meta")]
            s = await c.send(m_sg.SyncGroupRequest(
                group_id=group, generation_id=1, member_id=r4.member_id, protocol_type="consumer",
                protocol_name="range",
                assignments=[m_sg.SyncGroupRequestAssignment(r4.member_id, b"asg")]), 5)
            assert (s.error_code, s.assignment, s.protocol_name) == (0, b"asg", "range")
            assert (await c.send(m_hb.HeartbeatRequest(group, 1, r4.member_id), 0)).error_code == 0
            # OffsetCommit v2 with a retention time; OffsetFetch v1 and v5 (leader epoch).
            oc = await c.send(m_oc.OffsetCommitRequest(
                group_id=group, generation_id_or_member_epoch=1, member_id=r4.member_id,
                retention_time_ms=60000, topics=[m_oc.OffsetCommitRequestTopic(topic, [
                    m_oc.OffsetCommitRequestPartition(0, 1, committed_metadata="md")])]), 2)
            assert oc.topics[0].partitions[0].error_code == 0
            stale = await c.send(m_oc.OffsetCommitRequest(
                group_id=group, generation_id_or_member_epoch=9, member_id=r4.member_id,
                topics=[m_oc.OffsetCommitRequestTopic(topic, [
                    m_oc.OffsetCommitRequestPartition(0, 5)])]), 6)
            assert stale.topics[0].partitions[0].error_code == E.ILLEGAL_GENERATION
            f1 = await c.send(m_of.OffsetFetchRequest(group_id=group, topics=[
                m_of.OffsetFetchRequestTopic(topic, [0, 7])]), 1)
            assert [(p.partition_index, p.committed_offset, p.metadata)
                    for p in f1.topics[0].partitions] == [(0, 1, "md"), (7, -1, "")]
            f_all = await c.send(m_of.OffsetFetchRequest(group_id=group, topics=None), 5)
            assert [(t.name, [p.committed_offset for p in t.partitions])
                    for t in f_all.topics] == [(topic, [1])]
            d = await c.send(m_dg.DescribeGroupsRequest(groups=[group, "no-such-group"]), 0)
            assert (d.groups[0].group_state, d.groups[0].protocol_data) == ("Stable", "range")
            assert d.groups[0].members[0].member_assignment == b"asg"
            assert d.groups[0].members[0].client_host == "/127.0.0.1"
            # A group that does not exist (here, or coordinated elsewhere): Dead or NOT_COORDINATOR.
            assert (d.groups[1].group_state == "Dead") or d.groups[1].error_code == E.NOT_COORDINATOR
            # LeaveGroup v3: several members at once, each with its own answer.
            lv = await c.send(m_lg.LeaveGroupRequest(group_id=group, members=[
                m_lg.MemberIdentity(r4.member_id), m_lg.MemberIdentity("ghost")]), 3)
            assert lv.error_code == 0
            assert [(m.member_id, m.error_code) for m in lv.members] == [
                (r4.member_id, 0), ("ghost", E.UNKNOWN_MEMBER_ID)]
            hb = await c.send(m_hb.HeartbeatRequest(group, 1, r4.member_id), 3)
            assert hb.error_code == E.UNKNOWN_MEMBER_ID
        finally:
            await c.close()

    asyncio.run(go())


@pytest.mark.parametrize("how", ["kill", "stop"])
def test_a_member_keeps_consuming_when_its_coordinator_goes(real_cluster: RealCluster,
                                                           how: str) -> None:
    """kill -9, or SIGTERM (a controlled shutdown: the broker is told to follow, and unloads
    the group while the member is connected to it)."""
    topic, first = _topic_with_records(real_cluster, 2, 50)
    group = _name("failover-group")
    conf = _consumer_conf(real_cluster, group)
    c = confluent_kafka.Consumer(conf)
    coordinator = _coordinator_of(real_cluster, group)
    try:
        c.subscribe([topic])
        got: set[bytes] = set()
        deadline = time.monotonic() + 60
        while got != first and time.monotonic() < deadline:
            got.update(m.value() for m in c.consume(100, timeout=0.5) if m.error() is None)
        assert got == first
        c.commit(asynchronous=False)
        (real_cluster.kill if how == "kill" else real_cluster.stop)(coordinator)
        try:
            _, more = _topic_with_records(real_cluster, 2, 50, start=50, topic=topic)
            got = set()
            deadline = time.monotonic() + 60
            while got != more and time.monotonic() < deadline:
                got.update(m.value() for m in c.consume(100, timeout=0.5) if m.error() is None)
            assert got == more
            # Commits reach the new coordinator: the leader elected for the offsets partition.
            def committed_all() -> bool:
                try:
                    c.commit(asynchronous=False)
                except confluent_kafka.KafkaException:
                    return False
                tps = c.committed([confluent_kafka.TopicPartition(topic, p) for p in (0, 1)],
                                  timeout=5)
                return sum(tp.offset for tp in tps) == 100
            wait_for(committed_all, timeout_s=60, what="a commit after the coordinator moved")
            admin = AdminClient({"bootstrap.servers": real_cluster.bootstrap})
            desc = admin.describe_consumer_groups([group])[group].result(timeout=15)
            assert desc.coordinator.id == _coordinator_of(real_cluster, group) != coordinator
            assert str(desc.state).endswith("STABLE") and len(desc.members) == 1
        finally:
            real_cluster.start(coordinator)
            offsets_partition = partition_for(group, OFFSETS_PARTITIONS)
            wait_for(lambda: (s := real_cluster.state(GROUP_METADATA_TOPIC_NAME,
                                                      offsets_partition)) and coordinator in s.isr,
                     timeout_s=60, what="the restarted broker in the ISR")
    finally:
        c.close()


def test_confluent_static_member_restarts_into_its_assignment(real_cluster: RealCluster) -> None:
    topic, first = _topic_with_records(real_cluster, 2, 20)
    group = _name("static-group")
    conf = {**_consumer_conf(real_cluster, group), "group.instance.id": "host-a"}
    admin = AdminClient({"bootstrap.servers": real_cluster.bootstrap})

    def consume(expected: set[bytes]) -> str:
        c = confluent_kafka.Consumer(conf)
        try:
            c.subscribe([topic])
            got: set[bytes] = set()
            deadline = time.monotonic() + 60
            while got != expected and time.monotonic() < deadline:
                got.update(m.value() for m in c.consume(100, timeout=0.5) if m.error() is None)
            assert got == expected
            c.commit(asynchronous=False)
            desc = admin.describe_consumer_groups([group])[group].result(timeout=15)
            assert [m.group_instance_id for m in desc.members] == ["host-a"]
            return str(desc.members[0].member_id)
        finally:
            c.close()

    first_id = consume(first)
    # A static member does not leave on close: the restarted one takes its place (new id).
    _, more = _topic_with_records(real_cluster, 2, 20, start=20, topic=topic)
    assert consume(more) != first_id
