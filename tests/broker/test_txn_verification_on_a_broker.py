"""transaction.partition.verification.enable on a real broker: on (Kafka's default), a
transactional produce whose coordinator cannot be asked (no __transaction_state yet) is not
appended and answered NOT_ENOUGH_REPLICAS (Kafka's retriable answer for old producers); with
the key set false in server.properties the same produce is appended as before."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from harness import ActingController, BrokerThread, broker_props, send
from zk_chroot import new_chroot

from tidelog.cluster.zookeeper import ZooKeeperServer
from tidelog.protocol.errors import ErrorCode as E
from tidelog.protocol.messages import list_offsets as m_lo
from tidelog.protocol.messages.produce import (
    PartitionProduceData,
    ProduceRequest,
    TopicProduceData,
)
from tidelog.protocol.records.builder import Record, build_batch


def broker_with(zookeeper: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory,
                **props: str) -> Iterator[tuple[BrokerThread, ActingController]]:
    zk = new_chroot(zookeeper)
    b = BrokerThread(broker_props(1, zk, tmp_path_factory.mktemp("verification"), **props)
                     ).start()
    c = ActingController(zk, [b])
    try:
        yield b, c
    finally:
        c.close()
        b.stop()


@pytest.fixture(scope="module")
def verification_by_default(zookeeper: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory
                            ) -> Iterator[tuple[BrokerThread, ActingController]]:
    yield from broker_with(zookeeper, tmp_path_factory)


@pytest.fixture(scope="module")
def verification_off(zookeeper: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory
                     ) -> Iterator[tuple[BrokerThread, ActingController]]:
    yield from broker_with(zookeeper, tmp_path_factory,
                           **{"transaction.partition.verification.enable": "false"})


def txn_produce(port: int, topic: str) -> int:
    batch = build_batch([Record(value=b"v")], producer_id=4000, producer_epoch=0,
                        base_sequence=0, transactional=True)
    r = send(port, ProduceRequest(transactional_id="tx", acks=-1, timeout_ms=10000, topic_data=[
        TopicProduceData(topic, [PartitionProduceData(0, bytes(batch))])]), 9)
    return int(r.responses[0].partition_responses[0].error_code)


def log_end(port: int, topic: str) -> int:
    r = send(port, m_lo.ListOffsetsRequest(replica_id=-1, topics=[m_lo.ListOffsetsTopic(
        topic, [m_lo.ListOffsetsPartition(partition_index=0, timestamp=-1)])]), 4)
    return int(r.topics[0].partitions[0].offset)


def test_a_transactional_produce_is_verified_by_default(
        verification_by_default: tuple[BrokerThread, ActingController]) -> None:
    broker, controller = verification_by_default
    controller.create_topic("verified", {0: [1]})
    assert txn_produce(broker.port, "verified") == E.NOT_ENOUGH_REPLICAS
    assert log_end(broker.port, "verified") == 0


def test_with_verification_off_a_transactional_produce_is_appended_as_before(
        verification_off: tuple[BrokerThread, ActingController]) -> None:
    broker, controller = verification_off
    controller.create_topic("unverified", {0: [1]})
    assert txn_produce(broker.port, "unverified") == 0
    assert log_end(broker.port, "unverified") == 1
