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
- **Idempotent producers**: per partition a `ProducerStateManager`, checked before the core
  appends (duplicates answered with their original offsets, gaps refused), rebuilt from the log
  the first time the partition leads here, then kept up to date through role changes (the
  fetcher's log is wrapped so that replicated batches and truncations update it).

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
from tidelog.broker.producer_state import (
    ProducerStateManager,
    SequenceCheck,
    batch_producer_info,
)
from tidelog.broker.replication_events import ReplicationEventPublisher
from tidelog.controller.zk_data import LeaderIsrAndControllerEpoch
from tidelog.protocol.records.batch import iter_batches
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
        producer_id_expiration_ms: int = 86_400_000,
    ) -> None:
        self.broker_id = broker_id
        self.log_manager = log_manager
        self.config = config
        self.zk_client = zk_client
        self.core = ReplicaManager(broker_id, log_manager, config, broker_epoch=-1, now_ms=now_ms())
        self.fetcher_manager = ReplicaFetcherManager(
            broker_id, self._logs_for_fetcher, config, endpoint_of,
            num_fetchers=num_replica_fetchers, broker_epoch=-1, on_progress=self._after,
        )
        self.producer_states: dict[TopicPartition, ProducerStateManager] = {}
        self._hw_interval_ms = high_watermark_checkpoint_interval_ms
        self._retention_ms = log_retention_check_interval_ms
        self._flush_ms = log_flush_scheduler_interval_ms
        self._recovery_ckpt_ms = recovery_point_checkpoint_interval_ms
        self._producer_expiration_ms = producer_id_expiration_ms
        self._keys = itertools.count(1)
        self._waiters: dict[int, asyncio.Future[Any]] = {}
        # key -> results known before the wait (acks=-1): merged into the completion's
        self._early_results: dict[int, dict[TopicPartition, ProducePartitionResult]] = {}
        self._deadline_handle: asyncio.TimerHandle | None = None
        self._deadline_ms: int | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._background: set[asyncio.Task[Any]] = set()
        self._changed = asyncio.Event()
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
        self._every("producer-id-expiration", 600_000, self._expire_producers)

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

    def _expire_producers(self) -> None:
        now = now_ms()
        for states in self.producer_states.values():
            states.expire(now, self._producer_expiration_ms)

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
        self._changed.set()
        self._changed = asyncio.Event()
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
                # A state maintained since an earlier leadership here is kept (a follower
                # updates it as it replicates); otherwise it is rebuilt from the log once.
                if p.is_leader and s.tp not in self.producer_states:
                    self._rebuild_producer_state(s.tp)
                if (self.events is not None and p.is_leader
                        and led_before.get(s.tp) != p.leader_epoch):
                    self.events.leader_elected(s.tp.topic, s.tp.partition, p.leader_epoch,
                                               p.isr, p.log_end_offset, p.high_watermark)
        self._after()
        return result

    def _logs_for_fetcher(self, tp: TopicPartition) -> Any:
        log = self.core.logs_for_fetcher(tp)
        if log is None:
            return None
        states = self.producer_states.get(tp)
        return log if states is None else _ProducerTrackingLog(log, states)

    def _rebuild_producer_state(self, tp: TopicPartition) -> None:
        p = self.core.partition(tp)
        if p is None:
            return
        states = ProducerStateManager()
        try:
            states.rebuild_from_log(p.log.batches(p.log.log_start_offset))
        except Exception as e:  # a damaged log answers retries as new batches, never crashes
            logger.warning("%s: rebuilding producer state from the log failed: %s", tp, e)
        self.producer_states[tp] = states

    def stop_replicas(
        self, controller_id: int, controller_epoch: int, partitions: Mapping[TopicPartition, bool]
    ) -> StopReplicaResult:
        result = self.core.stop_replicas(controller_id, controller_epoch, partitions, now_ms())
        self.fetcher_manager.apply(result.fetcher_actions)
        if result.error == Errors.NONE:
            for tp, delete in partitions.items():
                if delete:
                    self.producer_states.pop(tp, None)
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
        their acknowledgements are awaited together. ``origin`` COORDINATOR: a coordinator's
        records or transaction markers, which skip the idempotence check (the log validates
        them as Kafka's AppendOrigin.Coordinator)."""
        loop = asyncio.get_running_loop()
        now = now_ms()
        results: dict[TopicPartition, ProducePartitionResult] = {}
        duplicates: dict[TopicPartition, int] = {}  # tp -> required offset (acks=-1)
        to_append: dict[TopicPartition, Any] = {}
        producer_infos: dict[TopicPartition, Any] = {}
        for tp, records in entries.items():
            p = self.core.partition(tp)
            info = (batch_producer_info(records) if p is not None and p.is_leader
                    and origin == AppendOrigin.CLIENT else None)
            if info is None:
                to_append[tp] = records
                continue
            states = self.producer_states.setdefault(tp, ProducerStateManager())
            check, dup = states.check_batch(info)
            if check == SequenceCheck.DUPLICATE:
                assert dup is not None and p is not None
                results[tp] = ProducePartitionResult(Errors.NONE, dup.first_offset, p.log_start_offset)
                if acks == -1 and p.high_watermark <= dup.last_offset:
                    duplicates[tp] = dup.last_offset + 1
            elif check == SequenceCheck.OUT_OF_ORDER:
                results[tp] = ProducePartitionResult(_OUT_OF_ORDER_SEQUENCE_NUMBER)  # type: ignore[arg-type]
            elif check == SequenceCheck.INVALID_EPOCH:
                results[tp] = ProducePartitionResult(_INVALID_PRODUCER_EPOCH)  # type: ignore[arg-type]
            else:
                to_append[tp] = records
                producer_infos[tp] = (info, p.log_end_offset if p is not None else -1)
        acknowledged: asyncio.Future[dict[TopicPartition, ProducePartitionResult]] = (
            loop.create_future())
        waiting = False
        if to_append:
            key = next(self._keys)
            outcome = self.core.append_records(acks, to_append, timeout_ms, now, request_key=key,
                                               origin=origin)
            for tp, (info, leo_before) in producer_infos.items():
                p = self.core.partition(tp)
                if p is not None and p.log_end_offset > leo_before >= 0:
                    self.producer_states[tp].update(info, leo_before)
            if outcome.delayed:
                # resolved by _after with these results and the completion's
                self._waiters[key] = acknowledged
                self._early_results[key] = results
                waiting = True
            else:
                assert outcome.results is not None
                results.update(outcome.results)
            # The append may complete followers' delayed fetches (and, at acks=-1 with nobody
            # else to wait for, this request): answer them in this same turn.
            self._after()
        if duplicates:
            return loop.create_task(self._acknowledge_duplicates(
                acknowledged if waiting else None, duplicates, now + timeout_ms, results))
        if not waiting:
            acknowledged.set_result(results)
        return acknowledged

    async def _acknowledge_duplicates(
        self,
        appended: asyncio.Future[dict[TopicPartition, ProducePartitionResult]] | None,
        duplicates: dict[TopicPartition, int],
        deadline_ms: int,
        results: dict[TopicPartition, ProducePartitionResult],
    ) -> dict[TopicPartition, ProducePartitionResult]:
        """acks=all with retried batches: the appended ones as usual, the duplicates once the
        HW has passed their originals."""
        if appended is not None:
            results = await appended
        await self._await_high_watermarks(duplicates, deadline_ms, results)
        return results

    async def _await_high_watermarks(
        self,
        required: dict[TopicPartition, int],
        deadline_ms: int,
        results: dict[TopicPartition, ProducePartitionResult],
    ) -> None:
        """acks=all for a duplicate batch: answer once the original is committed (HW past it)."""
        pending = dict(required)
        while pending:
            for tp, offset in list(pending.items()):
                p = self.core.partition(tp)
                if p is None or not p.is_leader:
                    results[tp] = ProducePartitionResult(Errors.NOT_LEADER_OR_FOLLOWER)
                    del pending[tp]
                elif p.high_watermark >= offset:
                    del pending[tp]
            remaining = deadline_ms - now_ms()
            if not pending:
                return
            if remaining <= 0:
                for tp in pending:
                    results[tp] = ProducePartitionResult(Errors.REQUEST_TIMED_OUT)
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout=min(remaining / 1000, 0.5))

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


class _ProducerTrackingLog:
    """A follower's log as its fetcher sees it: appends and truncations also update the
    partition's producer state. Everything else is the log itself."""

    __slots__ = ("_log", "_states")

    def __init__(self, log: Any, states: ProducerStateManager) -> None:
        self._log = log
        self._states = states

    def __getattr__(self, name: str) -> Any:
        return getattr(self._log, name)

    def append_as_follower(self, records: Any, now_ms: int) -> Any:
        info = self._log.append_as_follower(records, now_ms)
        if info.record_count:
            self._states.update_from_batches(iter_batches(records), info.first_offset,
                                             info.last_offset)
        return info

    def truncate_to(self, target_offset: int) -> bool:
        done = self._log.truncate_to(target_offset)
        self._states.truncate(target_offset)
        return done

    def truncate_fully_and_start_at(self, offset: int, now_ms: int | None = None) -> None:
        self._log.truncate_fully_and_start_at(offset, now_ms)
        self._states.producers.clear()


# Kafka error codes the core does not define (idempotent producer).
_OUT_OF_ORDER_SEQUENCE_NUMBER = 45
_INVALID_PRODUCER_EPOCH = 47
