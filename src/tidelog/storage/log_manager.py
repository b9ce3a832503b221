"""LogManager: every partition log of a broker across its `log.dirs`.

Each log dir holds one directory per partition (`<topic>-<partition>`), the checkpoint files
`recovery-point-offset-checkpoint`, `log-start-offset-checkpoint` and
`replication-offset-checkpoint` (HW), and, between a clean shutdown and the next start, the
`.kafka_cleanshutdown` marker that lets the next start skip recovery.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Iterable

from tidelog.storage.checkpoint import (
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    OffsetCheckpointFile,
    TopicPartition,
)
from tidelog.storage.errors import KafkaStorageError, StorageError
from tidelog.storage.file_io import FileIO, write_file_atomically
from tidelog.storage.log import Log, parse_topic_partition
from tidelog.storage.log_config import LogConfig
from tidelog.storage.log_dir_failure_channel import LogDirFailureChannel

__all__ = ["CLEAN_SHUTDOWN_FILE", "LogManager"]

logger = logging.getLogger(__name__)

CLEAN_SHUTDOWN_FILE = ".kafka_cleanshutdown"
_LEGAL_TOPIC = re.compile(r"[a-zA-Z0-9._-]{1,249}")  # Kafka's Topic.validate
DELETE_DIR_SUFFIX = "-delete"
_CHECKPOINTS = (RECOVERY_POINT_CHECKPOINT, LOG_START_OFFSET_CHECKPOINT, REPLICATION_OFFSET_CHECKPOINT)


class LogManager:
    def __init__(
        self,
        log_dirs: list[str],
        config: LogConfig,
        file_io: FileIO,
        now_ms: int = 0,
        topic_configs: dict[str, LogConfig] | None = None,
        producer_id_expiration_ms: int = 86_400_000,
        log_dir_failure_channel: LogDirFailureChannel | None = None,
    ) -> None:
        if not log_dirs:
            raise ValueError("log.dirs must name at least one directory")
        self.log_dirs = list(dict.fromkeys(os.path.normpath(d) for d in log_dirs))
        self.config = config
        self.file_io = file_io
        self.topic_configs: dict[str, LogConfig] = dict(topic_configs or {})
        # producer.id.expiration.ms (Kafka's ProducerStateManagerConfig, given to every log)
        self.producer_id_expiration_ms = producer_id_expiration_ms
        self.logs: dict[TopicPartition, Log] = {}
        self.log_dir_of: dict[TopicPartition, str] = {}
        self.offline_dirs: set[str] = set()
        # I/O errors at runtime are reported here; the replica manager then takes the dir
        # offline (handle_log_dir_failure). A dir failing at startup is offline from the start.
        self.log_dir_failure_channel = log_dir_failure_channel or LogDirFailureChannel()
        self.had_clean_shutdown: dict[str, bool] = {}
        self.skipped: list[str] = []  # partition dirs that could not be loaded
        for log_dir in self.log_dirs:
            self._load_dir(log_dir, now_ms)

    # -- loading ---------------------------------------------------------------------------
    def _read_checkpoint(self, log_dir: str, name: str) -> dict[TopicPartition, int]:
        try:
            return OffsetCheckpointFile.in_dir(self.file_io, log_dir, name).read()
        except StorageError as exc:
            # A broken checkpoint costs a full recovery, never the broker.
            logger.warning("%s; ignoring it", exc)
            return {}

    def _load_dir(self, log_dir: str, now_ms: int) -> None:
        fio = self.file_io
        try:
            fio.makedirs(log_dir)
            clean = fio.exists(os.path.join(log_dir, CLEAN_SHUTDOWN_FILE))
            names = fio.listdir(log_dir)
        except OSError as exc:
            logger.error("log dir %s is offline: %s", log_dir, exc)
            self.offline_dirs.add(log_dir)
            return
        self.had_clean_shutdown[log_dir] = clean
        recovery_points = self._read_checkpoint(log_dir, RECOVERY_POINT_CHECKPOINT)
        start_offsets = self._read_checkpoint(log_dir, LOG_START_OFFSET_CHECKPOINT)
        high_watermarks = self._read_checkpoint(log_dir, REPLICATION_OFFSET_CHECKPOINT)
        for name in names:
            path = os.path.join(log_dir, name)
            if name.endswith(DELETE_DIR_SUFFIX):
                self._remove_tree(path)
                continue
            tp = parse_topic_partition(name)
            if tp is None:
                continue  # checkpoints, the marker, or foreign files: not ours to touch
            if tp in self.logs:
                logger.error("%s: partition %s-%d is also in %s; skipped", log_dir, *tp,
                             self.log_dir_of[tp])
                self.skipped.append(path)
                continue
            try:
                fio.listdir(path)
            except (NotADirectoryError, FileNotFoundError):
                continue  # a file named like a partition: not a log
            except OSError as exc:
                logger.error("%s: cannot load %s: %s", log_dir, name, exc)
                self.skipped.append(path)
                continue
            try:
                log = Log(
                    path,
                    self.config_for(tp[0]),
                    fio,
                    recovery_point=recovery_points.get(tp, 0),
                    log_start_offset=start_offsets.get(tp, 0),
                    now_ms=now_ms,
                    had_clean_shutdown=clean,
                    producer_id_expiration_ms=self.producer_id_expiration_ms,
                )
            except (StorageError, OSError) as exc:
                logger.error("%s: cannot load %s: %s", log_dir, name, exc)
                self.skipped.append(path)
                continue
            self._watch(log, log_dir)
            if tp in high_watermarks:
                log.update_high_watermark(high_watermarks[tp])
            self.logs[tp] = log
            self.log_dir_of[tp] = log_dir
        if clean:
            try:
                # From here on a crash must be detected as unclean.
                fio.remove(os.path.join(log_dir, CLEAN_SHUTDOWN_FILE))
                fio.fsync_dir(log_dir)
            except OSError as exc:
                logger.error("log dir %s is offline: %s", log_dir, exc)
                self.offline_dirs.add(log_dir)

    def _remove_tree(self, path: str) -> None:
        fio = self.file_io
        try:
            for name in fio.listdir(path):
                child = os.path.join(path, name)
                try:
                    fio.listdir(child)
                    self._remove_tree(child)
                except OSError:
                    fio.remove(child)
            fio.remove(path)
        except OSError as exc:
            logger.warning("cannot remove %s: %s", path, exc)

    # -- partitions ------------------------------------------------------------------------
    def config_for(self, topic: str) -> LogConfig:
        return self.topic_configs.get(topic, self.config)

    def update_topic_config(self, topic: str, config: LogConfig) -> None:
        """A topic's configuration changed (AlterConfigs): its logs use it from now on."""
        self.topic_configs[topic] = config
        for (log_topic, _), log in self.logs.items():
            if log_topic == topic:
                log.update_config(config)

    def get_log(self, topic: str, partition: int) -> Log | None:
        return self.logs.get((topic, partition))

    def all_logs(self) -> list[Log]:
        return list(self.logs.values())

    def get_or_create_log(
        self, topic: str, partition: int, config: LogConfig | None = None, now_ms: int = 0,
        is_new: bool = False,
    ) -> Log:
        """The partition's log, created (in the log dir holding the fewest logs) if missing.
        A replica that is not new (LeaderAndIsr's is_new) is not created while a log dir is
        offline, as in Kafka's getOrCreateLog: its data may be in that dir, and an empty log
        in another one could lead (and followers truncate to it)."""
        tp = (topic, partition)
        log = self.logs.get(tp)
        if log is not None:
            return log
        if not is_new and self.offline_dirs:
            raise KafkaStorageError(
                f"Can not create log for {topic}-{partition} because log directories "
                f"{','.join(d for d in self.log_dirs if d in self.offline_dirs)} are offline")
        unloaded = [p for p in self.skipped if os.path.basename(p) == f"{topic}-{partition}"]
        if not is_new and unloaded:
            # Kafka takes the whole dir offline when a log fails to load; here only that log
            # is left out, so the same rule applies to it alone.
            raise KafkaStorageError(
                f"Can not create log for {topic}-{partition} because its log {unloaded[0]} "
                "could not be loaded")
        if not _LEGAL_TOPIC.fullmatch(topic) or topic in (".", "..") or partition < 0:
            raise ValueError(
                f"invalid topic partition {topic!r}-{partition}: topics are 1-249 characters of "
                "[a-zA-Z0-9._-], partitions >= 0"
            )
        if config is not None:
            self.topic_configs[topic] = config
        online = [d for d in self.log_dirs if d not in self.offline_dirs]
        if not online:
            raise KafkaStorageError("every log dir is offline")
        counts = {d: 0 for d in online}
        for d in self.log_dir_of.values():
            if d in counts:
                counts[d] += 1
        log_dir = min(online, key=lambda d: (counts[d], online.index(d)))
        log = Log(
            os.path.join(log_dir, f"{topic}-{partition}"),
            self.config_for(topic),
            self.file_io,
            now_ms=now_ms,
            producer_id_expiration_ms=self.producer_id_expiration_ms,
        )
        try:
            self.file_io.fsync_dir(log_dir)  # the partition dir's name must survive a crash
        except OSError as exc:
            raise self._io_error(log_dir, f"cannot create log {topic}-{partition}: {exc}") from exc
        self._watch(log, log_dir)
        self.logs[tp] = log
        self.log_dir_of[tp] = log_dir
        return log

    # -- log dir failure ------------------------------------------------------------------
    def _watch(self, log: Log, log_dir: str) -> None:
        """An I/O error of ``log`` reports ``log_dir`` failed (Kafka's UnifiedLog reports its
        parent dir to the LogDirFailureChannel)."""
        channel = self.log_dir_failure_channel
        log.on_io_error = lambda exc: channel.maybe_add_offline_log_dir(
            log_dir, f"Error while accessing log {log.dir} in dir {log_dir}: {exc}")

    def _io_error(self, log_dir: str, message: str) -> KafkaStorageError:
        """Report ``log_dir`` failed (as Kafka's OffsetCheckpointFile and LogManager do) and
        return the error to raise."""
        self.log_dir_failure_channel.maybe_add_offline_log_dir(log_dir, message)
        return KafkaStorageError(message)

    @property
    def live_log_dirs(self) -> list[str]:
        return [d for d in self.log_dirs if d not in self.offline_dirs]

    def handle_log_dir_failure(self, log_dir: str) -> list[TopicPartition]:
        """Kafka's LogManager.handleLogDirFailure: ``log_dir`` goes offline until the restart:
        its logs are closed without writing and forgotten, no checkpoint is written there and
        no log created there any more. Returns the partitions whose log was in it (none if it
        was offline already). The caller halts the broker once no dir is left
        (``live_log_dirs`` empty), as Kafka does."""
        if log_dir in self.offline_dirs or log_dir not in self.log_dirs:
            return []
        logger.warning("Stopping serving logs in dir %s", log_dir)
        self.offline_dirs.add(log_dir)
        gone = sorted(tp for tp, d in self.log_dir_of.items() if d == log_dir)
        for tp in gone:
            del self.log_dir_of[tp]
            self.logs.pop(tp).close_handlers()
        return gone

    def delete_log(self, topic: str, partition: int) -> bool:
        tp = (topic, partition)
        log = self.logs.pop(tp, None)
        if log is None:
            return False
        log_dir = self.log_dir_of.pop(tp)
        log.delete()
        try:
            self.file_io.fsync_dir(log_dir)
        except OSError as exc:
            raise self._io_error(log_dir, f"cannot delete log {topic}-{partition}: {exc}") from exc
        self.checkpoint_logs([log_dir])
        return True

    # -- periodic tasks --------------------------------------------------------------------
    def cleanup_logs(self, now_ms: int) -> list[TopicPartition]:
        """Retention for every log; returns the partitions whose log start offset moved (their
        fetch sessions must answer it). The files of segments deleted earlier go here too once
        their file.delete.delay.ms has passed (so at the first retention check after it:
        log.retention.check.interval.ms bounds the extra wait)."""
        moved: list[TopicPartition] = []
        for tp, log in list(self.logs.items()):
            start = log.log_start_offset
            log.delete_expired_files(now_ms)
            log.delete_old_segments(now_ms)
            if log.log_start_offset != start:
                moved.append(tp)
        return moved

    def remove_expired_producers(self, now_ms: int) -> int:
        """Every log's producers idle for producer.id.expiration.ms (Kafka runs this per log
        every producer.id.expiration.check.interval.ms); returns how many went."""
        return sum(log.remove_expired_producers(now_ms) for log in self.all_logs())

    def flush_dirty_logs(self, now_ms: int) -> None:
        """flush.ms for every log (Kafka's kafka-log-flusher task)."""
        for log in self.all_logs():
            log.maybe_flush(now_ms)

    def _by_dir(self, log_dirs: Iterable[str] | None) -> dict[str, dict[TopicPartition, Log]]:
        wanted = list(log_dirs) if log_dirs is not None else self.log_dirs
        grouped: dict[str, dict[TopicPartition, Log]] = {
            d: {} for d in wanted if d not in self.offline_dirs
        }
        for tp, log in self.logs.items():
            d = self.log_dir_of[tp]
            if d in grouped:
                grouped[d][tp] = log
        return grouped

    def _write_checkpoints(self, log_dirs: Iterable[str] | None,
                           files: dict[str, Callable[[Log], int]]) -> None:
        """Each online dir's checkpoint ``files`` (name -> the log's value). A dir that fails
        is reported offline and the other dirs are still written; the first failure is raised
        afterwards (a shutdown must not mark such a dir clean)."""
        failure: KafkaStorageError | None = None
        for log_dir, logs in self._by_dir(log_dirs).items():
            try:
                for name, value in files.items():
                    OffsetCheckpointFile.in_dir(self.file_io, log_dir, name).write(
                        {tp: value(log) for tp, log in logs.items()})
            except KafkaStorageError as exc:
                reported = self._io_error(
                    log_dir, f"Disk error while writing checkpoints in directory {log_dir}: {exc}")
                failure = failure or reported
        if failure is not None:
            raise failure

    def checkpoint_logs(self, log_dirs: Iterable[str] | None = None) -> None:
        """Write the recovery points and log start offsets of every log (per log dir)."""
        self._write_checkpoints(log_dirs, {
            RECOVERY_POINT_CHECKPOINT: lambda log: log.recovery_point,
            LOG_START_OFFSET_CHECKPOINT: lambda log: log.log_start_offset})

    def checkpoint_high_watermarks(self, log_dirs: Iterable[str] | None = None) -> None:
        """Write `replication-offset-checkpoint` from each log's `high_watermark`."""
        self._write_checkpoints(log_dirs, {
            REPLICATION_OFFSET_CHECKPOINT: lambda log: log.high_watermark})

    def shutdown(self) -> None:
        """Flush and close every log, write the checkpoints, then the clean-shutdown marker."""
        for tp, log in self.logs.items():
            if log.closed:
                continue
            try:
                log.flush()
                log.close()
            except StorageError as exc:
                # No clean marker for a dir that failed: its next start must recover.
                logger.error("shutdown of %s failed: %s", log.dir, exc)
                self.offline_dirs.add(self.log_dir_of[tp])
        for log_dir in self.log_dirs:
            if log_dir in self.offline_dirs:
                continue
            try:
                self.checkpoint_logs([log_dir])
                self.checkpoint_high_watermarks([log_dir])
                write_file_atomically(
                    self.file_io, os.path.join(log_dir, CLEAN_SHUTDOWN_FILE), b""
                )
            except (StorageError, OSError) as exc:
                logger.error("shutdown of log dir %s failed: %s", log_dir, exc)
                self.offline_dirs.add(log_dir)
