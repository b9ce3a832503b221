"""KafkaApis over the wire against a real broker (real ZooKeeper, the test as controller): each
API's happy path and Kafka's error code for each refusal."""

from __future__ import annotations

import os
import socket
import time
from typing import Any

import pytest
from harness import (
    ActingController,
    BrokerThread,
    fetch,
    fetch_request,
    produce,
    produce_request,
    send,
    values_of,
    wait_until,
)

from tidelog.protocol.errors import ErrorCode
from tidelog.protocol.messages import controlled_shutdown as m_cs
from tidelog.protocol.messages import create_topics as m_ct
from tidelog.protocol.messages import delete_topics as m_dt
from tidelog.protocol.messages import describe_configs as m_dc
from tidelog.protocol.messages import init_producer_id as m_ipi
from tidelog.protocol.messages import list_offsets as m_lo
from tidelog.protocol.messages import metadata as m_md
from tidelog.protocol.messages import offset_for_leader_epoch as m_ofle
from tidelog.protocol.messages import stop_replica as m_sr
from tidelog.protocol.records.builder import build_values

pytestmark = pytest.mark.integration


def _metadata(port: int, topics: list[str] | None, allow_auto: bool = True, version: int | None = None) -> Any:
    req = m_md.MetadataRequest(
        topics=None if topics is None else [m_md.MetadataRequestTopic(name=t) for t in topics],
        allow_auto_topic_creation=allow_auto,
    )
    return send(port, req, version)


# ---------------------------------------------------------------- Produce / Fetch


def test_produce_and_fetch_round_trip_with_offsets(one_broker: BrokerThread, controller: ActingController) -> None:
    controller.create_topic("pf", {0: [1]})
    assert produce(one_broker.port, "pf", 0, build_values([b"a", b"b"]), acks=1) == (0, 0)
    assert produce(one_broker.port, "pf", 0, build_values([b"c"]), acks=-1) == (0, 2)
    data = fetch(one_broker.port, "pf", 0, 0)
    assert data.error_code == 0 and data.high_watermark == 3 and data.last_stable_offset == 3
    assert values_of(data.records) == [b"a", b"b", b"c"]
    # Reading from the middle of a batch returns the whole batch (clients skip the head).
    assert values_of(fetch(one_broker.port, "pf", 0, 1).records) == [b"a", b"b", b"c"]
    assert values_of(fetch(one_broker.port, "pf", 0, 2).records) == [b"c"]
    at_end = fetch(one_broker.port, "pf", 0, 3)
    assert at_end.error_code == 0 and len(at_end.records or b"") == 0
    assert fetch(one_broker.port, "pf", 0, 99).error_code == ErrorCode.OFFSET_OUT_OF_RANGE


def test_unknown_topic_and_bad_produce_input(one_broker: BrokerThread, controller: ActingController) -> None:
    controller.create_topic("bad", {0: [1]}, config={"max.message.bytes": "300"})
    port = one_broker.port
    assert produce(port, "nope", 0, build_values([b"x"]))[0] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert fetch(port, "nope", 0, 0).error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert produce(port, "bad", 7, build_values([b"x"]))[0] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    batch = build_values([b"hello"])
    corrupt = bytearray(batch)
    corrupt[-1] ^= 0xFF  # a record byte: the CRC32C no longer matches
    assert produce(port, "bad", 0, corrupt)[0] == ErrorCode.CORRUPT_MESSAGE
    assert produce(port, "bad", 0, batch[:40])[0] == ErrorCode.CORRUPT_MESSAGE
    assert produce(port, "bad", 0, bytes(batch) + bytes(batch))[0] == ErrorCode.INVALID_RECORD
    assert produce(port, "bad", 0, b"")[0] == ErrorCode.INVALID_RECORD
    big = build_values([os.urandom(400)])  # over the topic's max.message.bytes=300
    assert produce(port, "bad", 0, big)[0] == ErrorCode.MESSAGE_TOO_LARGE
    assert produce(port, "bad", 0, batch, acks=2)[0] == ErrorCode.INVALID_REQUIRED_ACKS
    assert produce(port, "bad", 0, batch, acks=1) == (0, 0)  # nothing bad was written before


