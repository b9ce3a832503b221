"""The asyncio broker's driver of the shared `shell.ReplicaManager` (seed 004).

The shell decides when and what; this module supplies what it asks of a driver and nothing
else: the wall clock and an asyncio `Scheduler`, the transport of the shell's
`AlterPartitionManager` (AlterPartition to the active controller,
`broker.alter_partition.ControllerAlterPartitionTransport`) and a `BrokerLeaderEndPoint` per
fetcher. It turns the
shell's callbacks into futures for `KafkaApis`. The log manager's tasks (retention, flusher,
recovery-point checkpoint, producer-id expiration) are the shell's (shell/log_tasks.py), given
this broker's intervals.

Idempotent producers: each partition's log keeps their state (storage/producer_state_manager.py)
and answers a retried batch with its original offsets; the shell passes the answer back.

Everything runs on the event loop thread except blocking calls: ZooKeeper's (the log dir
event notification, the controller's id) and the checkpoint files' writes (`ThreadDiskExecutor`,
the shell's `DiskExecutor`: one worker thread, Kafka's KafkaScheduler thread).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from tidelog.broker.alter_partition import ControllerAlterPartitionTransport
from tidelog.broker.fetcher_manager import BrokerLeaderEndPoint, EndpointLookup, TopicIdLookup
from tidelog.broker.log_dir_failure import ZkLogDirFailureHandling
from tidelog.broker.replication_events import ReplicationEventPublisher
from tidelog.protocol.primitives import ZERO_UUID
from tidelog.replication.config import ReplicationConfig
from tidelog.replication.errors import Errors
from tidelog.replication.replica_manager import LeaderAndIsrResult, StopReplicaResult
from tidelog.replication.types import (
    CompleteFetch,
    CompleteProduce,
    FetchPartitionData,
    LeaderAndIsrPartitionState,
    ProducePartitionResult,
    TopicPartition,
)
from tidelog.shell.alter_partition_manager import AlterPartitionAnswer, AlterPartitionManager
from tidelog.shell.fetcher_manager import ReplicaFetcherManager
from tidelog.shell.log_tasks import LogTaskIntervals
from tidelog.shell.replica_manager import ReplicaManager
from tidelog.storage.producer_state_manager import VerificationGuard
from tidelog.storage.transactions import AppendOrigin

__all__ = ["AsyncioScheduler", "BrokerReplicaManager", "ThreadDiskExecutor", "now_ms"]

logger = logging.getLogger(__name__)

T = TypeVar("T")


def now_ms() -> int:
    return int(time.time() * 1000)


class AsyncioScheduler:
    """The shell's `Time` and `Scheduler` on the running event loop (Kafka's KafkaScheduler,
    without threads). A task that raises is logged and keeps its period."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The running loop, looked up once while it runs: Python 3.11's
        asyncio.get_running_loop checks the pid with a getpid system call each time (several
        per request on the replication path)."""
        loop = self._loop
        if loop is None or not loop.is_running():
            loop = self._loop = asyncio.get_running_loop()
        return loop

    def milliseconds(self) -> int:
        return now_ms()

    def schedule(self, name: str, fn: Callable[[], Any], delay_ms: int,
                 period_ms: int = -1) -> asyncio.TimerHandle | _Periodic:
        loop = self.loop
        if period_ms <= 0:
            # +1 ms: the clock is read in whole ms, so a timer must not fire before its ms.
            return loop.call_later((delay_ms + 1) / 1000, self._run, name, fn)
        task = _Periodic()
        task.handle = loop.call_later(delay_ms / 1000, self._tick, name, fn, period_ms, task)
        return task

    @staticmethod
    def _run(name: str, fn: Callable[[], Any]) -> None:
        try:
            fn()
        except Exception:
            logger.exception("scheduled task %s failed", name)

    def _tick(self, name: str, fn: Callable[[], Any], period_ms: int, task: _Periodic) -> None:
        if task.cancelled:
            return
        self._run(name, fn)
        if not task.cancelled:
            task.handle = self.loop.call_later(
                period_ms / 1000, self._tick, name, fn, period_ms, task)


class _Periodic:
    __slots__ = ("cancelled", "handle")

    def __init__(self) -> None:
        self.handle: asyncio.TimerHandle | None = None
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True
        if self.handle is not None:
            self.handle.cancel()


class ThreadDiskExecutor:
    """The shell's `DiskExecutor` on the asyncio broker: the work on one worker thread (in
    submission order, so two writes of one file never interleave), its continuation back on
    the event loop. An fsync holds only the worker: it releases the GIL while it waits for
    the disk."""

    def __init__(self, scheduler: AsyncioScheduler) -> None:
        self._scheduler = scheduler
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kafka-scheduler")

    def run(self, name: str, work: Callable[[], T], then: Callable[[T | None], None]) -> None:
        done = self._scheduler.loop.run_in_executor(self._pool, work)
        done.add_done_callback(lambda f: self._finish(name, f, then))

    @staticmethod
    def _finish(name: str, done: asyncio.Future[T], then: Callable[[T | None], None]) -> None:
        if done.cancelled():
            return
        error = done.exception()
        if error is not None:
            logger.error("%s failed", name, exc_info=error)
            then(None)
            return
        then(done.result())

    async def shutdown(self) -> None:
        """Wait for the work submitted (a checkpoint being written finishes before the log
        manager's shutdown writes its own)."""
        await asyncio.to_thread(self._pool.shutdown, wait=True)


class BrokerReplicaManager:
    def __init__(
        self,
        broker_id: int,
        log_manager: Any,
        config: ReplicationConfig,
        *,
        zk_client: Any | None,
        endpoint_of: EndpointLookup,
        topic_id_of: TopicIdLookup | None = None,
        num_replica_fetchers: int = 1,
        high_watermark_checkpoint_interval_ms: int = 5000,
        log_retention_check_interval_ms: int = 300_000,
        log_flush_scheduler_interval_ms: int = 2**63 - 1,
        recovery_point_checkpoint_interval_ms: int = 60_000,
        log_initial_task_delay_ms: int = 30_000,
        controller_socket_timeout_ms: int = 30_000,
        controller_id: Callable[[], int | None] | None = None,
    ) -> None:
        """``controller_id()``: the active controller's id as the metadata cache has it (where
        AlterPartition goes); None: no controller (ISR changes are never made)."""
        self.broker_id = broker_id
        self.log_manager = log_manager
        self.config = config
        self.scheduler = AsyncioScheduler()
        self.alter_partition_transport = ControllerAlterPartitionTransport(
            broker_id, controller_id or (lambda: None), endpoint_of, topic_id_of or (lambda _topic: ZERO_UUID),
            request_timeout_ms=controller_socket_timeout_ms)
        self.alter_partition_transport.on_answer = self._on_alter_partition_answer
        self.alter_partition_manager = AlterPartitionManager(
            broker_id, self.alter_partition_transport, self.scheduler,
            lambda: self.shell.broker_epoch)
        self.log_dir_failure = ZkLogDirFailureHandling(broker_id, zk_client)
        self.disk = ThreadDiskExecutor(self.scheduler)
        self.shell = ReplicaManager(
            broker_id, log_manager, config, time=self.scheduler, scheduler=self.scheduler,
            alter_partition_manager=self.alter_partition_manager,
            leader_end_point=lambda source, fetcher_id: BrokerLeaderEndPoint(
                broker_id, source, fetcher_id, config, endpoint_of, topic_id_of),
            num_replica_fetchers=num_replica_fetchers,
            high_watermark_checkpoint_interval_ms=high_watermark_checkpoint_interval_ms,
            log_task_intervals=LogTaskIntervals(
                log_retention_check_interval_ms=log_retention_check_interval_ms,
                log_flush_scheduler_interval_ms=log_flush_scheduler_interval_ms,
                recovery_point_checkpoint_interval_ms=recovery_point_checkpoint_interval_ms,
                log_initial_task_delay_ms=log_initial_task_delay_ms),
            log_dir_failure=self.log_dir_failure,
            disk=self.disk,
        )
        self.core = self.shell.core
        self.shell.high_watermark_checkpoint.on_written = self._on_hw_checkpoint
        self.fetcher_manager: ReplicaFetcherManager = self.shell.fetcher_manager
        self._keys = itertools.count(1)
        self._waiters: set[asyncio.Future[Any]] = set()
        # tidelog.replication.events.enable: the telemetry publisher (set by the server)
        self._events: ReplicationEventPublisher | None = None

    # ------------------------------------------------------------------ life cycle
    @property
    def events(self) -> ReplicationEventPublisher | None:
        return self._events

    @events.setter
    def events(self, publisher: ReplicationEventPublisher | None) -> None:
        self._events = publisher

    def _on_alter_partition_answer(self, answer: AlterPartitionAnswer) -> None:
        """The controller's answer, before the core adopts it: each ISR change it wrote (the
        telemetry's before/after view)."""
        for tp, part in answer.partitions.items():
            if part.error:
                continue
            logger.info("%s: ISR is now %s (zk version %d)", tp, list(part.isr),
                        part.partition_epoch)
            p = self.core.partition(tp)
            if self.events is not None and p is not None and p.pending_isr is not None:
                self.events.isr_changed(tp.topic, tp.partition, part.leader_epoch, p.isr,
                                        part.isr, p.log_end_offset, p.high_watermark)

    @property
    def broker_epoch(self) -> int:
        return self.shell.broker_epoch

    def set_broker_epoch(self, broker_epoch: int) -> None:
        self.shell.set_broker_epoch(broker_epoch)

    @property
    def isr_updates_ok(self) -> int:
        return self.shell.isr_updates_ok

    @property
    def isr_updates_failed(self) -> int:
        return self.shell.isr_updates_failed

    def start(self) -> None:
        """The shell's tasks, the log manager's among them."""
        self.shell.startup()

    async def shutdown(self) -> None:
        self.shell.shutdown()
        self.alter_partition_manager.shutdown()
        await self.alter_partition_transport.shutdown()
        await self.log_dir_failure.shutdown()
        await self.disk.shutdown()
        for fut in self._waiters:
            if not fut.done():
                fut.cancel()
        self._waiters.clear()

    def _on_hw_checkpoint(self) -> None:
        if self.events is not None:
            self.events.hw_checkpoint(
                (tp.topic, tp.partition, p.leader_epoch, p.isr, p.log_end_offset,
                 p.high_watermark)
                for tp, p in list(self.core.partitions.items())
            )

    # ------------------------------------------------------------------ controller requests
    def become_leader_or_follower(
        self,
        controller_id: int,
        controller_epoch: int,
        broker_epoch: int,
        partition_states: Iterable[LeaderAndIsrPartitionState],
        live_leaders: Collection[int],
    ) -> LeaderAndIsrResult:
        states = list(partition_states)
        led_before = {s.tp: p.leader_epoch for s in states
                      if (p := self.core.partition(s.tp)) is not None and p.is_leader}
        result = self.shell.become_leader_or_follower(controller_id, controller_epoch,
                                                      broker_epoch, states, live_leaders)
        if result.error == Errors.NONE:
            for s in states:
                if result.partition_errors.get(s.tp, Errors.NONE) != Errors.NONE:
                    continue
                p = self.core.partition(s.tp)
                if p is None:
                    continue
                if (self.events is not None and p.is_leader
                        and led_before.get(s.tp) != p.leader_epoch):
                    self.events.leader_elected(s.tp.topic, s.tp.partition, p.leader_epoch,
                                               p.isr, p.log_end_offset, p.high_watermark)
        return result

    def stop_replicas(
        self, controller_id: int, controller_epoch: int, broker_epoch: int,
        partitions: Mapping[TopicPartition, bool],
    ) -> StopReplicaResult:
        return self.shell.stop_replicas(controller_id, controller_epoch, broker_epoch,
                                        partitions)

    # ------------------------------------------------------------------ produce
    def append_records(
        self, acks: int, entries: Mapping[TopicPartition, Any], timeout_ms: int,
        origin: AppendOrigin = AppendOrigin.CLIENT,
        verification_guards: Mapping[TopicPartition, VerificationGuard] | None = None,
    ) -> asyncio.Future[dict[TopicPartition, ProducePartitionResult]]:
        """Append one batch per partition now; the returned future resolves to the results
        (acks=-1: once the ISR has them, or after ``timeout_ms``). The append happens before
        this returns, so the appends of a connection's pipelined requests stay in order while
        their acknowledgements are awaited together. A retried batch is answered by the log
        with its original offsets (at acks=-1 once the HW passes them). ``origin``
        COORDINATOR: a coordinator's records or transaction markers (the log validates them
        as Kafka's AppendOrigin.Coordinator). ``verification_guards``: KIP-890's, None when
        transaction.partition.verification.enable is off (see the core's append_records)."""
        acknowledged: asyncio.Future[dict[TopicPartition, ProducePartitionResult]] = (
            self.scheduler.loop.create_future())

        def completed(done: CompleteProduce) -> None:
            if not acknowledged.done():
                acknowledged.set_result(dict(done.results))

        outcome = self.shell.append_records(acks, entries, timeout_ms, next(self._keys),
                                            completed, origin, verification_guards)
        if outcome.delayed:
            self._waiters.add(acknowledged)
            acknowledged.add_done_callback(self._waiters.discard)
        else:
            assert outcome.results is not None
            acknowledged.set_result(dict(outcome.results))
        return acknowledged

    # ------------------------------------------------------------------ fetch
    async def fetch_messages(
        self,
        replica_id: int,
        max_wait_ms: int,
        min_bytes: int,
        max_bytes: int,
        partitions: Mapping[TopicPartition, tuple[int, ...]],
        broker_epoch: int | None = None,
        isolation_level: int = 0,
        fetch_only_leader: bool = True,
    ) -> dict[TopicPartition, FetchPartitionData]:
        # The future of a held fetch, made only once the fetch waits: most are answered at
        # once (its completion may still come inside shell.fetch_messages, which tries the
        # purgatory after watching it).
        fut: asyncio.Future[CompleteFetch] | None = None

        def completed(done: CompleteFetch) -> None:
            nonlocal fut
            if fut is None:
                fut = self.scheduler.loop.create_future()
            if not fut.done():
                fut.set_result(done)

        outcome = self.shell.fetch_messages(replica_id, max_wait_ms, min_bytes, max_bytes,
                                            partitions, next(self._keys), completed,
                                            broker_epoch=broker_epoch,
                                            isolation_level=isolation_level,
                                            fetch_only_leader=fetch_only_leader)
        if outcome.delayed:
            if fut is None:
                fut = self.scheduler.loop.create_future()
            self._waiters.add(fut)
            try:
                done = await fut
            finally:
                self._waiters.discard(fut)
            return dict(done.results)
        assert outcome.results is not None
        return outcome.results
