"""Kafka's `ReplicaManager` shell around the pure `replication.ReplicaManager` (seed 004), the
one both drivers run.

The core decides; this class performs and schedules, with everything outside injected
(`shell.interfaces`):

- **Controller requests** (LeaderAndIsr, UpdateMetadata, StopReplica) go to the core with the
  broker epoch they were addressed to, so the core's KIP-380 rule refuses a request meant for
  an earlier registration of this broker (-1: not sent, as by a controller older than 2.4).
  The fetcher actions the core returns go to the one `ReplicaFetcherManager`.
- **ISR changes**: every `ProposeIsr` the core returns (expand on a follower's fetch, shrink from
  `isr-expiration`) goes to the `AlterPartitionManager` (AlterPartition to the controller,
  KIP-497, which writes it and tells every broker); its answer goes back to the core with
  `on_isr_update_result`.
- **Delayed operations**: an acks=all produce or a long-polling fetch the core cannot answer at
  once keeps its callback; after every state change the shell asks the core which delayed
  operations completed (`poll_completed`), calls theirs, and keeps one timer at the core's
  `next_deadline_ms` for the ones that expire.
- **Scheduled tasks** (Kafka's names, scheduled once in `startup`): `isr-expiration` every
  `replica.lag.time.max.ms / 2`, `highwatermark-checkpoint` (the `replication-offset-checkpoint`
  file the LogManager reads back when it loads the logs: its values read on the shell's thread,
  the file written on the driver's `DiskExecutor`, `shell.log_tasks.CheckpointTask`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping
from typing import Any

from tidelog.replication.config import ReplicationConfig
from tidelog.replication.errors import Errors
from tidelog.replication.fetcher import LogLookup
from tidelog.replication.replica_manager import (
    FetchOutcome,
    LeaderAndIsrResult,
    ProduceOutcome,
    StopReplicaResult,
)
from tidelog.replication.replica_manager import ReplicaManager as ReplicaManagerCore
from tidelog.replication.types import (
    CompleteFetch,
    CompleteProduce,
    LeaderAndIsrPartitionState,
    ProposeIsr,
    TopicPartition,
)
from tidelog.shell.alter_log_dirs import ReplicaAlterLogDirsManager
from tidelog.shell.fetcher_manager import ReplicaFetcherManager
from tidelog.shell.interfaces import (
    AlterPartitionManager,
    DiskExecutor,
    LeaderEndPointFactory,
    LogDirFailureHandling,
    RunInline,
    ScheduledTask,
    Scheduler,
    Time,
)
from tidelog.shell.log_tasks import (
    CheckpointTask,
    LogTaskIntervals,
    schedule_checkpoint,
    schedule_log_tasks,
)
from tidelog.storage.checkpoint import REPLICATION_OFFSET_CHECKPOINT
from tidelog.storage.producer_state_manager import VerificationGuard
from tidelog.storage.transactions import AppendOrigin

__all__ = ["UNKNOWN_BROKER_EPOCH", "ReplicaManager"]

logger = logging.getLogger(__name__)

# AbstractControlRequest.UNKNOWN_BROKER_EPOCH: a control request without a broker epoch.
UNKNOWN_BROKER_EPOCH = -1

ProduceCallback = Callable[[CompleteProduce], None]
FetchCallback = Callable[[CompleteFetch], None]


def _epoch_or_none(broker_epoch: int) -> int | None:
    return None if broker_epoch == UNKNOWN_BROKER_EPOCH else broker_epoch


class ReplicaManager:
    def __init__(
        self,
        broker_id: int,
        log_manager: Any,
        config: ReplicationConfig,
        *,
        time: Time,
        scheduler: Scheduler,
        alter_partition_manager: AlterPartitionManager,
        leader_end_point: LeaderEndPointFactory,
        num_replica_fetchers: int = 1,
        high_watermark_checkpoint_interval_ms: int = 5000,
        logs_for_fetcher: LogLookup | None = None,
        log_task_intervals: LogTaskIntervals | None = None,
        log_dir_failure: LogDirFailureHandling | None = None,
        disk: DiskExecutor | None = None,
    ) -> None:
        """``logs_for_fetcher``: how the fetchers see a follower's log (default: the core's
        `logs_for_fetcher`); ``log_task_intervals``: the log manager's tasks (Kafka's defaults
        when None); ``log_dir_failure``: what the driver does once a log dir failed at
        runtime (None: log dirs are not taken offline; a failed log only answers
        KAFKA_STORAGE_ERROR); ``disk``: where the checkpoint files are written (None: at
        once, on the shell's thread: a disk that never blocks)."""
        self.broker_id = broker_id
        self.log_manager = log_manager
        self.config = config
        self.time = time
        self.scheduler = scheduler
        self.alter_partition_manager = alter_partition_manager
        self.core = ReplicaManagerCore(broker_id, log_manager, config, broker_epoch=-1)
        self.fetcher_manager = ReplicaFetcherManager(
            broker_id, logs_for_fetcher or self.core.logs_for_fetcher, config, time=time, scheduler=scheduler,
            leader_end_point=leader_end_point, num_fetchers=num_replica_fetchers,
            broker_epoch=-1, on_progress=self.complete_delayed,
            on_new_high_watermarks=self._follower_high_watermarks_moved,
        )
        # Replicas moving between this broker's log dirs (AlterReplicaLogDirs).
        self.alter_log_dirs_manager = ReplicaAlterLogDirsManager(
            log_manager, self.core.partition, time=time, scheduler=scheduler,
            offline_partitions=lambda: self.core.offline_partitions,
            fetch_max_bytes=config.replica_fetch_max_bytes,
            backoff_ms=config.replica_fetch_backoff_ms)
        self._hw_interval_ms = high_watermark_checkpoint_interval_ms
        self._log_task_intervals = log_task_intervals or LogTaskIntervals()
        self._waiting: dict[Hashable, Callable[[Any], None]] = {}
        self._deadline: ScheduledTask | None = None
        self._deadline_ms: int | None = None
        self._tasks: list[ScheduledTask] = []
        self._stopped = False
        self._log_dir_failure = log_dir_failure
        self._disk = disk or RunInline()
        # `highwatermark-checkpoint`; ``on_written``: a driver's observer of each checkpoint
        # written (the broker's telemetry).
        self.high_watermark_checkpoint = CheckpointTask(
            "highwatermark-checkpoint", log_manager, (REPLICATION_OFFSET_CHECKPOINT,),
            self._disk)
        self.isr_updates_ok = 0
        self.isr_updates_failed = 0
        self.stale_broker_epoch_refused = 0
        # Run before each ISR check: a driver whose fetch sessions skip unchanged partitions
        # records those fetches' times here (ReplicaManager.replay_follower_fetches).
        self.before_isr_expiration: Callable[[], None] | None = None

    # ------------------------------------------------------------------ life cycle
    @property
    def broker_epoch(self) -> int:
        return self.core.broker_epoch

    def set_broker_epoch(self, broker_epoch: int) -> None:
        """This broker's registration (the czxid of /brokers/ids/<id>) changed."""
        self.core.broker_epoch = broker_epoch
        self.fetcher_manager.set_broker_epoch(broker_epoch)

    def startup(self) -> None:
        """Kafka's ReplicaManager.startup (and LogManager.startup): the periodic tasks, scheduled
        once."""
        s = self.scheduler
        self._tasks = [
            s.schedule("isr-expiration", self._isr_expiration, 0,
                       max(1, self.config.replica_lag_time_max_ms // 2)),
            schedule_checkpoint(s, self.high_watermark_checkpoint, 0, self._hw_interval_ms),
            # The log manager's (Kafka's LogManager.startup), on the same scheduler and clock.
            *schedule_log_tasks(self.log_manager, s, self.time, self._log_task_intervals,
                                self.log_start_moved, self._disk),
        ]
        if self._log_dir_failure is not None:
            self.log_manager.log_dir_failure_channel.on_offline_log_dir = (
                self._on_offline_log_dir)
            if self.log_manager.log_dir_failure_channel.has_queued_dirs():
                # Reported before now, waking nobody (the channel reports a dir only once).
                self._on_offline_log_dir()

    def shutdown(self) -> None:
        """Stop the tasks and the fetchers; waiting requests are never answered (the caller's
        connections close)."""
        self._stopped = True
        for t in self._tasks:
            t.cancel()
        self._tasks.clear()
        self.fetcher_manager.shutdown()
        self.alter_log_dirs_manager.shutdown()
        if self._log_dir_failure is not None:
            # A log failing while the broker stops is the next start's to find.
            self.log_manager.log_dir_failure_channel.on_offline_log_dir = None
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self._waiting.clear()

    # ------------------------------------------------------------------ scheduled tasks
    def _isr_expiration(self) -> None:
        if self.before_isr_expiration is not None:
            self.before_isr_expiration()
        for prop in self.core.maybe_shrink_isr(self.time.milliseconds()):
            self._propose_isr(prop)
        self.complete_delayed()

    # ------------------------------------------------------------------ log dir failure
    def _on_offline_log_dir(self) -> None:
        # Handled in its own task (Kafka's LogDirFailureHandler thread): the report comes from
        # inside an append, a read or a checkpoint.
        self.scheduler.schedule("log-dir-failure-handler", self._handle_offline_log_dirs, 0)

    def _handle_offline_log_dirs(self) -> None:
        channel = self.log_manager.log_dir_failure_channel
        while (log_dir := channel.take_next_offline_log_dir()) is not None:
            self.handle_log_dir_failure(log_dir)

    def handle_log_dir_failure(self, log_dir: str) -> None:
        """Kafka's handleLogDirFailure: the dir's partitions go offline and their fetchers
        stop, the LogManager takes the dir offline; then the broker halts if no dir is left,
        else the controller is told."""
        handling = self._log_dir_failure
        if self._stopped or handling is None or log_dir in self.log_manager.offline_dirs:
            return
        logger.warning("broker %d: stopping serving replicas in dir %s", self.broker_id, log_dir)
        self.fetcher_manager.apply(
            self.core.handle_log_dir_failure(log_dir, self.time.milliseconds()))
        self.complete_delayed()
        if not self.log_manager.live_log_dirs:
            handling.halt(f"all log dirs in {', '.join(self.log_manager.log_dirs)} have failed")
            return
        handling.propagate_log_dir_event()

    # ------------------------------------------------------------------ ISR writes
    def _propose_isr(self, prop: ProposeIsr) -> None:
        self.alter_partition_manager.submit(
            prop, lambda ok, version: self._on_isr_result(prop, ok, version))

    def _on_isr_result(self, prop: ProposeIsr, ok: bool, version: int) -> None:
        if ok:
            self.isr_updates_ok += 1
        else:
            self.isr_updates_failed += 1
        if self._stopped:
            return
        self.core.on_isr_update_result(prop.tp, ok, version if ok else -1, prop.new_isr,
                                       self.time.milliseconds(), prop.leader_epoch)
        self.complete_delayed()

    # ------------------------------------------------------------------ completions
    def log_start_moved(self, tp: TopicPartition) -> None:
        """Retention or DeleteRecords moved ``tp``'s log start: the core re-checks what waits
        on it (a fetch below the new start answers OFFSET_OUT_OF_RANGE) and those completed are
        answered now, as Kafka's checkAndComplete on the partition's key, not at the shell's
        next timer."""
        self.core.mark_changed(tp, self.time.milliseconds())
        self.complete_delayed()

    def _follower_high_watermarks_moved(self, partitions: list[TopicPartition]) -> None:
        """Kafka's ReplicaFetcherThread.completeDelayedFetchRequests: a consumer's fetch held
        at this follower (KIP-392) is re-checked when the follower's HW moves, not at the end
        of its wait (answered by the ``complete_delayed`` that follows)."""
        now = self.time.milliseconds()
        for tp in partitions:
            self.core.mark_changed(tp, now)

    def complete_delayed(self) -> None:
        """Answer the delayed operations the core completed; keep one timer at the next
        deadline."""
        if self._stopped:
            return
        core = self.core
        for done in core.poll_completed(self.time.milliseconds()):
            if isinstance(done, CompleteFetch):
                for prop in done.isr_proposals:
                    self._propose_isr(prop)
            callback = self._waiting.pop(done.request_key, None)
            if callback is not None:
                callback(done)
        deadline = core.next_deadline_ms()
        if deadline is None:
            return
        if self._deadline is not None and self._deadline_ms is not None \
                and self._deadline_ms <= deadline:
            return
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline_ms = deadline
        self._deadline = self.scheduler.schedule(
            "delayed-operation-expiration", self._on_deadline,
            max(0, deadline - self.time.milliseconds()))

    def _on_deadline(self) -> None:
        self._deadline = None
        self._deadline_ms = None
        self.complete_delayed()

    # ------------------------------------------------------------------ controller requests
    def is_stale_broker_epoch(self, broker_epoch: int) -> bool:
        """KIP-380, as the core rules it: a control request for an earlier registration."""
        return self.core.is_stale_broker_epoch(_epoch_or_none(broker_epoch))

    def become_leader_or_follower(
        self,
        controller_id: int,
        controller_epoch: int,
        broker_epoch: int,
        partition_states: Iterable[LeaderAndIsrPartitionState],
        live_leaders: Collection[int],
    ) -> LeaderAndIsrResult:
        result = self.core.become_leader_or_follower(
            controller_id, controller_epoch, list(partition_states), live_leaders,
            self.time.milliseconds(), broker_epoch=_epoch_or_none(broker_epoch))
        if result.error == Errors.STALE_BROKER_EPOCH:
            self.stale_broker_epoch_refused += 1
        self.fetcher_manager.apply(result.fetcher_actions)
        # Kafka's replicaFetcherManager.shutdownIdleFetcherThreads after every LeaderAndIsr.
        self.fetcher_manager.shutdown_idle_fetcher_threads()
        # A future log loaded from disk resumes its copy once its replica is hosted.
        self.alter_log_dirs_manager.maybe_add_hosted()
        self.complete_delayed()
        return result

    def update_metadata(self, broker_epoch: int,
                        eligible_brokers: Mapping[int, int] | None) -> Errors:
        """``eligible_brokers``: live brokers and the broker epochs of their registrations
        (KIP-841/903), -1 for one not known; None: every replica may join an ISR."""
        error = self.core.update_metadata(_epoch_or_none(broker_epoch), eligible_brokers)
        if error == Errors.STALE_BROKER_EPOCH:
            self.stale_broker_epoch_refused += 1
        return error

    def stop_replicas(
        self, controller_id: int, controller_epoch: int, broker_epoch: int,
        partitions: Mapping[TopicPartition, bool],
    ) -> StopReplicaResult:
        result = self.core.stop_replicas(controller_id, controller_epoch, partitions,
                                         self.time.milliseconds(),
                                         broker_epoch=_epoch_or_none(broker_epoch))
        if result.error == Errors.STALE_BROKER_EPOCH:
            self.stale_broker_epoch_refused += 1
        self.fetcher_manager.apply(result.fetcher_actions)
        self.complete_delayed()
        return result

    # ------------------------------------------------------------------ produce and fetch
    def append_records(
        self, acks: int, entries: Mapping[TopicPartition, Any], timeout_ms: int,
        request_key: Hashable, on_complete: ProduceCallback,
        origin: AppendOrigin = AppendOrigin.CLIENT,
        verification_guards: Mapping[TopicPartition, VerificationGuard] | None = None,
    ) -> ProduceOutcome:
        """Kafka's appendRecords: the outcome now; when it is delayed (acks=-1 waiting for the
        ISR), ``on_complete`` gets the completion (replicated, failed or timed out)."""
        outcome = self.core.append_records(acks, entries, timeout_ms, self.time.milliseconds(),
                                           request_key=request_key, origin=origin,
                                           verification_guards=verification_guards)
        if outcome.delayed:
            self._waiting[request_key] = on_complete  # type: ignore[assignment]
        # The append may complete followers' delayed fetches (and, with nobody else to wait
        # for, this request): answer them in this same turn.
        self.complete_delayed()
        return outcome

    def fetch_messages(
        self,
        replica_id: int,
        max_wait_ms: int,
        min_bytes: int,
        max_bytes: int,
        partitions: Mapping[TopicPartition, tuple[int, ...]],
        request_key: Hashable,
        on_complete: FetchCallback,
        broker_epoch: int | None = None,
        isolation_level: int = 0,
        fetch_only_leader: bool = True,
    ) -> FetchOutcome:
        """Kafka's fetchMessages: ``partitions`` is ``{tp: (fetch offset, current leader epoch,
        log start offset, max bytes[, last fetched epoch])}``; a delayed fetch answers through
        ``on_complete``; ``isolation_level`` READ_COMMITTED (1) reads consumers up to the LSO;
        ``fetch_only_leader`` False lets a follower answer a consumer (Fetch v11+, KIP-392);
        ``broker_epoch``: the fetching follower's (Fetch v15+ ReplicaState), -1 or None: none."""
        outcome = self.core.fetch_messages(
            replica_id, max_wait_ms, min_bytes, max_bytes, partitions, self.time.milliseconds(),
            request_key=request_key,
            broker_epoch=None if broker_epoch is None else _epoch_or_none(broker_epoch),
            isolation_level=isolation_level, fetch_only_leader=fetch_only_leader)
        for prop in outcome.isr_proposals:
            self._propose_isr(prop)
        if outcome.delayed:
            self._waiting[request_key] = on_complete  # type: ignore[assignment]
        self.complete_delayed()
        return outcome