def test_failed_acks0_produce_closes_the_connection(one_broker: BrokerThread) -> None:
    from tidelog.protocol.codec import encode_request

    s = socket.create_connection(("127.0.0.1", one_broker.port), timeout=10)
    try:
        frame = b"".join(bytes(b) for b in encode_request(
            produce_request("no-such-topic", 0, build_values([b"x"]), acks=0), 7, 1))
        s.sendall(frame)
        assert s.recv(1) == b""  # Kafka closes so the acks=0 producer notices
    finally:
        s.close()


def test_fetch_long_poll_is_completed_by_a_produce(one_broker: BrokerThread, controller: ActingController) -> None:
    import threading

    controller.create_topic("poll", {0: [1]})
    result: dict[str, Any] = {}

    def consumer() -> None:
        start = time.monotonic()
        result["data"] = fetch(one_broker.port, "poll", 0, 0, max_wait_ms=5000, min_bytes=1)
        result["elapsed"] = time.monotonic() - start

    t = threading.Thread(target=consumer)
    t.start()
    purgatory = one_broker.server.replica_manager.core.fetch_purgatory
    wait_until(lambda: one_broker.call(lambda: len(purgatory)) == 1,
               what="the fetch waiting in the purgatory")
    assert produce(one_broker.port, "poll", 0, build_values([b"wake"]), acks=1)[0] == 0
    t.join(10)
    assert values_of(result["data"].records) == [b"wake"]
    assert result["elapsed"] < 4  # answered by the append, not by the 5 s timeout


def test_a_consumer_fetch_session_answers_only_what_changed(
        one_broker: BrokerThread, controller: ActingController) -> None:
    from tidelog.protocol.messages.fetch import FetchPartition, FetchTopic

    controller.create_topic("sess", {0: [1], 1: [1]})
    port = one_broker.port
    req = fetch_request("sess", 0, 0)
    req.topics[0].partitions.append(FetchPartition(partition=1, fetch_offset=0,
                                                   partition_max_bytes=1 << 20))
    req.session_id, req.session_epoch = 1234, 1
    unknown = send(port, req)
    assert (unknown.error_code, unknown.session_id, unknown.responses) == (
        ErrorCode.FETCH_SESSION_ID_NOT_FOUND, 0, [])
    req.session_id, req.session_epoch = 0, -1  # sessionless
    resp = send(port, req)
    assert resp.error_code == 0 and resp.session_id == 0
    assert [p.partition_index for p in resp.responses[0].partitions] == [0, 1]
    req.session_epoch = 0  # a full fetch opens a session
    full = send(port, req)
    assert full.error_code == 0 and full.session_id != 0
    assert [p.partition_index for p in full.responses[0].partitions] == [0, 1]
    sid = full.session_id
    # Incremental: no partitions listed, nothing changed -> nothing answered.
    incremental = fetch_request("sess", 0, 0)
    incremental.topics = []
    incremental.session_id, incremental.session_epoch = sid, 1
    empty = send(port, incremental)
    assert (empty.error_code, empty.session_id, empty.responses) == (0, sid, [])
    assert produce(port, "sess", 1, build_values([b"x"]), acks=1) == (0, 0)
    incremental.session_epoch = 2
    changed = send(port, incremental)
    assert changed.session_id == sid
    assert [(t.topic, [p.partition_index for p in t.partitions]) for t in changed.responses] == [
        ("sess", [1])]
    assert values_of(changed.responses[0].partitions[0].records) == [b"x"]
    # The same epoch again (a duplicate) is refused as Kafka does.
    stale = send(port, incremental)
    assert (stale.error_code, stale.responses) == (ErrorCode.INVALID_FETCH_SESSION_EPOCH, [])
    # Partition 1's fetch offset moves on: listed in the request, answered with its new HW once.
    incremental.session_epoch = 3
    incremental.topics = [FetchTopic(topic="sess", partitions=[FetchPartition(
        partition=1, fetch_offset=1, partition_max_bytes=1 << 20)])]
    assert send(port, incremental).responses == []  # no records, HW 1 already answered
    # Forgetting partition 0 leaves partition 1; forgetting both closes the session.
    from tidelog.protocol.messages.fetch import ForgottenTopic

    incremental.topics = []
    incremental.session_epoch = 4
    incremental.forgotten_topics_data = [ForgottenTopic(topic="sess", partitions=[0, 1])]
    closed = send(port, incremental)
    assert closed.error_code == 0 and closed.session_id == 0
    incremental.forgotten_topics_data = []
    incremental.session_epoch = 5
    assert send(port, incremental).error_code == ErrorCode.FETCH_SESSION_ID_NOT_FOUND


