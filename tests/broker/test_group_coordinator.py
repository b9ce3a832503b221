"""The consumer group coordinator with real clients: subscribe, rebalance between members,
commit and resume from committed offsets (stored in ZooKeeper); plus the protocol's error codes
over the wire."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from harness import ActingController, BrokerThread, broker_props, new_chroot, send

from tidelog.cluster.zookeeper import ZooKeeperServer
from tidelog.protocol.errors import ErrorCode
from tidelog.protocol.messages import find_coordinator as m_fc
from tidelog.protocol.messages import heartbeat as m_hb
from tidelog.protocol.messages import join_group as m_jg
from tidelog.protocol.messages import offset_commit as m_oc
from tidelog.protocol.messages import offset_fetch as m_of
from tidelog.protocol.messages import sync_group as m_sg

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def gbroker(zookeeper: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerThread, ActingController]]:
    zk = new_chroot(zookeeper)
    b = BrokerThread(broker_props(1, zk, tmp_path_factory.mktemp("groups"),
                                  **{"group.initial.rebalance.delay.ms": 0})).start()
    ctl = ActingController(zk, [b])
    try:
        yield b, ctl
    finally:
        ctl.close()
        b.stop()


def _produce(bootstrap: str, topic: str, values: list[bytes], partitions: int) -> None:
    import confluent_kafka

    p = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for i, v in enumerate(values):
        p.produce(topic, v, partition=i % partitions)
    assert p.flush(30) == 0


def _consume(consumer: Any, n: int, timeout_s: float = 30) -> list[bytes]:
    got: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < n and time.monotonic() < deadline:
        msg = consumer.poll(0.2)
        if msg is None:
            continue
        assert msg.error() is None, msg.error()
        got.append(msg.value())
    return got


def test_confluent_group_consume_commit_and_resume(gbroker: tuple[BrokerThread, ActingController]) -> None:
    confluent_kafka = pytest.importorskip("confluent_kafka")
    b, ctl = gbroker
    ctl.create_topic("grp", {0: [1], 1: [1]})
    values = [b"m%d" % i for i in range(40)]
    _produce(b.bootstrap, "grp", values, 2)
    conf = {"bootstrap.servers": b.bootstrap, "group.id": "g1", "auto.offset.reset": "earliest",
            "enable.auto.commit": False, "session.timeout.ms": 6000}
    c = confluent_kafka.Consumer(conf)
    c.subscribe(["grp"])
    try:
        got = _consume(c, len(values))
        assert sorted(got) == sorted(values)
        c.commit(asynchronous=False)
        committed = c.committed([confluent_kafka.TopicPartition("grp", 0), confluent_kafka.TopicPartition("grp", 1)])
        assert sorted(tp.offset for tp in committed) == [20, 20]
    finally:
        c.close()
    # A new member of the same group resumes after the committed offsets.
    more = [b"n%d" % i for i in range(6)]
    _produce(b.bootstrap, "grp", more, 2)
    c = confluent_kafka.Consumer(conf)
    c.subscribe(["grp"])
    try:
        assert sorted(_consume(c, len(more))) == sorted(more)
        assert _consume(c, 1, timeout_s=1.0) == []
    finally:
        c.close()


def test_two_members_share_the_partitions(gbroker: tuple[BrokerThread, ActingController]) -> None:
    confluent_kafka = pytest.importorskip("confluent_kafka")
    b, ctl = gbroker
    ctl.create_topic("share", {0: [1], 1: [1]})
    conf = {"bootstrap.servers": b.bootstrap, "group.id": "g2", "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000}
    c1, c2 = confluent_kafka.Consumer(conf), confluent_kafka.Consumer(conf)
    try:  # c2 is closed inside
        c1.subscribe(["share"])
        c2.subscribe(["share"])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            c1.poll(0.1)
            c2.poll(0.1)
            a1, a2 = c1.assignment(), c2.assignment()
            if len(a1) == 1 and len(a2) == 1:
                break
        assert {tp.partition for tp in c1.assignment()} | {tp.partition for tp in c2.assignment()} == {0, 1}
        assert len(c1.assignment()) == len(c2.assignment()) == 1
        # A member leaves (LeaveGroup): the group rebalances and the other takes over.
        c2.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(c1.assignment()) != 2:
            c1.poll(0.1)
        assert {tp.partition for tp in c1.assignment()} == {0, 1}
    finally:
        c1.close()


def test_kafka_python_group_consumer(gbroker: tuple[BrokerThread, ActingController]) -> None:
    kafka = pytest.importorskip("kafka")
    b, ctl = gbroker
    ctl.create_topic("kpg", {0: [1]})
    values = [b"k%d" % i for i in range(10)]
    _produce(b.bootstrap, "kpg", values, 1)
    consumer = kafka.KafkaConsumer("kpg", bootstrap_servers=b.bootstrap, group_id="g3",
                                   auto_offset_reset="earliest", consumer_timeout_ms=15000,
                                   enable_auto_commit=False)
    try:
        got = []
        for msg in consumer:
            got.append(msg.value)
            if len(got) == len(values):
                break
        consumer.commit()
        assert got == values
        tp = kafka.TopicPartition("kpg", 0)
        assert consumer.committed(tp) == 10
    finally:
        consumer.close()


# ---------------------------------------------------------------- protocol details


def test_join_sync_heartbeat_over_the_wire(gbroker: tuple[BrokerThread, ActingController]) -> None:
    import asyncio

    from tidelog.client.connection import BrokerConnection

    b, ctl = gbroker
    ctl.create_topic("wire", {0: [1]})
    fc = send(b.port, m_fc.FindCoordinatorRequest(key="gw"), 3)
    assert (fc.error_code, fc.node_id, fc.port) == (0, 1, b.port)

    async def scenario() -> None:
        conn = BrokerConnection("127.0.0.1", b.port)
        await conn.connect()
        try:
            join = m_jg.JoinGroupRequest(group_id="gw", session_timeout_ms=6000, rebalance_timeout_ms=5000,
                                         member_id="", protocol_type="consumer",
                                         protocols=[m_jg.JoinGroupRequestProtocol("range", b"meta")])
            first = await conn.send(join, 5)
            assert first.error_code == ErrorCode.MEMBER_ID_REQUIRED and first.member_id
            join.member_id = first.member_id
            joined = await conn.send(join, 5)
            assert joined.error_code == 0 and joined.leader == first.member_id
            assert [(m.member_id, m.metadata) for m in joined.members] == [(first.member_id, b"meta")]
            gen = joined.generation_id
            sync = await conn.send(m_sg.SyncGroupRequest(group_id="gw", generation_id=gen, member_id=first.member_id,
                                                         assignments=[m_sg.SyncGroupRequestAssignment(first.member_id, b"a")]), 3)
            assert (sync.error_code, sync.assignment) == (0, b"a")
            hb = await conn.send(m_hb.HeartbeatRequest(group_id="gw", generation_id=gen, member_id=first.member_id), 3)
            assert hb.error_code == 0
            hb = await conn.send(m_hb.HeartbeatRequest(group_id="gw", generation_id=gen + 5, member_id=first.member_id), 3)
            assert hb.error_code == ErrorCode.ILLEGAL_GENERATION
            hb = await conn.send(m_hb.HeartbeatRequest(group_id="gw", generation_id=gen, member_id="nobody"), 3)
            assert hb.error_code == ErrorCode.UNKNOWN_MEMBER_ID
            bad = m_jg.JoinGroupRequest(group_id="gw", session_timeout_ms=10, member_id="",
                                        protocol_type="consumer",
                                        protocols=[m_jg.JoinGroupRequestProtocol("range", b"")])
            assert (await conn.send(bad, 5)).error_code == ErrorCode.INVALID_SESSION_TIMEOUT
            other = m_jg.JoinGroupRequest(group_id="gw", session_timeout_ms=6000, member_id="",
                                          protocol_type="connect",
                                          protocols=[m_jg.JoinGroupRequestProtocol("x", b"")])
            assert (await conn.send(other, 3)).error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
            # Commits: by the member at its generation; "simple" commits refused while it is in.
            commit = m_oc.OffsetCommitRequest(group_id="gw", generation_id_or_member_epoch=gen,
                                              member_id=first.member_id, topics=[m_oc.OffsetCommitRequestTopic(
                                                  "wire", [m_oc.OffsetCommitRequestPartition(0, 7, committed_metadata="md"),
                                                           m_oc.OffsetCommitRequestPartition(9, 1)])])
            resp = await conn.send(commit, 8)
            assert [(p.partition_index, p.error_code) for p in resp.topics[0].partitions] == [
                (0, 0), (9, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)]
            commit.generation_id_or_member_epoch, commit.member_id = -1, ""
            resp = await conn.send(commit, 8)
            assert resp.topics[0].partitions[0].error_code == ErrorCode.ILLEGAL_GENERATION
            fetched = await conn.send(m_of.OffsetFetchRequest(group_id="gw", topics=None), 7)
            assert [(t.name, [(p.partition_index, p.committed_offset, p.metadata) for p in t.partitions])
                    for t in fetched.topics] == [("wire", [(0, 7, "md")])]
        finally:
            await conn.close()

    asyncio.run(scenario())
    # The committed offset is in ZooKeeper, where any future coordinator reads it.
    assert ctl.zk.kazoo.exists("/consumers/gw/offsets/wire/0") is not None


def test_aiokafka_group_consumer(gbroker: tuple[BrokerThread, ActingController]) -> None:
    aiokafka = pytest.importorskip("aiokafka")
    import asyncio

    b, ctl = gbroker
    ctl.create_topic("aiog", {0: [1], 1: [1]})
    values = [b"a%d" % i for i in range(12)]
    _produce(b.bootstrap, "aiog", values, 2)

    async def scenario() -> list[bytes]:
        consumer = aiokafka.AIOKafkaConsumer("aiog", bootstrap_servers=b.bootstrap, group_id="g4",
                                             auto_offset_reset="earliest", enable_auto_commit=False)
        await consumer.start()
        got: list[bytes] = []
        try:
            deadline = time.monotonic() + 30
            while len(got) < len(values) and time.monotonic() < deadline:
                batches = await consumer.getmany(timeout_ms=500)
                for msgs in batches.values():
                    got.extend(m.value for m in msgs)
            await consumer.commit()
        finally:
            await consumer.stop()
        return got

    assert sorted(asyncio.run(scenario())) == sorted(values)
