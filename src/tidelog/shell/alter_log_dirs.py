"""Moving a replica between this broker's log dirs (Kafka's `ReplicaManager.alterReplicaLogDirs`
and `ReplicaAlterLogDirsManager`/`ReplicaAlterLogDirsThread`), on the shell's Scheduler and Time.

AlterReplicaLogDirs names a destination dir per partition. For a hosted replica whose log is
elsewhere, the log manager creates a *future log* there and this manager copies the current log
into it, one read of up to ``replica.fetch.max.bytes`` per step (a step per scheduler turn, so
produce and fetch run in between). The future log follows the current one: a truncation of the
current log truncates the future one at once (a listener), and its log start offset and high
watermark follow at each step. When both end at the same offset, the step swaps them
(`LogManager.replace_current_with_future_log`) and the partition serves from the new log: the
check and the swap happen in one call with nothing appended in between, so the swap is atomic
with respect to produce and fetch. The log cleaner leaves a moving replica alone (a pass on it
ends as the move starts), so nothing holds the swap back. A replica that does not exist yet
keeps the dir as its preferred one and is created there by its LeaderAndIsr (the request
answers REPLICA_NOT_AVAILABLE, as Kafka). A future log found on disk at start resumes copying once its
partition is hosted (`maybe_add_hosted`, after every LeaderAndIsr).

The copy is bounded by ``quota`` (`replica.alter.log.dirs.io.max.bytes.per.second`, Kafka's
ReplicationQuotaManager for QuotaType.AlterLogDirsReplication): every byte copied is recorded,
and while the measured rate is above the bound no partition steps (nor swaps); the next look
is ``backoff_ms`` later, as Kafka's fetcher thread waits replica.fetch.backoff.ms when its
quota leaves it nothing to fetch. A partition whose step fails (a corrupt batch in its log, an
I/O error) is tried again ``backoff_ms`` later while the others go on, as Kafka's fetcher
thread delays a partition with an error.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from tidelog.protocol.errors import ErrorCode
from tidelog.protocol.records.batch import CorruptRecordError
from tidelog.replication.replication_quota import ReplicationQuotaManager
from tidelog.replication.types import TopicPartition
from tidelog.shell.interfaces import ScheduledTask, Scheduler, Time
from tidelog.storage.errors import KafkaStorageError, StorageError
from tidelog.storage.log_manager import MAX_DIR_NAME_LENGTH

__all__ = ["MAX_DIR_NAME_LENGTH", "ReplicaAlterLogDirsManager"]

logger = logging.getLogger(__name__)

# A future dir's name must fit a file name (Kafka's KAFKA-4893 check on logFutureDirName).
_FUTURE_NAME_EXTRA = len(".") + 32 + len("-future")  # .<uuid hex>-future


class ReplicaAlterLogDirsManager:
    def __init__(
        self,
        log_manager: Any,
        partition_of: Callable[[TopicPartition], Any | None],
        *,
        time: Time,
        scheduler: Scheduler,
        offline_partitions: Callable[[], Any] = frozenset,
        fetch_max_bytes: int = 1_048_576,
        backoff_ms: int = 1000,
        quota: ReplicationQuotaManager | None = None,
    ) -> None:
        """``partition_of``: the hosted replica (the core's `Partition`, whose ``log`` the swap
        replaces) or None; ``fetch_max_bytes``: bytes read per step (replica.fetch.max.bytes);
        ``backoff_ms``: the wait after a failed step (replica.fetch.backoff.ms); ``quota``: the
        bound on the bytes copied per second (None: unbounded)."""
        self.log_manager = log_manager
        self.partition_of = partition_of
        self.time = time
        self.scheduler = scheduler
        self.offline_partitions = offline_partitions
        self.fetch_max_bytes = fetch_max_bytes
        self.backoff_ms = backoff_ms
        self.quota = quota
        # Partitions being copied -> the current log whose truncations the future follows,
        # and the listener that follows them.
        self.moving: dict[TopicPartition, tuple[Any, Callable[[int], None]]] = {}
        # Partitions whose last step failed -> when they are tried again (replica.fetch.backoff.ms
        # later, as Kafka's fetcher thread delays a partition with an error).
        self._retry_at: dict[TopicPartition, int] = {}
        self._task: ScheduledTask | None = None
        self._stopped = False
        self.bytes_copied = 0
        self.swaps = 0

    # ------------------------------------------------------------------ requests
    def alter_replica_log_dirs(
        self, partition_dirs: Mapping[TopicPartition, str],
        known: Callable[[TopicPartition], bool],
    ) -> dict[TopicPartition, ErrorCode]:
        """Kafka's ReplicaManager.alterReplicaLogDirs: ``partition_dirs`` maps each partition
        to an absolute dir path; ``known``: the topic partition exists in the metadata (an
        unknown one is UNKNOWN_TOPIC_OR_PARTITION, a known one not hosted here
        REPLICA_NOT_AVAILABLE)."""
        results: dict[TopicPartition, ErrorCode] = {}
        for tp, path in partition_dirs.items():
            try:
                results[tp] = self._alter_one(tp, path, known)
            except KafkaStorageError as e:
                logger.warning("Unable to alter log dirs for %s: %s", tp, e)
                results[tp] = ErrorCode.KAFKA_STORAGE_ERROR
        if any(code == ErrorCode.NONE for code in results.values()):
            self._wake(0)
        return results

    def _alter_one(self, tp: TopicPartition, path: str,
                   known: Callable[[TopicPartition], bool]) -> ErrorCode:
        lm = self.log_manager
        if len(f"{tp.topic}-{tp.partition}") + _FUTURE_NAME_EXTRA > MAX_DIR_NAME_LENGTH:
            return ErrorCode.INVALID_TOPIC_EXCEPTION  # "The topic name is too long."
        log_dir = lm.log_dir_for_path(path)
        if log_dir is None:
            return ErrorCode.LOG_DIR_NOT_FOUND  # "Log dir ... is not found in the config."
        if log_dir in lm.offline_dirs:
            return ErrorCode.KAFKA_STORAGE_ERROR  # "Log directory ... is offline"
        if tp in self.offline_partitions():
            return ErrorCode.KAFKA_STORAGE_ERROR  # "Partition ... is offline"
        partition = self.partition_of(tp)
        if partition is not None and lm.future_log_dir_of.get(tp) not in (None, log_dir):
            # Redirected: the copy to the old destination stops and its future log goes.
            self._stop(tp)
            lm.remove_future_log(tp.topic, tp.partition, self.time.milliseconds())
        lm.maybe_update_preferred_log_dir(tp.topic, tp.partition, log_dir)
        if partition is None:
            return (ErrorCode.REPLICA_NOT_AVAILABLE if known(tp)
                    else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        if lm.log_dir_of.get(tp) == log_dir:
            return ErrorCode.NONE  # already there ("Skipping future replica creation")
        try:
            lm.get_or_create_log(tp.topic, tp.partition, now_ms=self.time.milliseconds(),
                                 is_future=True)
        except (StorageError, OSError) as e:
            raise KafkaStorageError(str(e)) from e
        self._add(tp)
        return ErrorCode.NONE

    def maybe_add_hosted(self) -> None:
        """Resume the copy of every hosted replica with a future log (Kafka's
        maybeAddLogDirFetchers after a LeaderAndIsr): those loaded from disk at start."""
        added = False
        for tp_key in list(self.log_manager.future_logs):
            tp = TopicPartition(*tp_key)
            if tp not in self.moving and self.partition_of(tp) is not None:
                added |= self._add(tp)
        if added:
            self._wake(0)

    def shutdown(self) -> None:
        self._stopped = True
        if self._task is not None:
            self._task.cancel()
            self._task = None
        for tp in list(self.moving):
            self._stop(tp)

    # ------------------------------------------------------------------ the copy
    def _add(self, tp: TopicPartition) -> bool:
        current = self.log_manager.get_log(tp.topic, tp.partition)
        if current is None or tp in self.moving:
            return False
        def listener(end: int) -> None:
            self._on_truncated(tp, current, end)

        self.moving[tp] = (current, listener)
        current.truncation_listeners.append(listener)
        # No cleaning pass holds the log while it moves (Kafka's abortAndPauseCleaning as
        # the move starts, resumed once it ends), so the swap never waits for one.
        self.log_manager.abort_and_pause_cleaning(tp)
        return True

    def _on_truncated(self, tp: TopicPartition, current: Any, end: int) -> None:
        """The current log was truncated (its follower diverged from a new leader, or it was
        truncated fully to a new start): the future log drops the same records."""
        future = self.log_manager.get_future_log(tp.topic, tp.partition)
        if future is None:
            return
        if current.log_start_offset == end == current.log_end_offset \
                and future.log_start_offset != end:
            future.truncate_fully_and_start_at(end, self.time.milliseconds())
        elif future.log_end_offset > end:
            future.truncate_to(end)

    def _wake(self, delay_ms: int) -> None:
        if self._task is None and not self._stopped and self.moving:
            self._task = self.scheduler.schedule("ReplicaAlterLogDirsThread", self._run,
                                                 delay_ms)

    def _run(self) -> None:
        self._task = None
        now = self.time.milliseconds()
        if self.quota is not None and self.quota.is_quota_exceeded(now):
            self._wake(self.backoff_ms)
            return
        for tp in list(self.moving):
            if self._retry_at.get(tp, now) > now:
                continue
            try:
                self._step(tp)
            except (StorageError, OSError, CorruptRecordError) as e:
                # This partition only: the others go on (a corrupt batch in one log, or its
                # dir failing, must not hold up every move).
                logger.error("moving %s to another log dir failed: %s", tp, e)
                if tp in self.moving:  # (a failed swap ended the move)
                    self._retry_at[tp] = now + self.backoff_ms
            else:
                self._retry_at.pop(tp, None)
        # The next step in the next ms (produce and fetch run in between), or at the first
        # retry when every partition waits for one.
        retries = [at for tp, at in self._retry_at.items() if tp in self.moving]
        self._wake(max(1, min(retries) - now) if len(retries) == len(self.moving) and retries
                   else 1)

    def _stop(self, tp: TopicPartition) -> None:
        self._retry_at.pop(tp, None)
        current, listener = self.moving.pop(tp, (None, None))
        if current is None:
            return
        self.log_manager.resume_cleaning(tp)
        if listener in current.truncation_listeners:
            current.truncation_listeners.remove(listener)

    def _step(self, tp: TopicPartition) -> None:
        """One read from the current log into the future one; the swap once they are equal."""
        lm = self.log_manager
        current, _ = self.moving[tp]
        partition = self.partition_of(tp)
        future = lm.get_future_log(tp.topic, tp.partition)
        if (partition is None or future is None or partition.log is not current
                or lm.get_log(tp.topic, tp.partition) is not current):
            # Not hosted any more (StopReplica), its logs deleted, or the move redirected: a
            # future log left on disk resumes at the next LeaderAndIsr.
            self._stop(tp)
            return
        now = self.time.milliseconds()
        if future.log_end_offset < current.log_start_offset:
            future.truncate_fully_and_start_at(current.log_start_offset, now)
        records = current.read(future.log_end_offset, self.fetch_max_bytes).records
        if len(records):
            future.append_as_follower(records, now)
            self.bytes_copied += len(records)
            if self.quota is not None:
                self.quota.record(len(records), now)
        # Made durable as it is copied, up to what the current log has made durable: the swap
        # must not give up a durable copy for one that is not, and one fsync of the whole
        # copy at the swap would hold the event loop (~0.1-0.2 s for 64 MB here).
        durable = min(current.recovery_point, future.log_end_offset)
        if future.recovery_point < durable:
            future.flush(durable)
        future.update_high_watermark(min(current.high_watermark, future.log_end_offset))
        if current.log_start_offset > future.log_start_offset:
            future.maybe_increment_log_start_offset(current.log_start_offset)
        if future.log_end_offset != current.log_end_offset:
            return
        epochs = current.leader_epoch_cache.entries
        self._stop(tp)
        log = lm.replace_current_with_future_log(tp.topic, tp.partition, now)
        # Epochs a leader recorded at its log end before writing in them (KIP-279): no batch
        # carried them over (and a load drops them), but the partition still leads in them.
        latest = log.leader_epoch_cache.latest_epoch
        for epoch, start in epochs:
            if latest is None or epoch > latest:
                log.assign_epoch_start_offset(epoch, start)
        partition.log = log
        self.swaps += 1
        logger.info("%s moved to %s", tp, lm.log_dir_of[tp])
