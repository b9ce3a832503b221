"""The asyncio shell around the pure `replication.ReplicaManager` (seed 004).

The core decides; this class performs and schedules:

- **ISR changes**: every `ProposeIsr` the core returns (ISR expand on a follower's fetch, shrink
  from `isr-expiration`) is written to ZooKeeper as a compare-and-set on the partition state's
  zk version (`KafkaZkClient.update_leader_and_isr`, in a worker thread), and the outcome goes
  back to the core with `on_isr_update_result`.
- **Fetchers**: `AddFetcher` / `RemoveFetcher` actions go to the `ReplicaFetcherManager`.
- **Purgatories**: an acks=all produce or a long-polling fetch the core cannot answer at once
  gets a future; after every state change (`_after`) the shell asks the core which delayed
  operations completed (`poll_completed`) and resolves their futures, and a timer fires at the
  core's `next_deadline_ms` for the ones that expire.
- **Scheduled tasks** (Kafka's names): `highwatermark-checkpoint` every
  `replica.high.watermark.checkpoint.interval.ms` (the `replication-offset-checkpoint` files),
  `isr-expiration` every `replica.lag.time.max.ms / 2` (`maybe_shrink_isr`),
  `isr-change-propagation` every 2.5 s (writes `/isr_change_notification/isr_change_<seq>` for
  the partitions the core hands out), plus the log manager's `kafka-log-retention`,
  `kafka-log-flusher` and `kafka-recovery-point-checkpoint`.
- **Idempotent producers**: each partition's log keeps their state
  (storage/producer_state_manager.py) and answers a retried batch with its original offsets;
  the core passes the answer back. Here only the `PeriodicProducerExpirationCheck` runs.

Everything runs on the event loop thread; only ZooKeeper calls go to threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from typing import Any

from tidelog.broker.fetcher_manager import ReplicaFetcherManager
from tidelog.broker.replication_events import ReplicationEventPublisher
from tidelog.controller.zk_data import LeaderIsrAndControllerEpoch
from tidelog.replication.config import ReplicationConfig
from tidelog.replication.errors import Errors
from tidelog.replication.replica_manager import (
    LeaderAndIsrResult,
    ReplicaManager,
    StopReplicaResult,
)
from tidelog.replication.types import (
    CompleteFetch,
    CompleteProduce,
    EpochEndOffset,
    FetchPartitionData,
    LeaderAndIsrPartitionState,
    ListOffsetsPartitionResult,
    ProducePartitionResult,
    ProposeIsr,
    TopicPartition,
)
from tidelog.storage.transactions import AppendOrigin

__all__ = ["ISR_CHANGE_PROPAGATION_INTERVAL_MS", "BrokerReplicaManager", "now_ms"]

logger = logging.getLogger(__name__)

# Kafka's ReplicaManager.IsrChangePropagationInterval (the task's period; the core applies the
# 5 s blackout / 60 s interval rules of seed 000).
ISR_CHANGE_PROPAGATION_INTERVAL_MS = 2500


def now_ms() -> int:
    return int(time.time() * 1000)


class BrokerReplicaManager:
    def __init__(
        self,
        broker_id: int,
        log_manager: Any,
        config: ReplicationConfig,
        *,
        zk_client: Any | None,
        endpoint_of: Callable[[int], tuple[str, int] | None],
        num_replica_fetchers: int = 1,
        high_watermark_checkpoint_interval_ms: int = 5000,
        log_retention_check_interval_ms: int = 300_000,
        log_flush_scheduler_interval_ms: int = 2**63 - 1,
        recovery_point_checkpoint_interval_ms: int = 60_000,
    ) -> None:
        self.broker_id = broker_id
        self.log_manager = log_manager
        self.config = config
        self.zk_client = zk_client
        self.core = ReplicaManager(broker_id, log_manager, config, broker_epoch=-1, now_ms=now_ms())
        self.fetcher_manager = ReplicaFetcherManager(
            broker_id, self.core.logs_for_fetcher, config, endpoint_of,
            num_fetchers=num_replica_fetchers, broker_epoch=-1, on_progress=self._after,
        )
        self._hw_interval_ms = high_watermark_checkpoint_interval_ms
        self._retention_ms = log_retention_check_interval_ms
        self._flush_ms = log_flush_scheduler_interval_ms
        self._recovery_ckpt_ms = recovery_point_checkpoint_interval_ms
        self._keys = itertools.count(1)
        self._waiters: dict[int, asyncio.Future[Any]] = {}
        # key -> results known before the wait (acks=-1): merged into the completion's
        self._early_results: dict[int, dict[TopicPartition, ProducePartitionResult]] = {}
        self._deadline_handle: asyncio.TimerHandle | None = None
        self._deadline_ms: int | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._background: set[asyncio.Task[Any]] = set()
        self._stopped = False
        self.isr_updates_ok = 0
        self.isr_updates_failed = 0
        self.isr_notifications_written = 0
        self._isr_changes_unwritten: set[TopicPartition] = set()
        # tidelog.replication.events.enable: the telemetry publisher (set by the server)
        self.events: ReplicationEventPublisher | None = None

    # ------------------------------------------------------------------ life cycle
    @property
    def broker_epoch(self) -> int:
        return self.core.broker_epoch

    def set_broker_epoch(self, broker_epoch: int) -> None:
        self.core.broker_epoch = broker_epoch
        self.fetcher_manager.set_broker_epoch(broker_epoch)

    def start(self) -> None:
        """Start the scheduled tasks (Kafka's ReplicaManager.startup + LogManager.startup)."""
        self._every("highwatermark-checkpoint", self._hw_interval_ms, self.checkpoint_high_watermarks)
        self._every("isr-expiration", max(1, self.config.replica_lag_time_max_ms // 2),
                    self._isr_expiration)
        self._every("isr-change-propagation", ISR_CHANGE_PROPAGATION_INTERVAL_MS,
                    self._isr_change_propagation)
        self._every("kafka-log-retention", self._retention_ms,
                    lambda: self.log_manager.cleanup_logs(now_ms()))
        if self._flush_ms < 2**62:
            self._every("kafka-log-flusher", self._flush_ms,
                        lambda: self.log_manager.flush_dirty_logs(now_ms()))
        self._every("kafka-recovery-point-checkpoint", self._recovery_ckpt_ms,
                    self.log_manager.checkpoint_logs)
        # producer.id.expiration.check.interval.ms (Kafka's default, 10 minutes)
        self._every("PeriodicProducerExpirationCheck", 600_000,
                    lambda: self.log_manager.remove_expired_producers(now_ms()))

    async def shutdown(self) -> None:
        self._stopped = True
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(BaseException):
                await t
        self._tasks.clear()
        await self.fetcher_manager.shutdown()
        if self._background:
            await asyncio.wait(list(self._background), timeout=5)
        for t in list(self._background):
            t.cancel()
        if self._deadline_handle is not None:
            self._deadline_handle.cancel()
        for fut in self._waiters.values():
            if not fut.done():
                fut.cancel()
        self._waiters.clear()
        self._early_results.clear()

    def _every(self, name: str, interval_ms: int, fn: Callable[[], Any]) -> None:
        async def loop() -> None:
            while True:
                await asyncio.sleep(interval_ms / 1000)
                try:
                    result = fn()
                    if asyncio.iscoroutine(result):
                        await result
                except asyncio.CancelledError:
                    raise
                except Exception:
                    logger.exception("scheduled task %s failed", name)

        self._tasks.append(asyncio.get_running_loop().create_task(loop(), name=name))

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.get_running_loop().create_task(coro)  # type: ignore[arg-type]
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # ------------------------------------------------------------------ scheduled tasks
    def checkpoint_high_watermarks(self) -> None:
        """`highwatermark-checkpoint`: the `replication-offset-checkpoint` file of each dir."""
        self.log_manager.checkpoint_high_watermarks()
        if self.events is not None:
            self.events.hw_checkpoint(
                (tp.topic, tp.partition, p.leader_epoch, p.isr, p.log_end_offset,
                 p.high_watermark)
                for tp, p in list(self.core.partitions.items())
            )

    def _isr_expiration(self) -> None:
        for prop in self.core.maybe_shrink_isr(now_ms()):
            self._propose_isr(prop)
        self._after()

    async def _isr_change_propagation(self) -> None:
        self._isr_changes_unwritten |= self.core.isr_changes_to_propagate(now_ms())
        tps = self._isr_changes_unwritten
        if not tps or self.zk_client is None:
            return
        try:
            await asyncio.to_thread(self.zk_client.propagate_isr_changes,
                                    sorted((tp.topic, tp.partition) for tp in tps))
        except Exception as e:
            # Kept for the next run, as Kafka keeps its isrChangeSet when the write fails.
            logger.warning("writing an ISR change notification for %d partitions failed: %s",
                           len(tps), e)
            return
        self.isr_notifications_written += 1
        self._isr_changes_unwritten = set()

    # ------------------------------------------------------------------ ISR writes
    def _propose_isr(self, prop: ProposeIsr) -> None:
        self._spawn(self._write_isr(prop))

    async def _write_isr(self, prop: ProposeIsr) -> None:
        ok, version = False, -1
        if self.zk_client is not None:
            state = LeaderIsrAndControllerEpoch(
                prop.leader, prop.leader_epoch, tuple(prop.new_isr), prop.controller_epoch
            )
            try:
                ok, version = await asyncio.to_thread(
                    self.zk_client.update_leader_and_isr,
                    (prop.tp.topic, prop.tp.partition), state, prop.zk_version,
                )
            except Exception as e:
                logger.warning("ISR update of %s to %s failed: %s", prop.tp, prop.new_isr, e)
        if ok:
            self.isr_updates_ok += 1
            logger.info("%s: ISR is now %s (zk version %d)", prop.tp, list(prop.new_isr), version)
            p = self.core.partition(prop.tp)
            if self.events is not None and p is not None:
                # p.isr is still the committed ISR: the core adopts new_isr just below.
                self.events.isr_changed(prop.tp.topic, prop.tp.partition, prop.leader_epoch,
                                        p.isr, prop.new_isr, p.log_end_offset, p.high_watermark)
        else:
            self.isr_updates_failed += 1
            logger.info("%s: ISR update to %s refused (stale zk version %d); waiting for the "
                        "controller", prop.tp, list(prop.new_isr), prop.zk_version)
        if self._stopped:
            return
        self.core.on_isr_update_result(prop.tp, ok, version, prop.new_isr, now_ms(),
                                       prop.leader_epoch)
        self._after()

    # ------------------------------------------------------------------ completions
    def _after(self) -> None:
        """Resolve completed delayed operations and re-arm the deadline timer."""
        if self._stopped:
            return
        for done in self.core.poll_completed(now_ms()):
            if isinstance(done, CompleteFetch):
                for prop in done.isr_proposals:
                    self._propose_isr(prop)
            fut = self._waiters.pop(done.request_key, None)  # type: ignore[arg-type]
            early = self._early_results.pop(done.request_key, None)  # type: ignore[arg-type]
            if fut is not None and not fut.done():
                if early is not None:
                    assert isinstance(done, CompleteProduce)
                    early.update(done.results)
                    fut.set_result(early)
                else:
                    fut.set_result(done)
        deadline = self.core.next_deadline_ms()
        if deadline is None:
            return
        if self._deadline_ms is not None and self._deadline_ms <= deadline and (
            self._deadline_handle is not None
        ):
            return
        if self._deadline_handle is not None:
            self._deadline_handle.cancel()
        self._deadline_ms = deadline
        delay = max(0.0, (deadline - now_ms()) / 1000) + 0.001
        self._deadline_handle = asyncio.get_running_loop().call_later(delay, self._on_deadline)

    def _on_deadline(self) -> None:
        self._deadline_handle = None
        self._deadline_ms = None
        self._after()

    async def _wait_for(self, key: int) -> Any:
        fut = self._waiters.get(key)
        if fut is None:
            fut = self._waiters[key] = asyncio.get_running_loop().create_future()
        self._after()  # it may have completed already
        return await fut

    # ------------------------------------------------------------------ controller requests
    def become_leader_or_follower(
        self,
        controller_id: int,
        controller_epoch: int,
        partition_states: Iterable[LeaderAndIsrPartitionState],
        live_leaders: Collection[int],
    ) -> LeaderAndIsrResult:
        states = list(partition_states)
        led_before = {s.tp: p.leader_epoch for s in states
                      if (p := self.core.partition(s.tp)) is not None and p.is_leader}
        result = self.core.become_leader_or_follower(
            controller_id, controller_epoch, states, live_leaders, now_ms()
        )
        self.fetcher_manager.apply(result.fetcher_actions)
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
        self._after()
        return result

    def stop_replicas(
        self, controller_id: int, controller_epoch: int, partitions: Mapping[TopicPartition, bool]
    ) -> StopReplicaResult:
        result = self.core.stop_replicas(controller_id, controller_epoch, partitions, now_ms())
        self.fetcher_manager.apply(result.fetcher_actions)
        self._after()
        return result

    # ------------------------------------------------------------------ produce
    def append_records(
        self, acks: int, entries: Mapping[TopicPartition, Any], timeout_ms: int,
        origin: AppendOrigin = AppendOrigin.CLIENT,
    ) -> asyncio.Future[dict[TopicPartition, ProducePartitionResult]]:
        """Append one batch per partition now; the returned future resolves to the results
        (acks=-1: once the ISR has them, or after ``timeout_ms``). The append happens before
        this returns, so the appends of a connection's pipelined requests stay in order while
        their acknowledgements are awaited together. A retried batch is answered by the log
        with its original offsets (at acks=-1 once the HW passes them). ``origin``
        COORDINATOR: a coordinator's records or transaction markers (the log validates them
        as Kafka's AppendOrigin.Coordinator)."""
        acknowledged: asyncio.Future[dict[TopicPartition, ProducePartitionResult]] = (
            asyncio.get_running_loop().create_future())
        key = next(self._keys)
        outcome = self.core.append_records(acks, entries, timeout_ms, now_ms(), request_key=key,
                                           origin=origin)
        if outcome.delayed:
            # resolved by _after with the completion's results
            self._waiters[key] = acknowledged
            self._early_results[key] = {}
        else:
            assert outcome.results is not None
            acknowledged.set_result(dict(outcome.results))
        # The append may complete followers' delayed fetches (and, at acks=-1 with nobody
        # else to wait for, this request): answer them in this same turn.
        self._after()
        return acknowledged

    # ------------------------------------------------------------------ fetch
    async def fetch_messages(
        self,
        replica_id: int,
        max_wait_ms: int,
        min_bytes: int,
        max_bytes: int,
        partitions: Mapping[TopicPartition, tuple[int, int, int, int]],
        broker_epoch: int | None = None,
        isolation_level: int = 0,
    ) -> dict[TopicPartition, FetchPartitionData]:
        key = next(self._keys)
        outcome = self.core.fetch_messages(
            replica_id, max_wait_ms, min_bytes, max_bytes, partitions, now_ms(),
            request_key=key, broker_epoch=broker_epoch, isolation_level=isolation_level,
        )
        for prop in outcome.isr_proposals:
            self._propose_isr(prop)
        if outcome.delayed:
            done = await self._wait_for(key)
            assert isinstance(done, CompleteFetch)
            return dict(done.results)
        self._after()
        assert outcome.results is not None
        return outcome.results

    # ------------------------------------------------------------------ offsets
    def last_offset_for_leader_epoch(
        self, replica_id: int, partitions: Mapping[TopicPartition, tuple[int, int]]
    ) -> dict[TopicPartition, EpochEndOffset]:
        return self.core.last_offset_for_leader_epoch(replica_id, partitions)

    def list_offsets(
        self, replica_id: int, partitions: Mapping[TopicPartition, tuple[int, int]]
    ) -> dict[TopicPartition, ListOffsetsPartitionResult]:
        return self.core.list_offsets(replica_id, partitions)