# ---------------------------------------------------------------- offsets


def test_list_offsets_earliest_latest_and_by_timestamp(one_broker: BrokerThread, controller: ActingController) -> None:
    from tidelog.protocol.records.builder import Record, build_batch

    controller.create_topic("lo", {0: [1]})
    port = one_broker.port
    produce(port, "lo", 0, build_batch([Record(value=b"a", timestamp=1000), Record(value=b"b", timestamp=1001)]))
    produce(port, "lo", 0, build_batch([Record(value=b"c", timestamp=5000)]))

    def ask(ts: int, version: int | None = None, replica_id: int = -1) -> Any:
        req = m_lo.ListOffsetsRequest(replica_id=replica_id, topics=[m_lo.ListOffsetsTopic(
            "lo", [m_lo.ListOffsetsPartition(partition_index=0, timestamp=ts, max_num_offsets=1)])])
        return send(port, req, version).topics[0].partitions[0]

    assert ask(-2).offset == 0
    assert ask(-1).offset == 3
    assert (ask(1001).offset, ask(1001).timestamp) == (1, 1001)  # the first record at or after
    assert (ask(4000).offset, ask(4000).timestamp) == (2, 5000)
    assert ask(9999).offset == -1
    assert ask(-1, version=0).old_style_offsets == [3]
    mx = ask(-3)
    assert (mx.offset, mx.timestamp) == (2, 5000)
    assert ask(-1, replica_id=-2).offset == 3  # the debugging replica id reads the LEO
    wrong = m_lo.ListOffsetsRequest(replica_id=-1, topics=[m_lo.ListOffsetsTopic(
        "lo", [m_lo.ListOffsetsPartition(partition_index=0, timestamp=-1, current_leader_epoch=5)])])
    assert send(port, wrong).topics[0].partitions[0].error_code == ErrorCode.UNKNOWN_LEADER_EPOCH


def test_offset_for_leader_epoch(one_broker: BrokerThread, controller: ActingController) -> None:
    controller.create_topic("ofle", {0: [1]})
    produce(one_broker.port, "ofle", 0, build_values([b"x", b"y"]))
    req = m_ofle.OffsetForLeaderEpochRequest(replica_id=-1, topics=[m_ofle.OffsetForLeaderTopic(
        "ofle", [m_ofle.OffsetForLeaderPartition(partition=0, current_leader_epoch=0, leader_epoch=0),
                 m_ofle.OffsetForLeaderPartition(partition=9, current_leader_epoch=-1, leader_epoch=0)])])
    parts = send(one_broker.port, req).topics[0].partitions
    assert (parts[0].error_code, parts[0].leader_epoch, parts[0].end_offset) == (0, 0, 2)
    assert parts[1].error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


# ---------------------------------------------------------------- metadata and admin


