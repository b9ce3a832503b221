"""KIP-392 on a real broker (real ZooKeeper, the test as controller and as the follower): a
consumer's fetch held at the leader is looked at again for a preferred read replica when its
wait ends, as Kafka's DelayedFetch completes through readFromLog."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import (
    ActingController,
    BrokerThread,
    broker_props,
    fetch_request,
    produce,
    send,
    wait_until,
)

from tidelog.broker.replica_selector import RACK_AWARE_REPLICA_SELECTOR
from tidelog.protocol.messages import update_metadata as m_um
from tidelog.protocol.records.builder import build_values

pytestmark = pytest.mark.integration

TOPIC = "nearby"


@pytest.fixture
def leader(zk_connect: str, tmp_path: Path) -> Iterator[BrokerThread]:
    b = BrokerThread(broker_props(1, zk_connect, tmp_path / "broker1",
                                  **{"replica.selector.class": RACK_AWARE_REPLICA_SELECTOR})
                     ).start()
    try:
        yield b
    finally:
        b.stop()


def _announce_brokers(controller: ActingController, leader: BrokerThread,
                      racks: dict[int, str]) -> None:
    """UpdateMetadata naming brokers 1 (the leader) and 2 (played by the test) with ``racks``."""
    brokers = [m_um.UpdateMetadataBroker(
        id=bid, v0_host="127.0.0.1", v0_port=leader.port,
        endpoints=[m_um.UpdateMetadataEndpoint(leader.port, "127.0.0.1", "PLAINTEXT", 0)],
        rack=rack) for bid, rack in racks.items()]
    resp = send(leader.port, m_um.UpdateMetadataRequest(
        controller_id=controller.controller_id, controller_epoch=controller.controller_epoch,
        broker_epoch=leader.server.broker_epoch, topic_states=[], live_brokers=brokers))
    assert resp.error_code == 0, resp


@pytest.fixture
def acting(leader: BrokerThread, zk_connect: str) -> Iterator[ActingController]:
    """The test as controller and as broker 2, which follows in the ISR, caught up to 3
    records; the leader knows no endpoint for it yet."""
    controller = ActingController(zk_connect, [leader])
    try:
        controller.create_topic(TOPIC, {0: [1, 2]}, live=[1, 2])
        _announce_brokers(controller, leader, {1: "a"})
        assert produce(leader.port, TOPIC, 0, build_values([b"x", b"y", b"z"]), acks=1)[0] == 0
        send(leader.port, fetch_request(TOPIC, 0, 3, replica_id=2), 12)
        assert leader.partition(TOPIC, 0).high_watermark == 3
        yield controller
    finally:
        controller.close()


def _in_session(session_id: int, epoch: int, max_wait_ms: int = 0) -> Any:
    """A consumer's fetch in rack "b" at offset 3; an incremental one (epoch > 0) lists no
    partition (the consumer's position did not move)."""
    request = fetch_request(TOPIC, 0, 3, max_wait_ms=max_wait_ms)
    request.rack_id, request.session_id, request.session_epoch = "b", session_id, epoch
    if epoch > 0:
        request.topics = []
    return request


def _settled_session(leader: BrokerThread) -> int:
    """A consumer's session whose full fetch named no replica, then one incremental fetch that
    answered nothing (the partition settled in the session): its id."""
    opened = send(leader.port, _in_session(0, 0), 12)
    assert opened.responses[0].partitions[0].preferred_read_replica == -1
    assert opened.session_id > 0
    assert not send(leader.port, _in_session(opened.session_id, 1), 12).responses
    return int(opened.session_id)


def test_a_held_sessionless_fetch_names_a_replica_that_became_eligible_while_it_waited(
        leader: BrokerThread, acting: ActingController) -> None:
    consumer = fetch_request(TOPIC, 0, 3, max_wait_ms=20_000)
    consumer.rack_id = "b"
    answer: dict[str, Any] = {}
    t = threading.Thread(target=lambda: answer.update(resp=send(leader.port, consumer, 12)))
    t.start()
    purgatory = leader.server.replica_manager.core.fetch_purgatory
    wait_until(lambda: leader.call(lambda: len(purgatory)) == 1,
               what="the consumer's fetch held with no replica named")
    # Broker 2 now has an endpoint in the consumer's rack; a record it copies moves the HW
    # and completes the fetch, whose read names broker 2 instead of answering the record.
    _announce_brokers(acting, leader, {1: "a", 2: "b"})
    assert produce(leader.port, TOPIC, 0, build_values([b"w"]), acks=1)[0] == 0
    send(leader.port, fetch_request(TOPIC, 0, 4, replica_id=2), 12)
    t.join(15)
    data = answer["resp"].responses[0].partitions[0]
    assert (data.error_code, data.preferred_read_replica, data.high_watermark) == (0, 2, 4)
    assert not data.records


def test_an_incremental_fetch_names_a_replica_for_a_partition_it_does_not_list(
        leader: BrokerThread, acting: ActingController) -> None:
    """Kafka's incremental fetch reads every partition of its session (readFromLog calls
    findPreferredReadReplica for each): an idle partition the consumer does not list is named
    a preferred read replica as soon as one is eligible, not only once new records come."""
    session_id = _settled_session(leader)
    # Broker 2 gets an endpoint in the consumer's rack; no record comes.
    _announce_brokers(acting, leader, {1: "a", 2: "b"})
    resp = send(leader.port, _in_session(session_id, 2, max_wait_ms=500), 12)
    assert resp.error_code == 0, resp
    answered = [(t.topic, p.partition_index, p.error_code, p.preferred_read_replica)
                for t in resp.responses for p in t.partitions]
    assert answered == [(TOPIC, 0, 0, 2)]


def test_a_held_incremental_fetch_names_a_replica_that_became_eligible_at_its_deadline(
        leader: BrokerThread, acting: ActingController) -> None:
    """Kafka's DelayedFetch expires through readFromLog, which looks at every partition of the
    session again: a follower that got an endpoint in the consumer's rack while the fetch was
    held is named in its answer, without a new record."""
    session_id = _settled_session(leader)
    held = _in_session(session_id, 2, max_wait_ms=3_000)
    answer: dict[str, Any] = {}
    t = threading.Thread(target=lambda: answer.update(resp=send(leader.port, held, 12)))
    t.start()
    session = leader.call(lambda: leader.server.apis.fetch_manager.cache.get(session_id))
    wait_until(lambda: leader.call(lambda: session.waker is not None),
               what="the consumer's incremental fetch held")
    _announce_brokers(acting, leader, {1: "a", 2: "b"})
    t.join(15)
    answered = [(p.partition_index, p.error_code, p.preferred_read_replica, bool(p.records))
                for tr in answer["resp"].responses for p in tr.partitions]
    assert answered == [(0, 0, 2, False)]
