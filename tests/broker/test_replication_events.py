"""`tidelog.replication.events.enable`: a real leader publishes its ISR expand and shrink, its
election and its HW checkpoints to `__replication_events` (created by the broker itself), read
back with tidelog's consumer; with the key unset nothing is published."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import ActingController, BrokerThread, broker_props, produce, wait_until
from zk_chroot import new_chroot

from tidelog.broker.replication_events import (
    EVENTS_TOPIC,
    ReplicationEvent,
    ReplicationEventPublisher,
    read_events,
)
from tidelog.cluster.zookeeper import ZooKeeperServer
from tidelog.protocol.errors import ErrorCode
from tidelog.protocol.records.builder import build_values

pytestmark = pytest.mark.integration

LAG_MS = 1500


@pytest.fixture
def zk(zookeeper: ZooKeeperServer) -> str:
    return new_chroot(zookeeper)


@pytest.fixture
def brokers(zk: str, tmp_path: Path) -> Iterator[list[BrokerThread]]:
    started: list[BrokerThread] = []
    extra = {"replica.lag.time.max.ms": LAG_MS,
             "replica.high.watermark.checkpoint.interval.ms": 300}
    try:
        # Broker 1 alone first: it creates the events topic with RF min(3, live) = 1 on itself.
        started.append(BrokerThread(broker_props(
            1, zk, tmp_path / "b1", tidelog_replication_events_enable="true", **extra)).start())
        yield started
    finally:
        for b in started:
            b.stop()


def _events(bootstrap: str) -> list[ReplicationEvent]:
    return asyncio.run(read_events(bootstrap, timeout_s=20))


def test_shrink_expand_election_and_checkpoint_are_published(
    zk: str, brokers: list[BrokerThread], tmp_path: Path
) -> None:
    b1 = brokers[0]
    ctl = ActingController(zk, [b1])
    try:
        # The test plays the controller. "rep" starts with leader 1 alone in the ISR: that
        # election is the first event, so broker 1 creates the events topic (RF 1: alone).
        ctl.create_topic("rep", {0: [1, 2]}, isr=[1], live=[1])
        assignment = wait_until(lambda: ctl.zk.get_topic_assignment(EVENTS_TOPIC), timeout_s=20,
                                what="the broker creating __replication_events")
        assert {p: list(r) for p, r in assignment.items()} == {0: [1]}
        ctl.create_topic(EVENTS_TOPIC, {0: [1]}, write_assignment=False)  # its leader
        assert produce(b1.port, "rep", 0, build_values([b"a", b"b"]), acks=1) == (ErrorCode.NONE, 0)
        b2 = BrokerThread(broker_props(2, zk, tmp_path / "b2", replica_lag_time_max_ms=LAG_MS))
        brokers.append(b2.start())
        ctl.brokers[2] = b2
        ctl.send_leader_and_isr("rep", [0], live={2})  # broker 2 follows, catches up, joins
        ctl.send_update_metadata()  # KIP-841: the leader adds only brokers reported live
        wait_until(lambda: ctl.read_state("rep", 0).isr == (1, 2), what="ISR expand")
        b2.stop()
        wait_until(lambda: ctl.read_state("rep", 0).isr == (1,), timeout_s=LAG_MS / 1000 * 6,
                   what="ISR shrink")
        publisher = b1.server.replica_manager.events
        assert publisher is not None

        def rep_events() -> list[ReplicationEvent]:
            evs = [e for e in _events(b1.bootstrap) if e.topic == "rep"]
            kinds = {e.type for e in evs}
            return evs if {"isr_expand", "isr_shrink", "hw_checkpoint"} <= kinds else []

        events = wait_until(rep_events, timeout_s=20, interval_s=0.5, what="the events")
    finally:
        ctl.close()
    by_type: dict[str, list[ReplicationEvent]] = {}
    for e in events:
        by_type.setdefault(e.type, []).append(e)
    assert [(e.old_isr, e.new_isr) for e in by_type["isr_expand"]] == [([1], [1, 2])]
    assert [(e.old_isr, e.new_isr) for e in by_type["isr_shrink"]] == [([1, 2], [1])]
    expand, shrink = by_type["isr_expand"][0], by_type["isr_shrink"][0]
    assert expand.broker == shrink.broker == 1
    assert expand.leader_epoch == shrink.leader_epoch == 0
    assert expand.time_ms <= shrink.time_ms
    assert shrink.leo == 2
    elections = by_type["leader_election"]
    assert [(e.broker, e.leader_epoch, e.new_isr) for e in elections] == [(1, 0, [1])]
    # HW checkpoints: only when the HW moved, so each checkpoint of "rep" has a new HW.
    hws = [e.hw for e in by_type["hw_checkpoint"]]
    assert hws == sorted(set(hws)) and hws[-1] == 2
    assert publisher.dropped == 0


def test_events_are_off_by_default(zk: str, tmp_path: Path) -> None:
    b = BrokerThread(broker_props(5, zk, tmp_path / "b5")).start()
    try:
        assert b.server.replica_manager.events is None
    finally:
        b.stop()


def test_a_full_queue_drops_and_counts_instead_of_blocking() -> None:
    publisher = ReplicationEventPublisher(7, lambda: "127.0.0.1:1", queue_capacity=2)
    for epoch in range(5):  # nothing drains: the sender was never started
        publisher.leader_elected("t", 0, epoch, [7], 10, 10)
    assert (publisher.pending, publisher.dropped) == (2, 3)
    publisher.isr_changed("t", 0, 4, [7, 8], [8, 7], 10, 10)  # same set: no event, no drop
    assert publisher.dropped == 3


def test_an_unreachable_cluster_costs_drops_not_a_hang(caplog: pytest.LogCaptureFixture) -> None:
    async def go() -> ReplicationEventPublisher:
        publisher = ReplicationEventPublisher(7, lambda: "127.0.0.1:1", queue_capacity=10)
        publisher.start()
        for epoch in range(3):
            publisher.leader_elected("t", 0, epoch, [7], 10, 10)
        async with asyncio.timeout(30):  # the sender fails to connect and waits to retry
            while not any("sender failed" in r.getMessage() for r in caplog.records):
                await asyncio.sleep(0.01)
        async with asyncio.timeout(5):
            await publisher.shutdown(timeout_s=0.5)
        return publisher

    publisher = asyncio.run(go())
    assert (publisher.published, publisher.dropped, publisher.pending) == (0, 3, 0)
