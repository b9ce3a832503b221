"""The asyncio broker's driver of the shared `shell.ReplicaManager` (seed 004).

The shell decides when and what; this module supplies what it asks of a driver and nothing
else: the wall clock and an asyncio `Scheduler`, the `AlterPartitionManager` (ZooKeeper through
`KafkaZkClient`, in worker threads: the ISR compare-and-set on the partition state's zk version,
and `/isr_change_notification` writes) and a `BrokerLeaderEndPoint` per fetcher. It turns the
shell's callbacks into futures for `KafkaApis`. The log manager's tasks (retention, flusher,
recovery-point checkpoint, producer-id expiration) are the shell's (shell/log_tasks.py), given
this broker's intervals.

Idempotent producers: each partition's log keeps their state (storage/producer_state_manager.py)
and answers a retried batch with its original offsets; the shell passes the answer back.

Everything runs on the event loop thread; only ZooKeeper calls go to threads.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from typing import Any

from tidelog.broker.fetcher_manager import BrokerLeaderEndPoint, EndpointLookup, TopicIdLookup
from tidelog.broker.log_dir_failure import ZkLogDirFailureHandling
from tidelog.broker.replication_events import ReplicationEventPublisher
from tidelog.controller.zk_client import BrokerRegistrationsChangedError
from tidelog.controller.zk_data import LeaderIsrAndControllerEpoch
from tidelog.replication.config import ReplicationConfig
from tidelog.replication.errors import Errors
from tidelog.replication.isr_eligibility import IneligibleReplica, ineligible_replicas_for_isr
from tidelog.replication.replica_manager import LeaderAndIsrResult, StopReplicaResult
from tidelog.replication.types import (
    CompleteFetch,
    CompleteProduce,
    FetchPartitionData,
    LeaderAndIsrPartitionState,
    ProducePartitionResult,
    ProposeIsr,
    TopicPartition,
)
from tidelog.shell.fetcher_manager import ReplicaFetcherManager
from tidelog.shell.log_tasks import LogTaskIntervals
from tidelog.shell.replica_manager import ReplicaManager
from tidelog.storage.producer_state_manager import VerificationGuard
from tidelog.storage.transactions import AppendOrigin

__all__ = ["AsyncioScheduler", "BrokerReplicaManager", "ZkAlterPartitionManager", "now_ms"]

logger = logging.getLogger(__name__)


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


class ZkAlterPartitionManager:
    """ZooKeeper mode's ISR writer: `KafkaZkClient` calls in worker threads, answered on the
    loop. Without a ZooKeeper client every write fails (the ISR stays as the controller set it).

    Proposals are written in batches, as Kafka's AlterPartitionManager sends them: those made
    while a batch is being written wait and go together in the next, one registrations read
    for all and their compare-and-sets pipelined (`KafkaZkClient.update_isrs_registered`).
    One write per worker thread, each two or three round trips, spread the 500 writes of a
    restarted follower rejoining the ISRs of its leader over 3-4 s."""

    def __init__(self, zk_client: Any | None) -> None:
        self.zk_client = zk_client
        self.events: ReplicationEventPublisher | None = None
        self.core: Any = None  # the shell's core, for the telemetry's before/after view
        self.ineligible_refused = 0  # ISR writes refused for an ineligible member (KIP-841/903)
        # ISR writes not made because a broker registered between the check and the write
        # (proposed again against the new registrations)
        self.registration_changed_refused = 0
        self.batches_written = 0
        self._background: set[asyncio.Task[Any]] = set()
        self._unsent: list[tuple[ProposeIsr, Callable[[bool, int], None]]] = []
        self._writing = False

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.get_running_loop().create_task(coro)  # type: ignore[arg-type]
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def submit(self, proposal: ProposeIsr, on_result: Callable[[bool, int], None]) -> None:
        self._unsent.append((proposal, on_result))
        if not self._writing:
            # (the task starts in a later turn: this turn's proposals go in its first batch)
            self._writing = True
            self._spawn(self._write_batches())

    async def _write_batches(self) -> None:
        try:
            while self._unsent:
                batch, self._unsent = self._unsent, []
                await self._write_batch(batch)
        finally:
            self._writing = False

    def _check_and_write(self, props: list[ProposeIsr]
                         ) -> list[tuple[bool, int] | list[IneligibleReplica] | Exception]:
        """In a worker thread: the ISR writer's KIP-841/903 check against the registrations in
        /brokers/ids, then the compare-and-sets, each conditioned on no broker having
        registered since the check and each of its members still being registered (so the
        check holds at the write; the simulator's ZooKeeper checks and writes in one step).
        Per proposal: (ok, version), the ineligible members, or the write's error."""
        zk = self.zk_client
        members = sorted({b for prop in props for b, _ in prop.isr_with_broker_epochs})
        registrations_version, epochs = zk.get_broker_epochs(members)
        out: list[tuple[bool, int] | list[IneligibleReplica] | Exception] = []
        writes: list[tuple[Any, LeaderIsrAndControllerEpoch, int, list[int]]] = []
        for prop in props:
            ineligible = ineligible_replicas_for_isr(prop.isr_with_broker_epochs, epochs.get)
            out.append(ineligible)
            if not ineligible:
                writes.append(((prop.tp.topic, prop.tp.partition), LeaderIsrAndControllerEpoch(
                    prop.leader, prop.leader_epoch, tuple(prop.new_isr), prop.controller_epoch),
                    prop.zk_version, [b for b, _ in prop.isr_with_broker_epochs]))
        written = iter(zk.update_isrs_registered(writes, registrations_version) if writes
                       else [])
        return [next(written) if not o else o for o in out]

    async def _write_batch(self, batch: list[tuple[ProposeIsr, Callable[[bool, int], None]]]
                           ) -> None:
        if self.zk_client is None:
            for _, on_result in batch:
                on_result(False, -1)
            return
        try:
            outcomes = await asyncio.to_thread(self._check_and_write, [p for p, _ in batch])
        except Exception as e:
            # Proposed again at a later fetch or ISR check.
            logger.warning("ISR update of %d partitions failed: %s", len(batch), e)
            outcomes = [e] * len(batch)
        self.batches_written += 1
        for (prop, on_result), outcome in zip(batch, outcomes, strict=True):
            self._on_written(prop, on_result, outcome)

    def _on_written(self, prop: ProposeIsr, on_result: Callable[[bool, int], None],
                    outcome: tuple[bool, int] | list[IneligibleReplica] | Exception) -> None:
        if isinstance(outcome, BrokerRegistrationsChangedError):
            # Proposed again at a later fetch or ISR check, against the new registrations.
            self.registration_changed_refused += 1
            logger.info("%s: ISR update to %s not made: %s", prop.tp, list(prop.new_isr), outcome)
            on_result(False, -1)
            return
        if isinstance(outcome, Exception):
            logger.warning("ISR update of %s to %s failed: %s", prop.tp, prop.new_isr, outcome)
            on_result(False, -1)
            return
        if isinstance(outcome, list):
            # Kafka's INELIGIBLE_REPLICA: not attempted; the committed ISR stays.
            self.ineligible_refused += 1
            logger.info("%s: ISR update to %s refused (INELIGIBLE_REPLICA): ineligible replicas "
                        "%s", prop.tp, list(prop.new_isr), ", ".join(map(str, outcome)))
            on_result(False, -1)
            return
        ok, version = outcome
        if ok:
            logger.info("%s: ISR is now %s (zk version %d)", prop.tp, list(prop.new_isr), version)
            p = self.core.partition(prop.tp) if self.core is not None else None
            if self.events is not None and p is not None:
                # p.isr is still the committed ISR: the core adopts new_isr in on_result.
                self.events.isr_changed(prop.tp.topic, prop.tp.partition, prop.leader_epoch,
                                        p.isr, prop.new_isr, p.log_end_offset, p.high_watermark)
        else:
            logger.info("%s: ISR update to %s refused (stale zk version %d); waiting for the "
                        "controller", prop.tp, list(prop.new_isr), prop.zk_version)
        on_result(ok, version)

    def propagate_isr_changes(self, partitions: Collection[TopicPartition],
                              on_result: Callable[[bool], None]) -> None:
        self._spawn(self._propagate(partitions, on_result))

    async def _propagate(self, partitions: Collection[TopicPartition],
                         on_result: Callable[[bool], None]) -> None:
        if self.zk_client is None:
            on_result(False)
            return
        try:
            await asyncio.to_thread(self.zk_client.propagate_isr_changes,
                                    [(tp.topic, tp.partition) for tp in partitions])
        except Exception as e:
            logger.warning("writing an ISR change notification for %d partitions failed: %s",
                           len(partitions), e)
            on_result(False)
            return
        on_result(True)

    async def shutdown(self) -> None:
        if self._background:
            await asyncio.wait(list(self._background), timeout=5)
        for t in list(self._background):
            t.cancel()


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
    ) -> None:
        self.broker_id = broker_id
        self.log_manager = log_manager
        self.config = config
        self.scheduler = AsyncioScheduler()
        self.alter_partition_manager = ZkAlterPartitionManager(zk_client)
        self.log_dir_failure = ZkLogDirFailureHandling(broker_id, zk_client)
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
        )
        self.core = self.shell.core
        self.alter_partition_manager.core = self.core
        self.shell.on_high_watermark_checkpoint = self._on_hw_checkpoint
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
        self.alter_partition_manager.events = publisher

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

    @property
    def isr_notifications_written(self) -> int:
        return self.shell.isr_notifications_written

    def start(self) -> None:
        """The shell's tasks, the log manager's among them."""
        self.shell.startup()

    async def shutdown(self) -> None:
        self.shell.shutdown()
        await self.alter_partition_manager.shutdown()
        await self.log_dir_failure.shutdown()
        for fut in self._waiters:
            if not fut.done():
                fut.cancel()
        self._waiters.clear()

    def checkpoint_high_watermarks(self) -> None:
        self.shell.checkpoint_high_watermarks()

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
