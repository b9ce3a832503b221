"""AlterPartition (KIP-497) on the wire at the controller broker (`broker.alter_partition.
handle_alter_partition`, Kafka's KafkaApis.handleAlterPartitionRequest and
KafkaController.tryProcessAlterPartition): the answers that depend on the request's version
and the order of the checks, over the real controller core and executor."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from test_zk_interface import three_brokers_with_topic
from test_zk_interface import zk as zk  # the fixture: both ZooKeepers

from tidelog.broker.alter_partition import handle_alter_partition
from tidelog.controller.core import ControllerCore
from tidelog.controller.executor import AlterPartitionOutcome, DecisionExecutor
from tidelog.controller.zk_interface import ZooKeeperClient
from tidelog.protocol.errors import ErrorCode
from tidelog.protocol.messages import alter_partition as m_ap
from tidelog.replication.types import ProposeIsr

TOPIC_ID = uuid.UUID(int=7)


class ActiveController:
    """What `handle_alter_partition` uses of the active KafkaController: its topic ids and its
    AlterPartitionReceived event, here run at once (no event queue)."""

    is_active = True

    def __init__(self, core: ControllerCore, executor: DecisionExecutor) -> None:
        self.core = core
        self.executor = executor
        self.topic_ids = {"t": TOPIC_ID}

    async def alter_partition(self, broker_id: int, broker_epoch: int,
                              proposals: list[ProposeIsr]) -> AlterPartitionOutcome:
        return self.executor.alter_partition(broker_id, broker_epoch, proposals)


def request(new_isr: list[int], *, broker_epoch: int = 11, topic_id: uuid.UUID = TOPIC_ID,
            ) -> m_ap.AlterPartitionRequest:
    """Leader 1's proposal for t-0 at leader epoch 0, zk version 0 (both name and id set: the
    version sent decides which one is read)."""
    return m_ap.AlterPartitionRequest(1, broker_epoch, [m_ap.TopicData(
        topic_name="t", topic_id=topic_id, partitions=[m_ap.PartitionData(
            partition_index=0, leader_epoch=0, new_isr=new_isr,
            new_isr_with_epochs=[m_ap.BrokerState(b, -1) for b in new_isr],
            partition_epoch=0)])])


def answer(zk: ZooKeeperClient, req: m_ap.AlterPartitionRequest,
           version: int) -> m_ap.AlterPartitionResponse:
    core, executor = three_brokers_with_topic(zk, {0: [1, 2, 3]})
    return asyncio.run(handle_alter_partition(ActiveController(core, executor), req, version))


@pytest.mark.parametrize(("version", "error"), [
    (0, ErrorCode.OPERATION_NOT_ATTEMPTED), (1, ErrorCode.OPERATION_NOT_ATTEMPTED),
    (2, ErrorCode.INELIGIBLE_REPLICA), (3, ErrorCode.INELIGIBLE_REPLICA)])
def test_an_ineligible_member_is_answered_in_the_versions_words(
        zk: ZooKeeperClient, version: int, error: ErrorCode) -> None:
    """KIP-841's INELIGIBLE_REPLICA is AlterPartition v2+; before, Kafka answers
    OPERATION_NOT_ATTEMPTED (both send the leader back to its committed ISR)."""
    resp = answer(zk, request([1, 2, 4]), version)  # broker 4 is not registered
    assert resp.error_code == 0
    assert [(p.partition_index, p.error_code) for t in resp.topics for p in t.partitions] == [
        (0, error)]


def test_the_broker_epoch_is_checked_before_the_topic_ids(zk: ZooKeeperClient) -> None:
    """Kafka refuses a request from another registration whole, whatever topics it names."""
    resp = answer(zk, request([1, 2], broker_epoch=10, topic_id=uuid.UUID(int=8)), 2)
    assert resp.error_code == ErrorCode.STALE_BROKER_EPOCH and resp.topics == []


def test_an_unknown_topic_id_from_the_current_registration(zk: ZooKeeperClient) -> None:
    resp = answer(zk, request([1, 2], topic_id=uuid.UUID(int=8)), 2)
    assert resp.error_code == 0
    assert [(t.topic_id, [(p.partition_index, p.error_code) for p in t.partitions])
            for t in resp.topics] == [(uuid.UUID(int=8), [(0, ErrorCode.UNKNOWN_TOPIC_ID)])]