def test_metadata_describes_brokers_topics_and_auto_creates(one_broker: BrokerThread, controller: ActingController) -> None:
    controller.create_topic("md", {0: [1], 1: [1]})
    resp = _metadata(one_broker.port, ["md"])
    assert [(b.node_id, b.port) for b in resp.brokers] == [(1, one_broker.port)]
    assert resp.controller_id == controller.controller_id and resp.cluster_id
    t = resp.topics[0]
    assert (t.error_code, [(p.partition_index, p.leader_id, p.isr_nodes) for p in t.partitions]) == (
        0, [(0, 1, [1]), (1, 1, [1])])
    assert "md" in {t.name for t in _metadata(one_broker.port, None).topics}
    # Unknown topics: auto-created (written to ZooKeeper) and answered LEADER_NOT_AVAILABLE.
    auto = _metadata(one_broker.port, ["auto-made"]).topics[0]
    assert auto.error_code == ErrorCode.LEADER_NOT_AVAILABLE
    assert controller.zk.get_topic_assignment("auto-made") == {0: [1]}
    off = _metadata(one_broker.port, ["not-made"], allow_auto=False).topics[0]
    assert off.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert controller.zk.get_topic_assignment("not-made") is None
    assert _metadata(one_broker.port, ["bad/name"]).topics[0].error_code == ErrorCode.INVALID_TOPIC_EXCEPTION
    assert _metadata(one_broker.port, ["md"], version=0).topics[0].partitions[0].leader_id == 1


def test_create_topics(one_broker: BrokerThread, controller: ActingController) -> None:
    def create(topics: list[m_ct.CreatableTopic], timeout_ms: int = 0, validate_only: bool = False) -> dict[str, Any]:
        resp = send(one_broker.port, m_ct.CreateTopicsRequest(topics=topics, timeout_ms=timeout_ms,
                                                              validate_only=validate_only))
        return {r.name: r for r in resp.topics}

    r = create([m_ct.CreatableTopic("ct1", 3, 1, configs=[m_ct.CreatableTopicConfig("retention.ms", "1000")])])
    assert (r["ct1"].error_code, r["ct1"].num_partitions, r["ct1"].replication_factor) == (0, 3, 1)
    assert controller.zk.get_topic_assignment("ct1") == {0: [1], 1: [1], 2: [1]}
    assert controller.zk.get_topic_config("ct1") == {"retention.ms": "1000"}
    assert create([m_ct.CreatableTopic("ct1", 1, 1)])["ct1"].error_code == ErrorCode.TOPIC_ALREADY_EXISTS
    assert create([m_ct.CreatableTopic("ct2", 1, 3)])["ct2"].error_code == ErrorCode.INVALID_REPLICATION_FACTOR
    assert create([m_ct.CreatableTopic("ct3", 0, 1)])["ct3"].error_code == ErrorCode.INVALID_PARTITIONS
    bad_cfg = create([m_ct.CreatableTopic("ct4", 1, 1, configs=[m_ct.CreatableTopicConfig("no.such", "1")])])
    assert bad_cfg["ct4"].error_code == ErrorCode.INVALID_CONFIG
    dup = create([m_ct.CreatableTopic("ct5", 1, 1), m_ct.CreatableTopic("ct5", 1, 1)])
    assert dup["ct5"].error_code == ErrorCode.INVALID_REQUEST
    assert create([m_ct.CreatableTopic("ct6", 1, 1)], validate_only=True)["ct6"].error_code == 0
    assert controller.zk.get_topic_assignment("ct6") is None
    # With a timeout, the answer waits for the controller to elect leaders; none acts here.
    assert create([m_ct.CreatableTopic("ct7", 1, 1)], timeout_ms=300)["ct7"].error_code == ErrorCode.REQUEST_TIMED_OUT
    defaults = create([m_ct.CreatableTopic("ct8", -1, -1)])["ct8"]
    assert (defaults.error_code, defaults.num_partitions, defaults.replication_factor) == (0, 1, 1)


