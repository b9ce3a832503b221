"""Requests that decode but carry odd values (negative partitions and offsets, empty lists,
absurd sizes, unknown names) are answered with error codes — never a handler crash (which would
close the connection) and never a hang — and the broker keeps serving."""

from __future__ import annotations

from typing import Any

import pytest
from harness import ActingController, BrokerThread, fetch_request, produce_request, send

from tidelog.protocol.messages import create_topics as m_ct
from tidelog.protocol.messages import delete_topics as m_dt
from tidelog.protocol.messages import describe_configs as m_dc
from tidelog.protocol.messages import leader_and_isr as m_lai
from tidelog.protocol.messages import list_offsets as m_lo
from tidelog.protocol.messages import metadata as m_md
from tidelog.protocol.messages import offset_for_leader_epoch as m_ofle
from tidelog.protocol.messages import produce as m_produce
from tidelog.protocol.messages import stop_replica as m_sr
from tidelog.protocol.messages import update_metadata as m_um
from tidelog.protocol.messages.api_versions import ApiVersionsRequest
from tidelog.protocol.records.builder import build_values

pytestmark = pytest.mark.integration


def _odd_requests() -> list[tuple[str, Any]]:
    fetch_neg = fetch_request("odd", -1, -5)
    fetch_neg.max_bytes = -1
    fetch_huge_wait = fetch_request("odd", 0, 0, max_wait_ms=-1, min_bytes=-1)
    garbage_batch = produce_request("odd", 0, b"\x00" * 70)
    empty_produce = m_produce.ProduceRequest(acks=1, timeout_ms=0, topic_data=[])
    dup_produce = m_produce.ProduceRequest(acks=1, timeout_ms=100, topic_data=[
        m_produce.TopicProduceData("odd", [m_produce.PartitionProduceData(0, bytes(build_values([b"a"]))),
                                           m_produce.PartitionProduceData(0, bytes(build_values([b"b"])))])])
    return [
        ("fetch negative partition/offset/max", fetch_neg),
        ("fetch negative wait and min", fetch_huge_wait),
        ("fetch nothing", m_fetch_empty()),
        ("produce garbage batch", garbage_batch),
        ("produce no topics", empty_produce),
        ("produce one partition twice", dup_produce),
        ("produce negative timeout", produce_request("odd", 0, build_values([b"x"]), acks=-1, timeout_ms=-5)),
        ("list offsets odd", m_lo.ListOffsetsRequest(replica_id=-7, topics=[m_lo.ListOffsetsTopic(
            "odd", [m_lo.ListOffsetsPartition(partition_index=-3, timestamp=-99)])])),
        ("offset for epoch odd", m_ofle.OffsetForLeaderEpochRequest(replica_id=5, topics=[
            m_ofle.OffsetForLeaderTopic("odd", [m_ofle.OffsetForLeaderPartition(0, 99, -4)])])),
        ("metadata empty name", m_md.MetadataRequest(topics=[m_md.MetadataRequestTopic(name="")])),
        ("create topics absurd", m_ct.CreateTopicsRequest(topics=[
            m_ct.CreatableTopic("", -7, -9), m_ct.CreatableTopic("x" * 300, 1, 1),
            m_ct.CreatableTopic("asg", -1, -1, assignments=[m_ct.CreatableReplicaAssignment(5, [9, 9])]),
        ], timeout_ms=-1)),
        ("delete topics odd", m_dt.DeleteTopicsRequest(topic_names=["", "odd/x"], timeout_ms=-1)),
        ("describe configs odd", m_dc.DescribeConfigsRequest(resources=[
            m_dc.DescribeConfigsResource(99, "x", None), m_dc.DescribeConfigsResource(2, "", None)])),
        ("leader and isr for another broker", m_lai.LeaderAndIsrRequest(
            controller_id=9, controller_epoch=1, broker_epoch=-1, topic_states=[
                m_lai.LeaderAndIsrTopicState("odd2", partition_states=[m_lai.LeaderAndIsrPartitionState(
                    partition_index=0, controller_epoch=1, leader=7, leader_epoch=0, isr=[7],
                    partition_epoch=0, replicas=[7, 8])])])),
        ("update metadata empty", m_um.UpdateMetadataRequest(controller_id=1, controller_epoch=1)),
        ("stop replica unknown", m_sr.StopReplicaRequest(controller_id=1, controller_epoch=1, topic_states=[
            m_sr.StopReplicaTopicState("nope", [m_sr.StopReplicaPartitionState(3, -1, True)])])),
    ]


def m_fetch_empty() -> Any:
    req = fetch_request("odd", 0, 0)
    req.topics = []
    return req


@pytest.mark.parametrize("name,request_", _odd_requests(), ids=[n for n, _ in _odd_requests()])
def test_odd_request_is_answered(one_broker: BrokerThread, controller: ActingController,
                                 name: str, request_: Any) -> None:
    if "odd" not in controller.topic_ids:
        controller.create_topic("odd", {0: [1]})
    resp = send(one_broker.port, request_, timeout_ms=10000)
    assert resp is not None
    assert send(one_broker.port, ApiVersionsRequest()).error_code == 0
