"""Fetch sessions that read only changed partitions, against real brokers: a held incremental
fetch wakes when a partition it did not read gets records, and the fetches of idle followers,
which skip every unchanged partition, still count for the ISR (the leader's caught-up clock of
each follower moves as if each fetch had read every partition, as in Kafka), so they stay in
the ISR past replica.lag.time.max.ms."""

from __future__ import annotations

import threading
from collections.abc import Callable
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
    values_of,
    wait_until,
)
from zk_chroot import new_chroot

from tidelog.cluster.zookeeper import ZooKeeperServer
from tidelog.protocol.messages.fetch import FetchPartition
from tidelog.protocol.records.builder import build_values
from tidelog.replication.types import TopicPartition
from tidelog.storage.log_config import LogConfig

LAG_MS = 1000


@pytest.fixture
def pair(start_brokers: Callable[..., tuple[str, list[BrokerThread]]]
         ) -> tuple[str, list[BrokerThread]]:
    return start_brokers(2, **{"replica.lag.time.max.ms": LAG_MS})


def test_a_held_incremental_fetch_wakes_for_a_partition_it_did_not_read(
        pair: tuple[str, list[BrokerThread]]) -> None:
    zk, (b1, b2) = pair
    ctl = ActingController(zk, [b1, b2])
    try:
        ctl.create_topic("held", {0: [1], 1: [1]})
        req = fetch_request("held", 0, 0, max_wait_ms=0)
        req.topics[0].partitions.append(FetchPartition(partition=1, fetch_offset=0,
                                                       partition_max_bytes=1 << 20))
        req.session_epoch = 0
        sid = send(b1.port, req).session_id
        assert sid != 0
        req.topics, req.session_id, req.session_epoch = [], sid, 1
        assert send(b1.port, req).responses == []  # the first incremental fetch read both
        session = b1.call(lambda: b1.server.apis.fetch_manager.cache.get(sid))
        assert session is not None and not session.dirty  # the next one reads nothing
        req.session_epoch, req.max_wait_ms = 2, 30_000
        answer: list[Any] = []
        held = threading.Thread(target=lambda: answer.append(send(b1.port, req, timeout_ms=60_000)))
        held.start()
        wait_until(lambda: b1.call(lambda: session.waker is not None), what="the fetch is held")
        assert produce(b1.port, "held", 1, build_values([b"x"]), acks=1) == (0, 0)
        held.join(timeout=20)  # well before the 30 s wait: the produce woke it
        assert answer, "the held fetch did not wake"
        [topic] = answer[0].responses
        [part] = topic.partitions
        assert part.partition_index == 1 and values_of(part.records) == [b"x"]
    finally:
        ctl.close()


def test_idle_followers_stay_in_the_isr_while_their_fetches_read_nothing(
        pair: tuple[str, list[BrokerThread]]) -> None:
    zk, (b1, b2) = pair
    ctl = ActingController(zk, [b1, b2])
    try:
        ctl.create_topic("idle", {p: [1, 2] for p in range(20)})
        tps = [TopicPartition("idle", p) for p in range(20)]
        assert produce(b1.port, "idle", 0, build_values([b"x"]), acks=-1) == (0, 0)
        apis = b1.server.apis

        def follower_session() -> Any:
            sessions = [s for s in apis.fetch_manager.follower_sessions() if s.replica_id == 2]
            return sessions[0] if sessions and sessions[0].size == 20 else None

        session = wait_until(lambda: b1.call(follower_session), what="the follower's session")
        wait_until(lambda: b1.call(lambda: not session.dirty), what="the session settled")
        rm = b1.server.replica_manager
        shell = rm.shell
        settled_ms = b1.call(shell.time.milliseconds)
        isr_writes = b1.call(lambda: (rm.isr_updates_ok, rm.isr_updates_failed))
        # Count the leader's ISR checks (every replica.lag.time.max.ms / 2).
        checks: list[int] = []
        replay = b1.server.replica_manager.shell.before_isr_expiration

        def counted() -> None:
            checks.append(1)
            assert replay is not None
            replay()

        def spy() -> None:
            b1.server.replica_manager.shell.before_isr_expiration = counted

        b1.call(spy)
        # Well past replica.lag.time.max.ms with nothing to read...
        wait_until(lambda: len(checks) >= 6, timeout_s=30, what="ISR checks")
        epoch = b1.call(lambda: session.epoch)
        wait_until(lambda: b1.call(lambda: session.epoch) > epoch + 2, what="more idle fetches")
        # ... every follower is still in the ISR (no shrink, no re-expansion), and caught up as
        # of fetches that read nothing.
        assert b1.call(lambda: (rm.isr_updates_ok, rm.isr_updates_failed)) == isr_writes
        core = rm.core
        isrs = b1.call(lambda: [core.partition(tp).isr for tp in tps])
        assert all(set(isr) == {1, 2} for isr in isrs)
        caught_up = b1.call(lambda: [
            core.partition(tp).remote_replicas[2].last_caught_up_time_ms for tp in tps])
        assert min(caught_up) > settled_ms
    finally:
        ctl.close()