def test_delete_topics(one_broker: BrokerThread, controller: ActingController) -> None:
    controller.create_topic("gone", {0: [1]})
    resp = send(one_broker.port, m_dt.DeleteTopicsRequest(topic_names=["gone", "never"], timeout_ms=0), 5)
    codes = {r.name: r.error_code for r in resp.responses}
    assert codes == {"gone": 0, "never": ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}
    assert "gone" in controller.zk.get_topic_deletions()
    resp = send(one_broker.port, m_dt.DeleteTopicsRequest(topic_names=["md-x"], timeout_ms=0), 5)
    assert resp.responses[0].error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def test_describe_configs(one_broker: BrokerThread, controller: ActingController) -> None:
    controller.create_topic("dc", {0: [1]}, config={"retention.ms": "12345"})
    req = m_dc.DescribeConfigsRequest(resources=[
        m_dc.DescribeConfigsResource(2, "dc", ["retention.ms", "segment.bytes"]),
        m_dc.DescribeConfigsResource(4, "1", ["replica.lag.time.max.ms", "zookeeper.connect"]),
        m_dc.DescribeConfigsResource(2, "missing", None),
        m_dc.DescribeConfigsResource(4, "7", None),
    ])
    topic, broker, missing, other = send(one_broker.port, req).results
    cfg = {c.name: c for c in topic.configs}
    assert cfg["retention.ms"].value == "12345" and cfg["retention.ms"].config_source == 1
    assert cfg["segment.bytes"].value == str(1024 * 1024 * 1024) and cfg["segment.bytes"].config_source == 5
    bcfg = {c.name: c.value for c in broker.configs}
    assert bcfg["replica.lag.time.max.ms"] == "30000"
    assert bcfg["zookeeper.connect"] == one_broker.config.zk_connect
    assert missing.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert other.error_code == ErrorCode.INVALID_REQUEST
    with_synonyms = m_dc.DescribeConfigsRequest(include_synonyms=True, resources=[
        m_dc.DescribeConfigsResource(2, "dc", ["retention.ms", "max.message.bytes"])])
    cfg = {c.name: c for c in send(one_broker.port, with_synonyms).results[0].configs}
    assert [(s.name, s.value, s.source) for s in cfg["retention.ms"].synonyms] == [
        ("retention.ms", "12345", 1)]  # Kafka 3.9 lists no default for a derived key
    assert [(s.name, s.source) for s in cfg["max.message.bytes"].synonyms] == [("message.max.bytes", 5)]


def test_init_producer_id_hands_out_unique_ids(one_broker: BrokerThread) -> None:
    ids = [send(one_broker.port, m_ipi.InitProducerIdRequest(transactional_id=None)) for _ in range(3)]
    assert [r.error_code for r in ids] == [0, 0, 0]
    pids = [r.producer_id for r in ids]
    assert len(set(pids)) == 3 and all(p >= 0 for p in pids) and [r.producer_epoch for r in ids] == [0, 0, 0]
    # A transactional id is its coordinator's: this broker leads no __transaction_state
    # partition (the topic does not exist with one broker and its replication factor of 3).
    txn = send(one_broker.port, m_ipi.InitProducerIdRequest(transactional_id="tx", transaction_timeout_ms=1000))
    assert txn.error_code == ErrorCode.NOT_COORDINATOR


# ---------------------------------------------------------------- controller requests


def test_stale_controller_and_broker_epochs_are_refused(
    one_broker: BrokerThread, controller: ActingController, module_zk: str
) -> None:
    controller.create_topic("epochs", {0: [1]})
    stale = ActingController(module_zk, [one_broker], controller_epoch=0)
    try:
        stale.states = dict(controller.states)
        stale.topic_ids = dict(controller.topic_ids)
        stale.states[("epochs", 0)] = dict(controller.states[("epochs", 0)], leader_epoch=5)
        resp = stale.send_leader_and_isr("epochs", [0])[1]
        assert resp.error_code == ErrorCode.STALE_CONTROLLER_EPOCH
        with pytest.raises(AssertionError):
            stale.send_update_metadata()
        old_epoch = one_broker.server.broker_epoch - 1
        resp = controller.send_leader_and_isr("epochs", [0], broker_epoch=old_epoch)[1]
        assert resp.error_code == ErrorCode.STALE_BROKER_EPOCH
        # The partition kept its epoch: none of those requests was applied.
        assert one_broker.partition("epochs", 0).leader_epoch == 0
        # An old-format (v1, ungrouped) LeaderAndIsr with the same epoch is refused per partition.
        resp = controller.send_leader_and_isr("epochs", [0], api_version=1)[1]
        assert resp.error_code == 0 and resp.partition_errors[0].error_code == ErrorCode.STALE_CONTROLLER_EPOCH
    finally:
        stale.close()


