"""The shared ReplicaManager shell and its fetcher manager, driven by a hand-stepped clock: the
same code the asyncio broker and the simulator run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tidelog.protocol.records.builder import build_values
from tidelog.replication.config import ReplicationConfig
from tidelog.replication.errors import Errors
from tidelog.replication.fetcher import FetchRequest
from tidelog.replication.types import (
    FetchPartitionData,
    LeaderAndIsrPartitionState,
    ProposeIsr,
    TopicPartition,
)
from tidelog.shell.fetcher_manager import fetcher_id_for
from tidelog.shell.interfaces import DiskExecutor
from tidelog.shell.replica_manager import ReplicaManager
from tidelog.sim.disk import MemoryFileIO
from tidelog.storage.log_config import LogConfig
from tidelog.storage.log_manager import LogManager

TP = TopicPartition("t", 0)


class Task:
    def __init__(self, name: str, due: int, fn: Callable[[], Any], period: int) -> None:
        self.name, self.due, self.fn, self.period = name, due, fn, period
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class Clock:
    """Time and Scheduler by hand: ``advance`` runs what came due, in time order."""

    def __init__(self) -> None:
        self.now = 0
        self.tasks: list[Task] = []

    def milliseconds(self) -> int:
        return self.now

    def schedule(self, name: str, fn: Callable[[], Any], delay_ms: int,
                 period_ms: int = -1) -> Task:
        task = Task(name, self.now + delay_ms, fn, period_ms)
        self.tasks.append(task)
        return task

    def advance(self, ms: int) -> None:
        end = self.now + ms
        while True:
            due = [t for t in self.tasks if not t.cancelled and t.due <= end]
            if not due:
                break
            task = min(due, key=lambda t: t.due)
            self.now = max(self.now, task.due)
            if task.period > 0:
                task.due += task.period
            else:
                self.tasks.remove(task)
            task.fn()
        self.now = end


class IsrWriter:
    """The AlterPartitionManager: every proposal kept, answered when the test says."""

    def __init__(self) -> None:
        self.proposals: list[tuple[ProposeIsr, Callable[[bool, int], None]]] = []

    def submit(self, proposal: ProposeIsr, on_result: Callable[[bool, int], None]) -> None:
        self.proposals.append((proposal, on_result))


class EndPoint:
    def __init__(self, sent: list[tuple[int, int, Any, Callable[[Any], None]]],
                 source: int, fetcher_id: int) -> None:
        self.sent, self.source, self.fetcher_id = sent, source, fetcher_id
        self.closed = False

    def send(self, request: Any, on_done: Callable[[Any], None]) -> None:
        self.sent.append((self.source, self.fetcher_id, request, on_done))

    def close(self) -> None:
        self.closed = True


class Broker:
    def __init__(self, broker_id: int, io: MemoryFileIO | None = None,
                 config: ReplicationConfig | None = None, fetchers: int = 1,
                 disk: DiskExecutor | None = None) -> None:
        self.io = io or MemoryFileIO()
        self.clock = Clock()
        self.isr = IsrWriter()
        self.sent: list[tuple[int, int, Any, Callable[[Any], None]]] = []
        self.endpoints: list[EndPoint] = []
        self.lm = LogManager([f"/b{broker_id}"], LogConfig(min_insync_replicas=1), self.io)
        self.rm = ReplicaManager(
            broker_id, self.lm, config or ReplicationConfig(replica_fetch_wait_max_ms=0),
            time=self.clock, scheduler=self.clock, alter_partition_manager=self.isr,
            leader_end_point=self._endpoint, num_replica_fetchers=fetchers,
            high_watermark_checkpoint_interval_ms=500, disk=disk)
        self.rm.set_broker_epoch(100)

    def _endpoint(self, source: int, fetcher_id: int) -> EndPoint:
        ep = EndPoint(self.sent, source, fetcher_id)
        self.endpoints.append(ep)
        return ep


def state(leader: int, epoch: int, isr: tuple[int, ...], tp: TopicPartition = TP,
          zk_version: int = 0) -> LeaderAndIsrPartitionState:
    return LeaderAndIsrPartitionState(tp.topic, tp.partition, 1, leader, epoch, isr, zk_version,
                                      (1, 2))


def test_a_control_request_for_an_earlier_registration_is_refused_by_the_cores_rule() -> None:
    b = Broker(1)
    old = b.rm.become_leader_or_follower(0, 1, 99, [state(1, 0, (1, 2))], {1, 2})
    assert old.error == Errors.STALE_BROKER_EPOCH and b.rm.core.partition(TP) is None
    assert b.rm.update_metadata(99, {1: 100}) == Errors.STALE_BROKER_EPOCH
    assert b.rm.stop_replicas(0, 1, 99, {TP: True}).error == Errors.STALE_BROKER_EPOCH
    assert b.rm.stale_broker_epoch_refused == 3
    # -1: a controller older than 2.4 sends no broker epoch; a newer epoch is fine.
    assert b.rm.become_leader_or_follower(0, 1, -1, [state(1, 0, (1, 2))], {1, 2}).error == 0
    assert b.rm.become_leader_or_follower(0, 1, 101, [state(1, 1, (1, 2))], {1, 2}).error == 0
    assert b.rm.core.partition(TP).leader_epoch == 1


def test_the_periodic_tasks_are_scheduled_once_with_kafkas_names() -> None:
    b = Broker(1)
    b.rm.startup()
    # The log manager's too (the flusher only with a finite log.flush.scheduler.interval.ms).
    # No isr-change-propagation: the controller announces the ISR changes it writes (KIP-497).
    assert sorted(t.name for t in b.clock.tasks) == [
        "PeriodicProducerExpirationCheck", "highwatermark-checkpoint", "isr-expiration", "kafka-delete-logs", "kafka-log-retention",
        "kafka-recovery-point-checkpoint"]
    b.rm.shutdown()
    assert all(t.cancelled for t in b.clock.tasks)


def test_a_delayed_produce_answers_when_the_follower_has_it_and_the_hw_is_checkpointed() -> None:
    io = MemoryFileIO()
    b = Broker(1, io)
    b.rm.startup()
    b.rm.become_leader_or_follower(0, 1, 100, [state(1, 0, (1, 2))], {1, 2})
    done: list[Any] = []
    out = b.rm.append_records(-1, {TP: build_values([b"a", b"b"])}, 5000, "p1", done.append)
    assert out.delayed and done == []

    def follower_fetch(offset: int) -> None:
        b.rm.fetch_messages(2, 0, 1, 1 << 20, {TP: (offset, 0, 0, 1 << 20)}, ("f", offset),
                            lambda _: None, broker_epoch=7)

    follower_fetch(0)  # reads the batch
    assert done == []
    follower_fetch(2)  # the follower has both records: HW 2, the produce completes
    assert [d.results[TP].error for d in done] == [Errors.NONE]
    assert b.rm.core.partition(TP).high_watermark == 2
    b.clock.advance(500)  # highwatermark-checkpoint; a restarted broker's LogManager reads it
    assert LogManager(["/b1"], LogConfig(), io).get_log("t", 0).high_watermark == 2


def test_a_delayed_produce_expires_at_its_deadline_through_the_shells_timer() -> None:
    b = Broker(1)
    b.rm.become_leader_or_follower(0, 1, 100, [state(1, 0, (1, 2))], {1, 2})
    done: list[Any] = []
    b.rm.append_records(-1, {TP: build_values([b"a"])}, 300, "p1", done.append)
    b.clock.advance(299)
    assert done == []
    b.clock.advance(1)
    assert [d.results[TP].error for d in done] == [Errors.REQUEST_TIMED_OUT]


def test_isr_proposals_go_to_the_writer_and_its_answer_back_to_the_core() -> None:
    b = Broker(1, config=ReplicationConfig(replica_lag_time_max_ms=1000))
    b.rm.startup()
    b.rm.become_leader_or_follower(0, 1, 100, [state(1, 0, (1, 2))], {1, 2})
    b.rm.append_records(1, {TP: build_values([b"a"])}, 5000, "p1", lambda _: None)
    b.clock.advance(2000)  # isr-expiration: follower 2 never fetched
    (prop, answer), = b.isr.proposals
    assert prop.new_isr == (1,)
    answer(True, 1)
    assert b.rm.core.partition(TP).isr == {1} and b.rm.isr_updates_ok == 1


def test_one_fetcher_per_source_and_fetcher_id_and_the_next_request_follows_each_answer() -> None:
    b = Broker(2, fetchers=3)
    tps = [TopicPartition("t", p) for p in range(6)]
    b.rm.become_leader_or_follower(
        0, 1, 100, [state(1, 0, (1, 2), tp) for tp in tps], {1, 2})
    keys = sorted(b.rm.fetcher_manager.fetchers)
    assert keys == sorted({(1, fetcher_id_for(tp, 3)) for tp in tps})
    assert {(s, f) for s, f, _, _ in b.sent} == set(keys)  # each starts with a request
    # An empty log has no epoch to ask about: each fetcher fetches at once, and its next fetch
    # leaves as soon as the answer came.
    source, fid, request, on_done = b.sent[0]
    assert isinstance(request, FetchRequest)
    before = len(b.sent)
    on_done({tp: FetchPartitionData(Errors.NONE, 0, 0, b"") for tp in request.partitions})
    assert [(s, f, type(r)) for s, f, r, _ in b.sent[before:]] == [(source, fid, FetchRequest)]


def test_a_failed_request_backs_its_partitions_off_and_a_timer_sends_it_again() -> None:
    b = Broker(2, config=ReplicationConfig(replica_fetch_backoff_ms=200))
    b.rm.become_leader_or_follower(0, 1, 100, [state(1, 0, (1, 2))], {1, 2})
    (_, _, request, on_done), = b.sent
    on_done(None)  # lost
    assert len(b.sent) == 1  # backed off, nothing sent at once
    b.clock.advance(199)
    assert len(b.sent) == 1
    b.clock.advance(1)
    assert len(b.sent) == 2 and type(b.sent[1][2]) is type(request)


def test_idle_fetchers_are_shut_down_after_a_leader_and_isr() -> None:
    b = Broker(2)
    b.rm.become_leader_or_follower(0, 1, 100, [state(1, 0, (1, 2))], {1, 2})
    (ep,) = b.endpoints
    b.sent[0][3](None)  # its request failed: nothing in flight
    # Broker 2 leads now: the fetcher from broker 1 has nothing left and goes.
    b.rm.become_leader_or_follower(0, 1, 100, [state(2, 1, (1, 2))], {1, 2})
    assert b.rm.fetcher_manager.fetchers == {}
    assert ep.closed


def test_resizing_the_fetcher_pool_moves_every_partition_at_its_fetch_state() -> None:
    """num.replica.fetchers changed live (Kafka's resizeThreadPool): each partition goes to the
    fetcher its hash names under the new count, with the offset and leader epoch it had."""
    b = Broker(2, fetchers=1)
    tps = [TopicPartition("t", p) for p in range(6)]
    b.rm.become_leader_or_follower(0, 1, 100, [state(1, 3, (1, 2), tp) for tp in tps], {1, 2})
    fm = b.rm.fetcher_manager
    assert sorted(fm.fetchers) == [(1, 0)]
    before = {tp: fm.fetch_state(tp) for tp in tps}
    b.sent[0][3](None)  # its request failed: nothing in flight, the fetcher can go idle
    sent = len(b.sent)
    fm.resize(3)
    assert sorted(fm.fetchers) == sorted({(1, fetcher_id_for(tp, 3)) for tp in tps})
    for tp in tps:
        now, was = fm.fetch_state(tp), before[tp]
        assert now is not None and was is not None and fm.source_of(tp) == 1
        assert (now.fetch_offset, now.current_leader_epoch) == (was.fetch_offset, 3)
    for _, _, _, on_done in b.sent[sent:]:
        on_done(None)  # the new fetchers' first requests fail: nothing in flight
    fm.resize(1)
    assert sorted(fm.fetchers) == [(1, 0)]


def test_a_fetch_below_a_log_start_moved_by_retention_answers_at_once() -> None:
    """Kafka completes the delayed operations of a partition whose log start moved at once
    (checkAndComplete on its key), not at their max wait: the retention task's move answers a
    consumer's fetch waiting below the new start (OFFSET_OUT_OF_RANGE) when it runs."""
    b = Broker(1)
    b.lm.topic_configs[TP.topic] = LogConfig(min_insync_replicas=1, segment_bytes=100,
                                             retention_bytes=100)
    b.rm.startup()
    b.rm.become_leader_or_follower(0, 1, 100, [state(1, 0, (1,))], {1})
    for value in (b"a" * 40, b"b" * 40, b"c" * 40):
        assert not b.rm.append_records(1, {TP: build_values([value])}, 5000, value,
                                       lambda _: None).delayed
    assert len(b.rm.core.partition(TP).log.segments) > 1
    done: list[Any] = []
    # min bytes beyond what is there: it waits up to its max wait, 100 s
    out = b.rm.fetch_messages(-1, 100_000, 1 << 20, 1 << 20, {TP: (0, 0, 0, 1 << 20)},
                              "consumer", done.append)
    assert out.delayed and done == []
    b.clock.advance(30_000)  # log.initial.task.delay.ms: the first retention run
    assert b.rm.core.partition(TP).log_start_offset > 0
    assert [d.results[TP].error for d in done] == [Errors.OFFSET_OUT_OF_RANGE]
    assert b.clock.now == 30_000
