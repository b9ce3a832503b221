"""LogManager: every partition log of a broker across its `log.dirs`.

Each log dir holds one directory per partition (`<topic>-<partition>`), the checkpoint files
`recovery-point-offset-checkpoint`, `log-start-offset-checkpoint` and
`replication-offset-checkpoint` (HW), and, between a clean shutdown and the next start, the
`.kafka_cleanshutdown` marker that lets the next start skip recovery.

A replica moving to another log dir of this broker (AlterReplicaLogDirs, Kafka's JBOD) has a
*future log* there, `<topic>-<partition>.<uuid>-future`, that the shell's copier fills from the
current log; `replace_current_with_future_log` then swaps them: the current dir is renamed to
`<topic>-<partition>.<uuid>-delete`, the future dir to `<topic>-<partition>` (each rename made
durable before the next). A crash leaves either both logs (the future is kept and the copy
resumes once the partition is hosted, as Kafka's ZooKeeper-mode broker) or, between the two
renames, a future log with no current one anywhere: that future was complete (the swap starts
only at equal log end offsets, after a flush), so the load finishes the swap.

A deleted partition's log (StopReplica with delete) is retired the same way, and so is a future
log that goes (its partition deleted, its move redirected): its dir renamed
`<topic>-<partition>.<uuid>-delete` at once (Kafka's asyncDelete). A retired dir goes
file.delete.delay.ms later (`delete_logs`, the shell's `kafka-delete-logs` task); one found at
start (the broker stopped before its delay passed) likewise file.delete.delay.ms after the start.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

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

__all__ = ["CLEAN_SHUTDOWN_FILE", "FUTURE_DIR_SUFFIX", "MAX_DIR_NAME_LENGTH", "CheckpointValues",
           "LogManager", "parse_future_dir_name"]

logger = logging.getLogger(__name__)

CLEAN_SHUTDOWN_FILE = ".kafka_cleanshutdown"
_LEGAL_TOPIC = re.compile(r"[a-zA-Z0-9._-]{1,249}")  # Kafka's Topic.validate
DELETE_DIR_SUFFIX = "-delete"
FUTURE_DIR_SUFFIX = "-future"
MAX_DIR_NAME_LENGTH = 255  # a file name's limit on the file systems Kafka runs on
# Each checkpoint file of a log dir: the value of each log it holds.
_CHECKPOINTED: dict[str, Callable[[Log], int]] = {
    REPLICATION_OFFSET_CHECKPOINT: lambda log: log.high_watermark,
    RECOVERY_POINT_CHECKPOINT: lambda log: log.recovery_point,
    LOG_START_OFFSET_CHECKPOINT: lambda log: log.log_start_offset,
}


@dataclass(frozen=True, slots=True)
class CheckpointValues:
    """Checkpoint files' contents as taken at one moment (`LogManager.checkpoint_values`):
    ``capture`` orders the takings, ``by_dir`` is dir -> file name -> entries."""

    capture: int
    by_dir: Mapping[str, Mapping[str, Mapping[TopicPartition, int]]]


def _dir_name_with_suffix(topic: str, partition: int, suffix: str) -> str:
    """Kafka's UnifiedLog.logDirNameWithSuffix:
    `<topic>-<partition>.<uuid without dashes><suffix>`."""
    return f"{topic}-{partition}.{uuid.uuid4().hex}{suffix}"


def _delete_dir_name(topic: str, partition: int, unique: str | None = None) -> str:
    """Kafka's logDeleteDirName (logDirNameWithSuffixCappedLength): `<tp>.<uuid>-delete` with
    the topic cut so the name stays within 255 characters, as a file system requires: a
    249-character topic's log must still be retired (AlterReplicaLogDirs refuses a future name
    too long instead). ``unique``: the uuid to use (a swap's: its future log's)."""
    suffix = f"-{partition}.{unique or uuid.uuid4().hex}{DELETE_DIR_SUFFIX}"
    return topic[: MAX_DIR_NAME_LENGTH - len(suffix)] + suffix


def _future_uuid(future_dir: str) -> str:
    """`<tp>.<uuid>-future` -> the uuid, which a swap gives the current log it retires."""
    return os.path.basename(future_dir)[: -len(FUTURE_DIR_SUFFIX)].rsplit(".", 1)[1]


def parse_future_dir_name(dir_name: str) -> TopicPartition | None:
    """`orders-3.<uuid>-future` -> ("orders", 3); None for any other name."""
    if not dir_name.endswith(FUTURE_DIR_SUFFIX):
        return None
    stem, dot, _ = dir_name[: -len(FUTURE_DIR_SUFFIX)].rpartition(".")
    return parse_topic_partition(stem) if dot else None


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
        # Replicas moving between log dirs: the future log and its dir (Kafka's futureLogs).
        self.future_logs: dict[TopicPartition, Log] = {}
        self.future_log_dir_of: dict[TopicPartition, str] = {}
        # Where a replica not created yet goes (AlterReplicaLogDirs before its LeaderAndIsr).
        self.preferred_log_dirs: dict[TopicPartition, str] = {}
        self.offline_dirs: set[str] = set()
        # I/O errors at runtime are reported here; the replica manager then takes the dir
        # offline (handle_log_dir_failure). A dir failing at startup is offline from the start.
        self.log_dir_failure_channel = log_dir_failure_channel or LogDirFailureChannel()
        self.log_dir_failure_channel.offline_listeners.append(self._refuse_dir)
        self.had_clean_shutdown: dict[str, bool] = {}
        self.skipped: list[str] = []  # partition dirs that could not be loaded
        # The log cleaner's manager once one runs (Kafka's LogManager.cleaner): a swap moves
        # the moved replica's cleaner checkpoint entry with it.
        self.cleaner: Any = None
        # Partitions the cleaner must not take (a replica being moved to another dir), with
        # how many pauses hold each (Kafka's LogCleaningPaused(count)).
        self.cleaning_paused: dict[TopicPartition, int] = {}
        # Retired dirs (deleted partitions, dropped future logs, moved replicas' old dirs),
        # removed once file.delete.delay.ms has passed (Kafka's logsToBeDeleted): (due, path).
        self.logs_to_be_deleted: list[tuple[int, str]] = []
        # Held by every checkpoint file write (Kafka's CheckpointFile lock): a broker writes
        # its periodic checkpoints on a worker thread (`write_checkpoint_files`), a deletion
        # or a shutdown the same files on its own.
        self._checkpoint_lock = threading.Lock()
        # Values are taken in order (`checkpoint_values`, on the broker's thread) and written
        # later, maybe on a worker: per (dir, file) the capture last written, so that values
        # taken before a newer write (a deletion's) never replace it — a deleted partition's
        # log start or recovery point left in the file would be a re-created one's at the next
        # start.
        self._checkpoint_captures = itertools.count(1)
        self._checkpoint_written: dict[tuple[str, str], int] = {}
        for log_dir in self.log_dirs:
            self._load_dir(log_dir, now_ms)
        self._complete_interrupted_swaps(now_ms)

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
            if not fio.exists(log_dir):
                # The dirs missing on the way down too (log.dirs=/data/kafka/logs on a disk
                # with /data only), on the absolute path as Kafka's (a relative log dir's
                # parent is the working dir, not "").
                created = [os.path.abspath(log_dir)]
                while not fio.exists(parent := os.path.dirname(created[-1])) \
                        and parent != created[-1]:
                    created.append(parent)
                fio.makedirs(log_dir)
                # Kafka's createAndValidateLogDirs: the new dir's name made durable in its
                # parent, or a power loss takes it with every log flushed into it; so is each
                # new parent's (Kafka flushes only the innermost).
                for new_dir in reversed(created):
                    fio.fsync_dir(os.path.dirname(new_dir))
            clean = fio.exists(os.path.join(log_dir, CLEAN_SHUTDOWN_FILE))
            names = fio.listdir(log_dir)
            if not clean and names:
                # After an unclean stop the names found may never have been made durable (a
                # log created without an fsync, then a kill -9): durable now, before a flush
                # moves a recovery point over data whose dir a power loss could still take.
                fio.fsync_dir(log_dir)
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
                # Kafka's loadLog: a retired dir found at start joins logsToBeDeleted with the
                # start's time, so kafka-delete-logs removes it file.delete.delay.ms later (a
                # file so named is not a log: Kafka loads directories only).
                try:
                    fio.listdir(path)
                except OSError:
                    continue
                self.logs_to_be_deleted.append((now_ms + self.config.file_delete_delay_ms, path))
                continue
            future_tp = parse_future_dir_name(name)
            tp = future_tp or parse_topic_partition(name)
            if tp is None:
                continue  # checkpoints, the marker, or foreign files: not ours to touch
            logs, dir_of = ((self.future_logs, self.future_log_dir_of) if future_tp
                            else (self.logs, self.log_dir_of))
            if tp in logs:
                logger.error("%s: partition %s-%d is also in %s; skipped", log_dir, *tp,
                             dir_of[tp])
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
            if future_tp:
                log.topic_partition = tp  # the dir name does not say it
            logs[tp] = log
            dir_of[tp] = log_dir
        if clean:
            try:
                # From here on a crash must be detected as unclean.
                fio.remove(os.path.join(log_dir, CLEAN_SHUTDOWN_FILE))
                fio.fsync_dir(log_dir)
            except OSError as exc:
                logger.error("log dir %s is offline: %s", log_dir, exc)
                self.offline_dirs.add(log_dir)

    def _complete_interrupted_swaps(self, now_ms: int) -> None:
        """A future log with no current log: the broker stopped between the swap's two renames
        (the current was already renamed for deletion, with the future's uuid), so the future
        is the replica. Without that retired dir it is a deleted partition's future log whose
        own deletion failed with its dir (`delete_log`): retired now, not the replica. Not
        done while a dir is offline or a log failed to load: the current may be there."""
        if self.offline_dirs:
            return
        retired = {os.path.basename(p) for _, p in self.logs_to_be_deleted}
        for tp in [tp for tp in self.future_logs if tp not in self.logs]:
            name = f"{tp[0]}-{tp[1]}"
            if any(os.path.basename(p) == name for p in self.skipped):
                continue
            log_dir = self.future_log_dir_of[tp]  # (the promotion forgets it before the open)
            evidence = f"-{tp[1]}.{_future_uuid(self.future_logs[tp].dir)}{DELETE_DIR_SUFFIX}"
            if not any(n.endswith(evidence) for n in retired):
                logger.warning("retiring the future log of %s: its partition was deleted", name)
                try:
                    self.remove_future_log(tp[0], tp[1], now_ms)
                except KafkaStorageError as exc:
                    logger.error("cannot retire the future log of %s: %s", name, exc)
                    self.offline_dirs.add(log_dir)
                continue
            logger.warning("completing the interrupted move of %s to %s", name, log_dir)
            try:
                self._promote_future_log(tp, self.future_logs[tp].high_watermark, now_ms)
            except (StorageError, OSError) as exc:
                logger.error("cannot complete the move of %s: %s", name, exc)
                self.offline_dirs.add(log_dir)

    def _promote_future_log(self, tp: TopicPartition, high_watermark: int, now_ms: int,
                            flush_to: int | None = None) -> Log:
        """The future log becomes the partition's log: flushed (to `flush_to`, default its
        end), closed, renamed to `<topic>-<partition>` (made durable) and opened again from
        there with the recovery point it has."""
        future = self.future_logs[tp]
        log_dir = self.future_log_dir_of[tp]
        future.flush(flush_to)
        future.close()
        path = os.path.join(log_dir, f"{tp[0]}-{tp[1]}")
        self.file_io.rename(future.dir, path)
        self.file_io.fsync_dir(log_dir)
        del self.future_logs[tp], self.future_log_dir_of[tp]
        log = Log(
            path,
            self.config_for(tp[0]),
            self.file_io,
            recovery_point=future.recovery_point,
            log_start_offset=future.log_start_offset,
            now_ms=now_ms,
            had_clean_shutdown=True,  # closed just now: its indexes and snapshot are whole
            producer_id_expiration_ms=self.producer_id_expiration_ms,
        )
        log.update_high_watermark(high_watermark)
        self._watch(log, log_dir)
        self.logs[tp] = log
        self.log_dir_of[tp] = log_dir
        return log

    def _remove_tree(self, path: str) -> None:
        """Remove ``path`` and everything in it; raises the disk's OSError."""
        fio = self.file_io
        for name in fio.listdir(path):
            child = os.path.join(path, name)
            try:
                fio.listdir(child)
            except NotADirectoryError:
                fio.remove(child)
            else:
                self._remove_tree(child)
        fio.remove(path)

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

    def get_future_log(self, topic: str, partition: int) -> Log | None:
        return self.future_logs.get((topic, partition))

    def log_dir_for_path(self, path: str) -> str | None:
        """The configured log dir whose absolute path is `path` (Kafka names dirs by it)."""
        wanted = os.path.normpath(path)
        return next((d for d in self.log_dirs if os.path.abspath(d) == wanted), None)

    def maybe_update_preferred_log_dir(self, topic: str, partition: int, log_dir: str) -> None:
        """Kafka's maybeUpdatePreferredLogDir: remember `log_dir` for the replica unless its
        current or future log is already there."""
        tp = (topic, partition)
        if self.log_dir_of.get(tp) != log_dir and self.future_log_dir_of.get(tp) != log_dir:
            self.preferred_log_dirs[tp] = log_dir

    def get_or_create_log(
        self, topic: str, partition: int, config: LogConfig | None = None, now_ms: int = 0,
        is_new: bool = False, is_future: bool = False,
    ) -> Log:
        """The partition's log, created if missing in its preferred log dir (AlterReplicaLogDirs)
        or else in the log dir holding the fewest logs. A replica that is not new (LeaderAndIsr's
        is_new) is not created while a log dir is offline, as in Kafka's getOrCreateLog: its
        data may be in that dir, and an empty log in another one could lead (and followers
        truncate to it). `is_future`: the future log of a replica moving to its preferred dir."""
        tp = (topic, partition)
        log = (self.future_logs if is_future else self.logs).get(tp)
        if log is not None:
            return log
        preferred = self.preferred_log_dirs.get(tp)
        if is_future:
            if preferred is None:
                raise ValueError(f"Can not create the future log for {topic}-{partition} "
                                 "without having a preferred log directory")
            if self.log_dir_of.get(tp) == preferred:
                raise ValueError(f"Can not create the future log for {topic}-{partition} in "
                                 "the current log directory of this partition")
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
        if preferred is not None:
            if preferred not in online:
                raise KafkaStorageError(
                    f"No log directories available. Tried {os.path.abspath(preferred)}")
            candidates = [preferred]
        elif not online:
            raise KafkaStorageError("every log dir is offline")
        elif len(online) == 1:
            # Kafka's nextLogDirs: the only live dir, without counting its logs (a count per
            # new log, in Python, made a LeaderAndIsr creating 10,000 logs quadratic: 50
            # million steps, 13 of its 33 s in-process)
            candidates = online
        else:
            # ... else the fewest logs first (counted in C)
            counts = Counter(self.log_dir_of.values())
            candidates = sorted(online, key=lambda d: (counts[d], online.index(d)))
        name = (_dir_name_with_suffix(topic, partition, FUTURE_DIR_SUFFIX) if is_future
                else f"{topic}-{partition}")
        # No fsync here (Kafka's createLogDirectory has none): the dir's name, with its files',
        # becomes durable at the log's first flush, or at the next checkpoint written in
        # `log_dir`. A crash before then loses only unflushed data: the log is missing or empty
        # at the next load, and is created again (checkpoint entries of a log not found are
        # dropped at the next write; a HW is clamped to the log end).
        for log_dir in candidates:
            try:
                log = Log(
                    os.path.join(log_dir, name),
                    self.config_for(topic),
                    self.file_io,
                    now_ms=now_ms,
                    producer_id_expiration_ms=self.producer_id_expiration_ms,
                )
                break
            except KafkaStorageError as exc:
                # As Kafka's createLogDirectory: the dir is reported, the next one tried.
                self._io_error(log_dir, f"Error while creating log for {name} in dir "
                                        f"{log_dir}: {exc}")
        else:
            raise KafkaStorageError("No log directories available. Tried "
                                    + ", ".join(os.path.abspath(d) for d in candidates))
        self._watch(log, log_dir)
        if is_future:
            log.topic_partition = tp  # the dir name does not say it
            self.future_logs[tp] = log
            self.future_log_dir_of[tp] = log_dir
        else:
            self.logs[tp] = log
            self.log_dir_of[tp] = log_dir
        # Satisfied (Kafka removes it here too).
        self.preferred_log_dirs.pop(tp, None)
        return log

    def remove_future_log(self, topic: str, partition: int, now_ms: int = 0) -> bool:
        """Retire a replica's future log (a move cancelled or redirected, or its partition
        deleted) as Kafka's asyncDelete(isFuture = true): see `_retire`."""
        tp = (topic, partition)
        log = self.future_logs.pop(tp, None)
        if log is None:
            return False
        self._retire(log, self.future_log_dir_of.pop(tp), topic, partition, now_ms)
        return True

    def replace_current_with_future_log(self, topic: str, partition: int,
                                        now_ms: int = 0) -> Log:
        """Kafka's replaceCurrentWithFutureLog, for a future log that holds everything the
        current one does (equal log end offsets; the caller checks, with nothing appended in
        between). The current dir is renamed for deletion first and the future one takes its
        name second, each rename made durable: a crash in between leaves only the complete
        future log, which the next load promotes. Returns the partition's new log."""
        tp = (topic, partition)
        current = self.logs.get(tp)
        future = self.future_logs.get(tp)
        if current is None:
            raise KafkaStorageError(f"The current replica for {topic}-{partition} is offline")
        if future is None:
            raise KafkaStorageError(f"The future replica for {topic}-{partition} is offline")
        if future.log_end_offset != current.log_end_offset:
            raise ValueError(f"the future log of {topic}-{partition} ends at "
                             f"{future.log_end_offset}, the current one at "
                             f"{current.log_end_offset}")
        source, dest = self.log_dir_of[tp], self.future_log_dir_of[tp]
        fio = self.file_io
        high_watermark = current.high_watermark
        # What the current log had made durable must be durable in the future one before the
        # current copy is given up; above its recovery point it was not durable either (the
        # copier flushes as it goes, so this is a short tail and the event loop is not held).
        durable = min(current.recovery_point, future.log_end_offset)
        try:
            future.flush(durable)
        except (StorageError, OSError) as exc:
            # The destination's error: the current log is untouched and keeps serving.
            raise self._io_error(dest, f"cannot flush {future.dir}: {exc}") from exc
        try:
            current.close()
            # Named after the future log: a stop before the future's rename leaves the evidence
            # `_complete_interrupted_swaps` looks for.
            doomed = os.path.join(source, _delete_dir_name(topic, partition,
                                                           _future_uuid(future.dir)))
            fio.rename(current.dir, doomed)
            fio.fsync_dir(source)
        except (StorageError, OSError) as exc:
            raise self._io_error(source, f"cannot retire {current.dir}: {exc}") from exc
        del self.logs[tp], self.log_dir_of[tp]
        try:
            log = self._promote_future_log(tp, high_watermark, now_ms, flush_to=durable)
        except (StorageError, OSError) as exc:
            # The current log is retired: the replica is the destination's now, whose failure
            # (reported here) takes the partition offline. Left in no dir, it stayed hosted on
            # the closed current log.
            self.future_logs.pop(tp, None)
            self.future_log_dir_of.pop(tp, None)
            self.logs[tp], self.log_dir_of[tp] = future, dest
            raise self._io_error(dest, f"cannot move {topic}-{partition} to {dest}: {exc}") from exc
        if self.cleaner is not None:
            self.cleaner.alter_checkpoint_dir(tp, source, dest)
        # Deleted later, as Kafka's deleteLogs task does (removing a large log's files here
        # would hold the event loop at the swap); a restart removes it if it is still there.
        self.logs_to_be_deleted.append((now_ms + self.config.file_delete_delay_ms, doomed))
        self.checkpoint_logs([source, dest])
        self.checkpoint_high_watermarks([source, dest])
        return log

    # -- the cleaner's pauses ---------------------------------------------------------------
    def abort_and_pause_cleaning(self, tp: TopicPartition) -> None:
        """Kafka's abortAndPauseCleaning: a cleaning pass on the log ends now (nothing of it
        is kept) and none starts until `resume_cleaning`; a pause held before the cleaner
        runs counts too."""
        self.cleaning_paused[tp] = self.cleaning_paused.get(tp, 0) + 1
        if self.cleaner is not None:
            self.cleaner.abort_cleaning(tp)

    def resume_cleaning(self, tp: TopicPartition) -> None:
        """Kafka's resumeCleaning: one pause fewer; the log is cleanable again at none."""
        held = self.cleaning_paused.get(tp, 0) - 1
        if held > 0:
            self.cleaning_paused[tp] = held
        else:
            self.cleaning_paused.pop(tp, None)

    # -- log dir failure ------------------------------------------------------------------
    def _watch(self, log: Log, log_dir: str) -> None:
        """An I/O error of ``log`` reports ``log_dir`` failed (Kafka's UnifiedLog reports its
        parent dir to the LogDirFailureChannel)."""
        channel = self.log_dir_failure_channel
        log.on_io_error = lambda exc: channel.maybe_add_offline_log_dir(
            log_dir, f"Error while accessing log {log.dir} in dir {log_dir}: {exc}")

    def _refuse_dir(self, log_dir: str) -> None:
        """From a dir's first report every log in it (future ones too) refuses appends and
        reads, not just the one that hit the error: Kafka's maybeHandleIOException checks the
        dir's offline state before each operation. The handler closes them later."""
        for logs, dirs in ((self.logs, self.log_dir_of), (self.future_logs,
                                                          self.future_log_dir_of)):
            for tp, d in dirs.items():
                if d == log_dir:
                    logs[tp].failed = True

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
        # Future logs there go too (Kafka's removeOfflineLogs(futureLogs)): their moves stop.
        for tp in sorted(tp for tp, d in self.future_log_dir_of.items() if d == log_dir):
            del self.future_log_dir_of[tp]
            self.future_logs.pop(tp).close_handlers()
        return gone

    def delete_log(self, topic: str, partition: int, now_ms: int = 0) -> bool:
        """Kafka's asyncDelete of a partition's logs (its future log too): see `_retire`. The
        partition's name is free at once: a topic created again gets a new dir beside the
        retired one. A disk error of either log is raised once both were tried (as Kafka's
        asyncDelete of the two), so the current log goes even when its future's dir fails."""
        tp = (topic, partition)
        future_error: KafkaStorageError | None = None
        try:
            # The future first: a future log without a current one counts as a finished move.
            self.remove_future_log(topic, partition, now_ms)
        except KafkaStorageError as exc:
            future_error = exc
        log = self.logs.pop(tp, None)
        if log is not None:
            log_dir = self.log_dir_of.pop(tp)
            if self.cleaner is not None:
                # A pass on the log ends first (Kafka's abortCleaning): its .cleaned file must
                # not be written into the retired dir, nor its claim outlive the log.
                self.cleaner.abort_cleaning(tp)
                self.cleaner.update_checkpoints(log_dir, partition_to_remove=tp)
            self._retire(log, log_dir, topic, partition, now_ms)
        if future_error is not None:
            raise future_error
        return log is not None

    def _retire(self, log: Log, log_dir: str, topic: str, partition: int, now_ms: int) -> None:
        """Kafka's asyncDelete for a log already forgotten: its files closed (nothing more is
        written), its dir renamed `<topic>-<partition>.<uuid>-delete` (made durable) and
        ``log_dir``'s checkpoints written without it; the files go file.delete.delay.ms later
        (`delete_logs`, so a large log's removal never holds the event loop), or that long
        after the next start."""
        log.close_handlers()
        doomed = os.path.join(log_dir, _delete_dir_name(topic, partition))
        try:
            self.file_io.rename(log.dir, doomed)
            self.file_io.fsync_dir(log_dir)
        except OSError as exc:
            raise self._io_error(log_dir, f"cannot delete log {log.dir}: {exc}") from exc
        self.logs_to_be_deleted.append((now_ms + self.config.file_delete_delay_ms, doomed))
        self.checkpoint_logs([log_dir])

    # -- periodic tasks --------------------------------------------------------------------
    def cleanup_logs(self, now_ms: int) -> list[TopicPartition]:
        """Retention for every log, future logs too; returns the partitions whose current log's
        start offset moved (their fetch sessions must answer it). The files of segments
        deleted earlier go here too once their file.delete.delay.ms has passed (so at the
        first retention check after it: log.retention.check.interval.ms bounds the extra
        wait). Retired dirs are `delete_logs`'s. A log's disk error ends the round, as in Kafka's cleanupLogs (the
        log reported its dir, which goes offline; the logs after it wait for the next round),
        but what moved before it is still returned."""
        moved: list[TopicPartition] = []
        for tp, log in list(self.logs.items()):
            start = log.log_start_offset
            failed = False
            try:
                log.delete_expired_files(now_ms)
                log.delete_old_segments(now_ms)
                # A replica moving between dirs: its future log's retention right after
                # (Kafka's cleanupLogs, "clean future logs"). Nobody fetches from it.
                future = self.future_logs.get(tp)
                if future is not None:
                    future.delete_expired_files(now_ms)
                    future.delete_old_segments(now_ms)
            except StorageError as exc:
                logger.error("Error in the retention of %s, round ended: %s", tp, exc)
                failed = True
            if log.log_start_offset != start:
                moved.append(tp)
            if failed:
                break
        return moved

    def delete_logs(self, now_ms: int) -> int:
        """Kafka's deleteLogs: remove the retired dirs (deleted partitions, moved replicas'
        old dirs) whose file.delete.delay.ms has passed (those in an offline dir stay, for the
        next start to queue again); returns how many went. A removal's disk error reports the
        dir, as Kafka's UnifiedLog.delete (maybeHandleIOException): the dir goes offline and
        what is left of the retired dir waits for the next start. In three steps for a broker
        that removes the files on a worker thread: `take_due_deletions`,
        `remove_retired_dirs`, `retired_dirs_failed`."""
        removed, failed = self.remove_retired_dirs(self.take_due_deletions(now_ms))
        self.retired_dirs_failed(failed)
        return removed

    def take_due_deletions(self, now_ms: int) -> list[str]:
        """The retired dirs due now, taken off the queue (those in an offline dir stay)."""
        due = [(t, p) for t, p in self.logs_to_be_deleted
               if t <= now_ms and os.path.dirname(p) not in self.offline_dirs]
        for entry in due:
            self.logs_to_be_deleted.remove(entry)
        return [p for _, p in due]

    def remove_retired_dirs(self, paths: Iterable[str]) -> tuple[int, dict[str, str]]:
        """Remove `take_due_deletions`' dirs: (how many went, path -> what failed). File I/O
        only, in dirs nothing else uses: safe on a worker thread while the broker's own runs
        (`retired_dirs_failed` reports the failures there)."""
        removed = 0
        failed: dict[str, str] = {}
        for path in paths:
            try:
                self._remove_tree(path)
                removed += 1
            except FileNotFoundError:
                removed += 1  # gone already (Kafka's Utils.delete ignores it too)
            except OSError as exc:
                failed[path] = f"Error while deleting log {path}: {exc}"
        return removed, failed

    def retired_dirs_failed(self, failed: Mapping[str, str]) -> None:
        """Report the dir of each retired dir `remove_retired_dirs` failed to remove."""
        for path, message in failed.items():
            self._io_error(os.path.dirname(path), message)

    def next_delete_delay_ms(self, now_ms: int) -> int:
        """When `delete_logs` has work next (Kafka's nextDeleteDelayMs): the earliest retired
        dir's due time, file.delete.delay.ms from now when none waits (in an online dir)."""
        due = [t for t, p in self.logs_to_be_deleted
               if os.path.dirname(p) not in self.offline_dirs]
        return max(0, min(due) - now_ms) if due else self.config.file_delete_delay_ms

    def remove_expired_producers(self, now_ms: int) -> int:
        """Every log's producers idle for producer.id.expiration.ms (Kafka runs this per log
        every producer.id.expiration.check.interval.ms); returns how many went."""
        return sum(log.remove_expired_producers(now_ms) for log in self.all_logs())

    def flush_dirty_logs(self, now_ms: int) -> None:
        """flush.ms for every log (Kafka's kafka-log-flusher task). A log that fails is logged
        and skipped, as Kafka's flushDirtyLogs does: it reported its dir already, and the other
        logs are still flushed."""
        for log in self.all_logs():
            try:
                log.maybe_flush(now_ms)
            except StorageError as exc:
                logger.error("Error flushing %s: %s", log.dir, exc)

    def _by_dir(self, log_dirs: Iterable[str] | None) -> dict[str, dict[TopicPartition, Log]]:
        wanted = list(log_dirs) if log_dirs is not None else self.log_dirs
        grouped: dict[str, dict[TopicPartition, Log]] = {
            d: {} for d in wanted if d not in self.offline_dirs
        }
        for tp, log in self.logs.items():
            d = self.log_dir_of[tp]
            if d in grouped:
                grouped[d][tp] = log
        # A future log is checkpointed in its own dir (it is never in the same dir as its
        # current log), so a restart loads it from its recovery point.
        for tp, log in self.future_logs.items():
            d = self.future_log_dir_of[tp]
            if d in grouped:
                grouped[d][tp] = log
        return grouped

    def checkpoint_values(self, names: Iterable[str], log_dirs: Iterable[str] | None = None
                          ) -> CheckpointValues:
        """What the checkpoint files ``names`` of each online dir (of ``log_dirs`` only, when
        given) hold now: dir -> file name -> entries."""
        values = [(name, _CHECKPOINTED[name]) for name in names]
        return CheckpointValues(next(self._checkpoint_captures), {
            log_dir: {name: {tp: value(log) for tp, log in logs.items()}
                      for name, value in values}
            for log_dir, logs in self._by_dir(log_dirs).items()})

    def write_checkpoint_files(self, values: CheckpointValues) -> dict[str, str]:
        """Write `checkpoint_values`' files; returns dir -> what failed there (a dir's first
        failure ends its files). File I/O only, on values taken before: safe on a worker
        thread while the broker's own thread runs (`checkpoint_write_failed` reports the
        failures there). A file already written from values taken later is left as it is."""
        failed: dict[str, str] = {}
        for log_dir, files in values.by_dir.items():
            try:
                for name, entries in files.items():
                    with self._checkpoint_lock:
                        if self._checkpoint_written.get((log_dir, name), 0) > values.capture:
                            continue
                        OffsetCheckpointFile.in_dir(self.file_io, log_dir, name).write(entries)
                        self._checkpoint_written[(log_dir, name)] = values.capture
            except KafkaStorageError as exc:
                failed[log_dir] = f"Disk error while writing checkpoints in directory {log_dir}: {exc}"
        return failed

    def checkpoint_write_failed(self, failed: Mapping[str, str]) -> KafkaStorageError | None:
        """Report each dir `write_checkpoint_files` failed in offline (as Kafka's
        OffsetCheckpointFile does); the first error, None when none failed."""
        first: KafkaStorageError | None = None
        for log_dir, message in failed.items():
            reported = self._io_error(log_dir, message)
            first = first or reported
        return first

    def _write_checkpoints(self, names: Iterable[str], log_dirs: Iterable[str] | None) -> None:
        """Each online dir's checkpoint files ``names``, now. A dir that fails is reported
        offline and the other dirs are still written; the first failure is raised afterwards
        (a shutdown must not mark such a dir clean)."""
        failure = self.checkpoint_write_failed(
            self.write_checkpoint_files(self.checkpoint_values(names, log_dirs)))
        if failure is not None:
            raise failure

    def checkpoint_logs(self, log_dirs: Iterable[str] | None = None) -> None:
        """Write the recovery points and log start offsets of every log (per log dir)."""
        self._write_checkpoints((RECOVERY_POINT_CHECKPOINT, LOG_START_OFFSET_CHECKPOINT),
                                log_dirs)

    def checkpoint_high_watermarks(self, log_dirs: Iterable[str] | None = None) -> None:
        """Write `replication-offset-checkpoint` from each log's `high_watermark`."""
        self._write_checkpoints((REPLICATION_OFFSET_CHECKPOINT,), log_dirs)

    def shutdown(self) -> None:
        """Flush and close every log, write the checkpoints, then the clean-shutdown marker."""
        for logs, dir_of in ((self.logs, self.log_dir_of),
                             (self.future_logs, self.future_log_dir_of)):
            for tp, log in logs.items():
                if log.closed:
                    continue
                try:
                    log.flush()
                    log.close()
                except StorageError as exc:
                    # No clean marker for a dir that failed: its next start must recover.
                    logger.error("shutdown of %s failed: %s", log.dir, exc)
                    self.offline_dirs.add(dir_of[tp])
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