def test_stop_replica_with_delete_removes_the_log(one_broker: BrokerThread, controller: ActingController) -> None:
    controller.create_topic("stop", {0: [1]})
    produce(one_broker.port, "stop", 0, build_values([b"x"]))
    log_dir = one_broker.call(lambda: one_broker.server.log_manager.get_log("stop", 0).dir)
    assert os.path.isdir(log_dir)
    req = m_sr.StopReplicaRequest(controller_id=1, controller_epoch=1, broker_epoch=one_broker.server.broker_epoch,
                                  topic_states=[m_sr.StopReplicaTopicState("stop", [
                                      m_sr.StopReplicaPartitionState(0, 0, True)])])
    resp = send(one_broker.port, req)
    assert resp.error_code == 0 and [(e.topic_name, e.error_code) for e in resp.partition_errors] == [("stop", 0)]
    assert not os.path.isdir(log_dir)
    # The cluster still lists the partition (no new UpdateMetadata): NOT_LEADER_OR_FOLLOWER.
    assert produce(one_broker.port, "stop", 0, build_values([b"y"]))[0] == ErrorCode.NOT_LEADER_OR_FOLLOWER


def test_controlled_shutdown_without_a_controller_here(one_broker: BrokerThread) -> None:
    resp = send(one_broker.port, m_cs.ControlledShutdownRequest(broker_id=1, broker_epoch=-1))
    assert resp.error_code == ErrorCode.NOT_CONTROLLER


def test_request_from_an_old_client_header_version(one_broker: BrokerThread) -> None:
    """Metadata v0 (kafka-python's oldest probe) is still served."""
    resp = _metadata(one_broker.port, [], version=0)
    assert resp.brokers and resp.brokers[0].node_id == 1
    assert "md" in {t.name for t in resp.topics}  # v0: an empty list means every topic


def test_stop_replica_from_an_older_leader_epoch_is_fenced(one_broker: BrokerThread, controller: ActingController) -> None:
    controller.create_topic("fence", {0: [1]})
    controller.change_leader("fence", 0, leader=1, isr=[1])  # leader epoch 1
    assert one_broker.partition("fence", 0).leader_epoch == 1

    def stop(epoch: int) -> Any:
        return send(one_broker.port, m_sr.StopReplicaRequest(
            controller_id=1, controller_epoch=1, broker_epoch=one_broker.server.broker_epoch,
            topic_states=[m_sr.StopReplicaTopicState("fence", [m_sr.StopReplicaPartitionState(0, epoch, False)])]))

    resp = stop(0)
    assert resp.error_code == 0 and resp.partition_errors[0].error_code == ErrorCode.FENCED_LEADER_EPOCH
    assert one_broker.partition("fence", 0).is_leader
    resp = stop(1)
    assert resp.partition_errors[0].error_code == 0
    stale = send(one_broker.port, m_sr.StopReplicaRequest(
        controller_id=1, controller_epoch=0, broker_epoch=-1,
        topic_states=[m_sr.StopReplicaTopicState("fence", [m_sr.StopReplicaPartitionState(0, -1, True)])]))
    assert stale.error_code == ErrorCode.STALE_CONTROLLER_EPOCH
    assert one_broker.partition("fence", 0) is not None


def test_acks0_produce_is_written_without_an_answer(one_broker: BrokerThread, controller: ActingController) -> None:
    import asyncio

    from tidelog.client.connection import BrokerConnection
    from tidelog.protocol.messages.api_versions import ApiVersionsRequest

    controller.create_topic("fire", {0: [1]})

    async def scenario() -> int:
        conn = BrokerConnection("127.0.0.1", one_broker.port)
        await conn.connect()
        try:
            for i in range(3):
                await conn.send_no_response(produce_request("fire", 0, build_values([b"%d" % i]), acks=0))
            # The next request's answer proves the connection stayed in step (no stray responses).
            return (await conn.send(ApiVersionsRequest())).error_code
        finally:
            await conn.close()

    assert asyncio.run(scenario()) == 0
    assert values_of(fetch(one_broker.port, "fire", 0, 0).records) == [b"0", b"1", b"2"]