def test_retention_moving_the_log_start_reaches_an_idle_incremental_fetch(
        zookeeper: ZooKeeperServer, tmp_path: Path) -> None:
    """A session reads only changed partitions; retention changes a partition's log start
    without an append, so it must mark the partition or consumers and followers would keep the
    old log start until the partition's next record."""
    zk = new_chroot(zookeeper)
    b1 = BrokerThread(broker_props(1, zk, tmp_path / "b1", **{
        "log.initial.task.delay.ms": 0, "log.retention.check.interval.ms": 100})).start()
    ctl = ActingController(zk, [b1])
    try:
        ctl.create_topic("ret", {0: [1], 1: [1]}, config={"retention.ms": -1})
        req = fetch_request("ret", 0, 0, max_wait_ms=0)
        req.topics[0].partitions.append(FetchPartition(partition=1, fetch_offset=0,
                                                       partition_max_bytes=1 << 20))
        req.session_epoch = 0
        sid = send(b1.port, req).session_id
        # Stamped 1970: gone at the first retention check once the topic has a retention.ms.
        assert produce(b1.port, "ret", 0, build_values([b"x"], base_timestamp=1),
                       acks=1) == (0, 0)
        req.topics, req.session_id, req.session_epoch = [], sid, 1
        [topic] = send(b1.port, req).responses  # reads the record; the log starts at 0
        assert [(p.partition_index, p.log_start_offset) for p in topic.partitions] == [(0, 0)]
        # The consumer moves on past the record; the session settles with nothing to read.
        req.topics = fetch_request("ret", 0, 1, max_wait_ms=0).topics
        req.session_epoch = 2
        send(b1.port, req)
        session = b1.call(lambda: b1.server.apis.fetch_manager.cache.get(sid))
        assert session is not None and not session.dirty
        log_manager = b1.server.replica_manager.log_manager
        log = b1.call(lambda: log_manager.get_log("ret", 0))
        b1.call(lambda: log_manager.update_topic_config("ret", LogConfig.from_dict(
            {"retention.ms": "1000"}, base=log.config)))
        wait_until(lambda: b1.call(lambda: log.log_start_offset) == 1, timeout_s=30,
                   what="retention deleted the record")
        req.topics, req.session_epoch = [], 3
        [topic] = send(b1.port, req).responses
        assert [(p.partition_index, p.log_start_offset) for p in topic.partitions] == [(0, 1)]
    finally:
        ctl.close()
        b1.stop()


def test_a_caught_up_follower_joins_the_isr_once_the_metadata_names_it_live(
        pair: tuple[str, list[BrokerThread]]) -> None:
    """The follower catches up while the leader's metadata does not list it live (KIP-841: not
    eligible), and its session settles; the later UpdateMetadata changes no partition, yet its
    next fetch must bring it into the ISR, as Kafka's leader tries maybeExpandIsr on every
    fetch."""
    zk, (b1, b2) = pair
    ctl = ActingController(zk, [b1, b2])
    try:
        ctl.create_topic("late", {0: [1, 2]}, isr=[1], live=[1])
        assert produce(b1.port, "late", 0, build_values([b"a"]), acks=1) == (0, 0)
        ctl.send_leader_and_isr("late", [0], live={2})
        wait_until(lambda: (p := b2.partition("late", 0)) is not None and p.log_end_offset == 1,
                   what="the follower caught up")
        apis = b1.server.apis

        def settled() -> bool:
            sessions = [s for s in apis.fetch_manager.follower_sessions() if s.replica_id == 2]
            return bool(sessions) and all(not s.dirty for s in sessions)

        wait_until(lambda: b1.call(settled), what="the follower's session settled")
        assert ctl.read_state("late", 0).isr == (1,)
        ctl.send_update_metadata()
        # At its next fetch (0.16 s here); before the fix only some 30 s later, when something
        # else touched the partition (the CI failure of test_replication's ISR expansion).
        wait_until(lambda: ctl.read_state("late", 0).isr == (1, 2), timeout_s=15,
                   what="the follower joined the ISR")
    finally:
        ctl.close()
