"""The log manager's periodic tasks (Kafka's `LogManager.startup` and each `UnifiedLog`'s
`PeriodicProducerExpirationCheck`), on the shell's `Scheduler` and `Time`: the asyncio broker
runs them on the wall clock over its disks, the simulator on virtual time over `MemoryFileIO`.
A checkpoint's files are written on the driver's `DiskExecutor` (`CheckpointTask`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tidelog.protocol.topic_partition import TopicPartition
from tidelog.shell.interfaces import DiskExecutor, RunInline, ScheduledTask, Scheduler, Time
from tidelog.storage.checkpoint import LOG_START_OFFSET_CHECKPOINT, RECOVERY_POINT_CHECKPOINT
from tidelog.storage.errors import StorageError

__all__ = ["NEVER_MS", "CheckpointTask", "LogTaskIntervals", "schedule_checkpoint",
           "schedule_log_tasks"]

logger = logging.getLogger(__name__)

# Kafka's default log.flush.scheduler.interval.ms (Long.MaxValue): the flusher is not scheduled.
NEVER_MS = 2**63 - 1


@dataclass(frozen=True, slots=True)
class LogTaskIntervals:
    """Kafka's config keys and defaults: log.retention.check.interval.ms,
    log.flush.scheduler.interval.ms, log.flush.offset.checkpoint.interval.ms,
    producer.id.expiration.check.interval.ms and log.initial.task.delay.ms (Kafka's internal key:
    when the log manager's own tasks first run)."""

    log_retention_check_interval_ms: int = 300_000
    log_flush_scheduler_interval_ms: int = NEVER_MS
    recovery_point_checkpoint_interval_ms: int = 60_000
    producer_id_expiration_check_interval_ms: int = 600_000
    log_initial_task_delay_ms: int = 30_000


class CheckpointTask:
    """One run of a checkpoint task (Kafka's `highwatermark-checkpoint`,
    `kafka-recovery-point-checkpoint`): the values of the checkpoint files ``names`` are read
    here, on the shell's thread, and the files (a write, an fsync, a rename and a dir fsync
    each: ~25 ms on a virtual disk) written on ``disk``, off the thread that answers requests,
    as Kafka's KafkaScheduler threads write them. A run while the previous one still writes
    is skipped, as Kafka's scheduler never overlaps a task's runs (the next has fresher
    values). A dir whose write failed is reported offline back on the shell's thread, where
    ``on_written`` then runs when every file was written."""

    def __init__(self, name: str, log_manager: Any, names: tuple[str, ...], disk: DiskExecutor,
                 on_written: Callable[[], None] | None = None) -> None:
        self.name = name
        self._log_manager = log_manager
        self._names = names
        self._disk = disk
        self.on_written = on_written
        self.writing = False
        self.stopped = False

    def __call__(self) -> None:
        if self.writing or self.stopped:
            return
        values = self._log_manager.checkpoint_values(self._names)
        self.writing = True
        self._disk.run(self.name, lambda: self._log_manager.write_checkpoint_files(values),
                       self._written)

    def _written(self, failed: dict[str, str] | None) -> None:
        self.writing = False
        if failed is None or self.stopped:
            return  # (a worker reported what went wrong; a stopped broker's dirs are its own)
        if failed:
            # As Kafka's: logged, the dir goes offline, the files written before stay valid.
            error = self._log_manager.checkpoint_write_failed(failed)
            logger.error("%s failed: %s", self.name, error)
            return
        if self.on_written is not None:
            self.on_written()

    def cancel(self) -> None:
        """No run from now on; a write under way ends unreported."""
        self.stopped = True


class _ScheduledCheckpoint:
    """A `CheckpointTask` on its period: cancelling stops both."""

    def __init__(self, task: CheckpointTask, scheduled: ScheduledTask) -> None:
        self._task = task
        self._scheduled = scheduled

    def cancel(self) -> None:
        self._task.cancel()
        self._scheduled.cancel()


def schedule_checkpoint(scheduler: Scheduler, task: CheckpointTask, delay_ms: int,
                        period_ms: int) -> ScheduledTask:
    """``task`` every ``period_ms``, first after ``delay_ms``."""
    return _ScheduledCheckpoint(task, scheduler.schedule(task.name, task, delay_ms, period_ms))


class _DeleteLogsTask:
    """Kafka's `kafka-delete-logs`: removes the retired log dirs (deleted partitions, moved
    replicas' old dirs) once file.delete.delay.ms has passed. It first runs after
    log.initial.task.delay.ms, then reschedules itself for when the next retired dir is due
    (file.delete.delay.ms later when none waits), so a dir goes at its due time. The files are
    removed on ``disk`` (a large log's unlinks held the event loop 35-70 ms), a failure
    reported back on the shell's thread."""

    def __init__(self, log_manager: Any, scheduler: Scheduler, time: Time, delay_ms: int,
                 disk: DiskExecutor) -> None:
        self._log_manager = log_manager
        self._scheduler = scheduler
        self._time = time
        self._disk = disk
        self._cancelled = False
        self._task = scheduler.schedule("kafka-delete-logs", self._run, delay_ms)

    def _run(self) -> None:
        now = self._time.milliseconds()
        due = self._log_manager.take_due_deletions(now)
        if due:
            self._disk.run("kafka-delete-logs",
                           lambda: self._log_manager.remove_retired_dirs(due), self._removed)
        if not self._cancelled:
            self._task = self._scheduler.schedule(
                "kafka-delete-logs", self._run, self._log_manager.next_delete_delay_ms(now))

    def _removed(self, outcome: tuple[int, dict[str, str]] | None) -> None:
        if outcome is not None and not self._cancelled:
            self._log_manager.retired_dirs_failed(outcome[1])

    def cancel(self) -> None:
        self._cancelled = True
        self._task.cancel()


def schedule_log_tasks(
    log_manager: Any, scheduler: Scheduler, time: Time, intervals: LogTaskIntervals,
    on_log_start_moved: Callable[[TopicPartition], None] | None = None,
    disk: DiskExecutor | None = None,
) -> list[ScheduledTask]:
    """Schedule retention, the recovery-point (and log-start-offset) checkpoint, producer-id
    expiration, the removal of retired log dirs and, when its interval is finite, the flusher.
    As in Kafka 3.9, the log manager's tasks first run after log.initial.task.delay.ms (so a
    broker deletes expired segments 30 s after start, not one retention period later);
    producer-id expiration, which Kafka schedules per log (`UnifiedLog`), first runs one period
    in. `on_log_start_moved` hears of every
    partition whose log start offset retention moved: fetch sessions read only changed
    partitions, so without it a follower or consumer would learn the new log start only at
    the partition's next append. ``disk``: where the checkpoint files are written and
    retired dirs removed (default: at once, on the caller's thread)."""
    i = intervals
    disk = disk or RunInline()

    def retention() -> None:
        for topic, partition in log_manager.cleanup_logs(time.milliseconds()):
            if on_log_start_moved is not None:
                on_log_start_moved(TopicPartition(topic, partition))

    def task(name: str, fn: Callable[[], object], period_ms: int,
             delay_ms: int = i.log_initial_task_delay_ms) -> ScheduledTask:
        def run() -> None:
            try:
                fn()
            except (StorageError, OSError) as e:
                # As Kafka's LogManager ("Disk error while writing recovery offsets checkpoint"):
                # logged, the files written before stay valid, the next run tries again.
                logger.error("%s failed: %s", name, e)
        return scheduler.schedule(name, run, delay_ms, period_ms)

    tasks = [
        task("kafka-log-retention", retention, i.log_retention_check_interval_ms),
        schedule_checkpoint(scheduler, CheckpointTask(
            "kafka-recovery-point-checkpoint", log_manager,
            (RECOVERY_POINT_CHECKPOINT, LOG_START_OFFSET_CHECKPOINT), disk),
            i.log_initial_task_delay_ms, i.recovery_point_checkpoint_interval_ms),
        task("PeriodicProducerExpirationCheck",
             lambda: log_manager.remove_expired_producers(time.milliseconds()),
             i.producer_id_expiration_check_interval_ms,
             i.producer_id_expiration_check_interval_ms),
        _DeleteLogsTask(log_manager, scheduler, time, i.log_initial_task_delay_ms, disk),
    ]
    if i.log_flush_scheduler_interval_ms < 2**62:
        tasks.append(task("kafka-log-flusher",
                          lambda: log_manager.flush_dirty_logs(time.milliseconds()),
                          i.log_flush_scheduler_interval_ms))
    return tasks
