"""The controller channel's request building (every version a broker may negotiate) and the
merging of requests queued back to back for one broker."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tidelog.controller import core
from tidelog.controller.channel_manager import (
    ControllerChannelManager,
    build_leader_and_isr,
    build_stop_replica,
    build_update_metadata,
    merge_requests,
)
from tidelog.controller.zk_data import BrokerEndPoint, BrokerInfo
from tidelog.protocol.api_keys import ApiKey, api_spec
from tidelog.protocol.codec import decode_request, encode_request
from tidelog.protocol.primitives import ZERO_UUID
from tidelog.replication.types import LeaderAndIsrPartitionState, TopicPartition

BROKERS = {
    b: BrokerInfo(b, (BrokerEndPoint("PLAINTEXT", "127.0.0.1", 9000 + b),
                      BrokerEndPoint("REPLICATION", "127.0.0.1", 9100 + b)))
    for b in (1, 2, 3)
}


def st(topic: str, p: int, leader: int, epoch: int, isr: tuple[int, ...],
       replicas: tuple[int, ...] = (1, 2, 3), zk_version: int = 0) -> LeaderAndIsrPartitionState:
    return LeaderAndIsrPartitionState(topic=topic, partition=p, controller_epoch=5, leader=leader,
                                      leader_epoch=epoch, isr=isr, zk_version=zk_version,
                                      replicas=replicas, is_new=epoch == 0)


def roundtrip(msg: object, version: int) -> object:
    frame = b"".join(bytes(x) for x in encode_request(msg, version, 7, "controller-1"))
    header, body = decode_request(memoryview(frame)[4:])
    assert header.request_api_version == version and header.correlation_id == 7
    return body


def partitions_of(body: object) -> dict[tuple[str, int], object]:
    out: dict[tuple[str, int], object] = {}
    for p in getattr(body, "ungrouped_partition_states", []):
        out[(p.topic_name, p.partition_index)] = p
    for t in getattr(body, "topic_states", []):
        for p in t.partition_states:
            out[(t.topic_name, p.partition_index)] = p
    return out


@pytest.mark.parametrize("version", range(api_spec(ApiKey.LEADER_AND_ISR).min_version, 6))
def test_leader_and_isr_every_version(version: int) -> None:
    req = core.LeaderAndIsrRequest(1, 5, 77, (st("a", 0, 2, 3, (2, 3)), st("b", 1, 3, 0, (3,))),
                                   (2, 3))
    ids = {"a": uuid.uuid4()}
    body = roundtrip(build_leader_and_isr(req, BROKERS, version, "REPLICATION", ids), version)
    if version >= 5:  # topic ids (Kafka 2.8+): a replica keeps its topic's
        assert {t.topic_name: t.topic_id for t in body.topic_states} == {
            "a": ids["a"], "b": ZERO_UUID}
    assert body.controller_id == 1 and body.controller_epoch == 5
    if version >= 2:
        assert body.broker_epoch == 77
    parts = partitions_of(body)
    assert set(parts) == {("a", 0), ("b", 1)}
    a0 = parts[("a", 0)]
    assert (a0.leader, a0.leader_epoch, a0.isr, a0.replicas) == (2, 3, [2, 3], [1, 2, 3])
    # followers reach leaders on the inter-broker listener
    assert {(x.broker_id, x.port) for x in body.live_leaders} == {(2, 9102), (3, 9103)}


@pytest.mark.parametrize("version", range(0, 7))
def test_update_metadata_every_version(version: int) -> None:
    req = core.UpdateMetadataRequest(1, 5, 77, (st("a", 0, 2, 3, (2, 3)),), ((1, 70), (2, 71)))
    body = roundtrip(build_update_metadata(req, BROKERS, version), version)
    assert sorted(b.id for b in body.live_brokers) == [1, 2]
    part = partitions_of(body)[("a", 0)]
    assert part.leader == 2 and part.isr == [2, 3]
    if version >= 4:
        assert part.offline_replicas == [3]  # assigned, not alive
    if version >= 3:
        b1 = next(b for b in body.live_brokers if b.id == 1)
        assert {(e.listener, e.port) for e in b1.endpoints} == {("PLAINTEXT", 9001),
                                                                 ("REPLICATION", 9101)}


@pytest.mark.parametrize("version", range(0, 4))
@pytest.mark.parametrize("delete", [False, True])
def test_stop_replica_every_version(version: int, delete: bool) -> None:
    tps = (TopicPartition("a", 0), TopicPartition("a", 2), TopicPartition("b", 1))
    req = core.StopReplicaRequest(1, 5, 77, tps, delete)
    body = roundtrip(build_stop_replica(req, version, {TopicPartition("a", 0): 4}), version)
    if version == 0:
        got = {(p.topic_name, p.partition_index) for p in body.ungrouped_partitions}
    elif version < 3:
        got = {(t.name, p) for t in body.topics for p in t.partition_indexes}
    else:
        got = {(t.topic_name, p.partition_index) for t in body.topic_states
               for p in t.partition_states}
        flags = {p.delete_partition for t in body.topic_states for p in t.partition_states}
        assert flags == {delete}
        epochs = {(t.topic_name, p.partition_index): p.leader_epoch for t in body.topic_states
                  for p in t.partition_states}
        assert epochs[("a", 0)] == (-2 if delete else 4)
    if version < 3:
        assert body.delete_partitions == delete
    assert got == {("a", 0), ("a", 2), ("b", 1)}


def test_back_to_back_requests_merge_later_state_winning() -> None:
    first = core.LeaderAndIsrRequest(1, 5, 77, (st("a", 0, 1, 1, (1, 2)), st("a", 1, 2, 0, (2,))),
                                     (1, 2))
    second = core.LeaderAndIsrRequest(1, 5, 77, (st("a", 0, 2, 2, (2,)),), (2,))
    merged = merge_requests(first, second)
    assert isinstance(merged, core.LeaderAndIsrRequest)
    by_tp = {s.tp: s for s in merged.partition_states}
    assert by_tp[TopicPartition("a", 0)].leader_epoch == 2
    assert TopicPartition("a", 1) in by_tp
    assert merged.live_leaders == (1, 2)
    um1 = core.UpdateMetadataRequest(1, 5, 77, (st("a", 0, 1, 1, (1,)),), ((1, 70),))
    um2 = core.UpdateMetadataRequest(1, 5, 77, (st("a", 0, 2, 2, (2,)),), ((1, 70), (2, 71)))
    m = merge_requests(um1, um2)
    assert isinstance(m, core.UpdateMetadataRequest)
    assert m.live_brokers == ((1, 70), (2, 71)) and m.partition_states[0].leader == 2
    # the replicas on failed log dirs: the later request's whole map
    offline = ((TopicPartition("a", 0), (1,)),)
    um3 = core.UpdateMetadataRequest(1, 5, 77, (st("a", 1, 2, 2, (2,)),), ((1, 70),), offline)
    m = merge_requests(um1, um3)
    assert isinstance(m, core.UpdateMetadataRequest) and m.offline_dir_replicas == offline
    # never across kinds, epochs, or stop/delete
    assert merge_requests(first, um1) is None
    assert merge_requests(first, core.LeaderAndIsrRequest(1, 6, 77, (), ())) is None
    assert merge_requests(first, core.LeaderAndIsrRequest(1, 5, 78, (), ())) is None
    s1 = core.StopReplicaRequest(1, 5, 77, (TopicPartition("a", 0),), False)
    s2 = core.StopReplicaRequest(1, 5, 77, (TopicPartition("a", 1),), True)
    assert merge_requests(s1, s2) is None
    s3 = core.StopReplicaRequest(1, 5, 77, (TopicPartition("b", 0),), False)
    merged_stop = merge_requests(s1, s3)
    assert isinstance(merged_stop, core.StopReplicaRequest)
    assert merged_stop.partitions == (TopicPartition("a", 0), TopicPartition("b", 0))


def test_a_failing_response_hook_does_not_end_the_brokers_channel() -> None:
    """`on_response` runs in the broker's sender task: an exception escaping it would end the
    task, and the controller would send that broker nothing more."""
    seen: list[int] = []

    def hook(broker_id: int, request: core.ControllerRequest, response: Any) -> None:
        seen.append(broker_id)
        raise RuntimeError("the controller's handler failed")

    manager = ControllerChannelManager(1, on_response=hook)
    request = core.LeaderAndIsrRequest(1, 5, 77, (st("a", 0, 1, 1, (1,)),), (1,))
    manager.on_response(2, request, object())
    assert seen == [2] and manager.sent == {"LeaderAndIsrRequest": 1}
