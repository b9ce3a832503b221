"""The log cleaner: Kafka's LogCleaner, LogCleanerManager and Cleaner for compacted topics.

One pass over a log (`Cleaner.clean`):

1. The dirty section runs from the `cleaner-offset-checkpoint` entry (or the log start) to the
   first uncleanable offset: the least of the last stable offset (an open transaction's records
   are never cleaned), the active segment's base offset and, with min.compaction.lag.ms, the
   base offset of the first segment holding a record younger than the lag
   (LogCleanerManager.cleanableOffsets).
2. An `OffsetMap` (key -> latest offset) is built over the dirty section; when it fills, the pass
   stops at the last offset mapped and the rest stays dirty for the next pass.
3. Every segment below that end, clean and dirty, is rewritten in groups whose total size fits
   one segment: a record stays when it is the latest for its key (or lies past the map), a
   tombstone only until its batch's delete horizon (KIP-534: set to now + delete.retention.ms
   the first time the batch is cleaned). Kept batches keep their base offset, last offset delta,
   producer id/epoch/sequence; a batch that lost records is re-encoded. Records of aborted
   transactions (the segments' `.txnindex`) are never mapped and are dropped; the markers and
   the `.txnindex` entries stay (read_committed consumers of the rest still need them).
4. The group is written to `<base>.log.cleaned`, fsynced, renamed to `.log.swap` (the commit
   point: a log loaded with a `.swap` file completes the swap, one with a `.cleaned` file drops
   it), the old segments are renamed `.deleted` and the swap file takes the `.log` name.

The work is a generator yielding the bytes it read since the last yield, so the broker can run
it in bounded steps on its event loop (and pace it to log.cleaner.io.max.bytes.per.second)
while appends go on. Before each swap the group is checked to be unchanged (a truncation or a
retention deletion in between aborts the pass, as Kafka's abortAndPauseCleaning).
"""

from __future__ import annotations

import bisect
import inspect
import logging
import os
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass

from tidelog.protocol.records.batch import RecordBatch
from tidelog.protocol.records.builder import build_empty_batch_header, build_retained_batch
from tidelog.protocol.records.decoder import decode_columns
from tidelog.storage.checkpoint import OffsetCheckpointFile, TopicPartition
from tidelog.storage.cleaner.offset_map import OffsetMap
from tidelog.storage.errors import KafkaStorageError
from tidelog.storage.log import Log
from tidelog.storage.segment import LOG_SUFFIX, LogSegment, file_name
from tidelog.storage.transactions import AbortedRanges

__all__ = [
    "CLEANED_SUFFIX",
    "CLEANER_OFFSET_CHECKPOINT",
    "SWAP_SUFFIX",
    "Cleaner",
    "CleanerConfig",
    "LogCleanerManager",
    "LogToClean",
    "cleanable_offsets",
    "is_compacted",
]

logger = logging.getLogger(__name__)

CLEANER_OFFSET_CHECKPOINT = "cleaner-offset-checkpoint"
CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"
_INT32_MAX = 2**31 - 1


@dataclass(frozen=True, slots=True)
class CleanerConfig:
    """The broker's log.cleaner.* keys (Kafka's CleanerConfig)."""

    num_threads: int = 1
    dedupe_buffer_size: int = 128 * 1024 * 1024
    dedupe_buffer_load_factor: float = 0.9
    max_io_bytes_per_second: float = float("inf")
    backoff_ms: int = 15_000
    enable_cleaner: bool = True
    # producer.id.expiration.ms: a producer seen more recently is active; the last batch of an
    # active producer stays (empty if need be) so that its sequence survives a restart.
    producer_id_expiration_ms: int = 86_400_000


def is_compacted(log: Log) -> bool:
    return "compact" in log.config.cleanup_policy.split(",")


def cleanable_offsets(log: Log, checkpoint: int | None, now_ms: int) -> tuple[int, int, bool]:
    """(first dirty offset, first uncleanable offset, must clean now because of
    max.compaction.lag.ms), as Kafka's LogCleanerManager.cleanableOffsets/maxCompactionDelay."""
    start = log.log_start_offset
    if checkpoint is None or checkpoint < start or checkpoint > log.log_end_offset:
        first_dirty = start  # no checkpoint, or one the log moved past (retention, truncation)
    else:
        first_dirty = checkpoint
    active = log.active_segment
    bounds = [log.last_stable_offset, active.base_offset]
    dirty_segments = _segments(log, first_dirty, active.base_offset)
    lag = log.config.min_compaction_lag_ms
    if lag > 0:
        for segment in dirty_segments:
            if segment.largest_timestamp() > now_ms - lag:
                bounds.append(segment.base_offset)
                break
    first_uncleanable = max(first_dirty, min(bounds))
    force = False
    max_lag = log.config.max_compaction_lag_ms
    firsts = [s.rolling_based_timestamp for s in dirty_segments
              if s.size and s.rolling_based_timestamp is not None]
    if firsts and min(firsts) >= 0:
        force = now_ms - max_lag > min(firsts)
    return first_dirty, first_uncleanable, force


def _segments(log: Log, start: int, end: int) -> list[LogSegment]:
    """Kafka's logSegments(from, to): the segment holding `start` and those after it whose base
    offset is below `end`."""
    bases = [s.base_offset for s in log.segments]
    i = max(0, bisect.bisect_right(bases, start) - 1)
    return [s for s in log.segments[i:] if s.base_offset < end]


@dataclass(slots=True)
class LogToClean:
    log: Log
    first_dirty_offset: int
    first_uncleanable_offset: int
    need_compaction_now: bool
    clean_bytes: int
    cleanable_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.clean_bytes + self.cleanable_bytes

    @property
    def cleanable_ratio(self) -> float:
        return self.cleanable_bytes / self.total_bytes if self.total_bytes else 0.0


def log_to_clean(log: Log, checkpoint: int | None, now_ms: int) -> LogToClean:
    first_dirty, first_uncleanable, force = cleanable_offsets(log, checkpoint, now_ms)
    clean = sum(s.size for s in _segments(log, -1, first_dirty))
    cleanable = sum(s.size for s in _segments(log, first_dirty, first_uncleanable))
    return LogToClean(log, first_dirty, first_uncleanable, force, clean, cleanable)


class Cleaner:
    """Cleans one log at a time with one offset map (one of Kafka's CleanerThreads)."""

    def __init__(self, offset_map: OffsetMap, step_bytes: int = 1024 * 1024,
                 producer_id_expiration_ms: int = 86_400_000) -> None:
        self.offset_map = offset_map
        self.step_bytes = step_bytes
        self.producer_id_expiration_ms = producer_id_expiration_ms
        self.aborted = False
        self._last_batch_of_producer: dict[int, int] = {}
        self._aborted = AbortedRanges(())

    def clean(self, target: LogToClean, now_ms: int) -> Iterator[int]:
        """Clean the log; yields bytes read since the last yield. Afterwards `self.end_offset`
        is the new first dirty offset (to checkpoint), or None when the pass was aborted."""
        log = target.log
        self.end_offset: int | None = None
        self.aborted = False
        offset_map = self.offset_map
        offset_map.clear()
        # The segments this pass may rewrite, as they are now: a truncation or a retention
        # deletion while the pass runs shows as a change of this list or of a size.
        snapshot = _segments(log, -1, target.first_uncleanable_offset)
        sizes = [s.size for s in snapshot]
        self._aborted = AbortedRanges(
            log.collect_aborted_transactions(log.log_start_offset,
                                             target.first_uncleanable_offset))
        yield from self._build_offset_map(log, target.first_dirty_offset,
                                          target.first_uncleanable_offset)
        if snapshot and not self._unchanged(log, snapshot, sizes):
            self._abort(log, None, None)
            return
        end = offset_map.latest_offset + 1 if offset_map.latest_offset >= 0 else \
            target.first_dirty_offset
        end = max(end, target.first_dirty_offset)
        if offset_map.size == 0 and end <= target.first_dirty_offset:
            # A dirty section without keyed records (or empty): nothing to dedupe against, but
            # the section is now clean.
            end = target.first_uncleanable_offset
        cleaned = [s for s in snapshot if s.base_offset < end]
        yield from self._find_last_batches_of_producers(snapshot, now_ms)
        for group in self._group_segments(cleaned, log):
            yield from self._clean_segments(log, group, now_ms, target)
            if self.aborted:
                return
        self.end_offset = end

    # -- the offset map --------------------------------------------------------------------
    def _build_offset_map(self, log: Log, start: int, end: int) -> Iterator[int]:
        offset_map = self.offset_map
        read = 0
        for segment in _segments(log, start, end):
            for batch in segment.iter_batches(_position_of(segment, start)):
                if batch.base_offset >= end:
                    return
                read += batch.size_in_bytes
                if (batch.is_control_batch or batch.last_offset < start
                        or self._aborted.is_aborted(batch)):
                    continue
                columns = decode_columns(batch, verify_crc=False)
                keys: list[bytes] = []
                offsets: list[int] = []
                for key, offset in zip(columns.keys, columns.offsets, strict=True):
                    if key is not None and offset >= start:
                        keys.append(key)
                        offsets.append(offset)
                if offset_map.size + len(keys) > offset_map.max_desired_size:
                    # Full: stop at the last whole batch mapped (Kafka stops there too, so a
                    # batch is never half in the map).
                    if offset_map.size == 0:
                        raise OverflowError(
                            "log.cleaner.dedupe.buffer.size cannot hold the keys of one batch")
                    if read:
                        yield read
                    return
                offset_map.put_all(keys, offsets)
                offset_map.update_latest_offset(batch.last_offset)
                if read >= self.step_bytes:
                    yield read
                    read = 0
        if read:
            yield read

    def _find_last_batches_of_producers(self, segments: list[LogSegment], now_ms: int
                                        ) -> Iterator[int]:
        """The last batch of each active producer below the first uncleanable offset (Kafka
        takes them from the producer state: lastRecordsOfActiveProducers). A producer's later
        batches in the active segment are not looked at: its last batch below stays, one more
        header than Kafka keeps."""
        last: dict[int, int] = {}
        read = 0
        for segment in segments:
            for batch in segment.iter_batches(0):
                read += batch.size_in_bytes
                if batch.producer_id >= 0:
                    if now_ms - batch.max_timestamp < self.producer_id_expiration_ms:
                        last[batch.producer_id] = batch.last_offset
                    else:
                        last.pop(batch.producer_id, None)
                if read >= self.step_bytes * 16:  # headers only: larger steps
                    yield read
                    read = 0
        if read:
            yield read
        self._last_batch_of_producer = last

    # -- grouping and rewriting ------------------------------------------------------------
    @staticmethod
    def _group_segments(segments: list[LogSegment], log: Log) -> list[list[LogSegment]]:
        """Consecutive segments whose total size fits one segment and whose offsets fit one
        segment's int32 relative offsets (Kafka's groupSegmentsBySize)."""
        groups: list[list[LogSegment]] = []
        max_size = log.config.segment_bytes
        i = 0
        while i < len(segments):
            group = [segments[i]]
            size = segments[i].size
            i += 1
            while i < len(segments):
                nxt = segments[i]
                if size + nxt.size > max_size or nxt.next_offset - 1 - group[0].base_offset > _INT32_MAX:
                    break
                # the segment after `nxt` bounds its offsets (the last one: the group end)
                group.append(nxt)
                size += nxt.size
                i += 1
            groups.append(group)
        return groups

    def _retain(self, batch: RecordBatch, now_ms: int, delete_retention_ms: int
                ) -> bytes | bytearray | memoryview | None:
        """The batch as it goes into the cleaned segment: unchanged, re-encoded with fewer
        records (or a new delete horizon), or None when nothing of it stays."""
        if batch.is_control_batch:
            return batch.buf  # transaction markers stay (Kafka removes them after a horizon)
        if self._aborted.is_aborted(batch):
            return None
        latest = self.offset_map.latest_offset
        horizon = batch.delete_horizon_ms
        columns = decode_columns(batch, verify_crc=False)
        keys, offsets, values = columns.keys, columns.offsets, columns.values
        mapped = self.offset_map.get_all([k for k in keys if k is not None])
        kept: list[int] = []  # indexes of the records that stay
        tombstones = False
        m = 0
        for i, key in enumerate(keys):
            offset = offsets[i]
            if key is None:
                keep = offset > latest  # an unkeyed record cannot be compacted (Kafka drops it)
            else:
                keep = offset > latest or (offset >= mapped[m] and (
                    values[i] is not None or horizon is None or now_ms < horizon))
                m += 1
            if keep:
                kept.append(i)
                tombstones = tombstones or values[i] is None
        if not kept:
            if (batch.producer_id >= 0
                    and self._last_batch_of_producer.get(batch.producer_id) == batch.last_offset):
                # Kafka's RETAIN_EMPTY
                return batch.buf if batch.record_count == 0 else build_empty_batch_header(batch)
            return None
        new_horizon = now_ms + delete_retention_ms if tombstones and horizon is None else None
        if len(kept) == len(keys) and new_horizon is None:
            return batch.buf
        rows = columns.rows()
        return build_retained_batch(batch, [rows[i] for i in kept], delete_horizon_ms=new_horizon)

    def _clean_segments(self, log: Log, group: list[LogSegment], now_ms: int,
                        target: LogToClean) -> Iterator[int]:
        fio = log.file_io
        base = group[0].base_offset
        log_path = os.path.join(log.dir, file_name(base, LOG_SUFFIX))
        cleaned_path = log_path + CLEANED_SUFFIX
        swap_path = log_path + SWAP_SUFFIX
        sizes = [s.size for s in group]
        if fio.exists(cleaned_path):
            fio.remove(cleaned_path)
        out = fio.open(cleaned_path)
        try:
            out.truncate(0)
            read = 0
            written = 0
            pending: list[bytes | bytearray | memoryview] = []
            entries: list[tuple[int, int, int]] = []  # (position, last offset, max timestamp)
            delete_retention_ms = log.config.delete_retention_ms
            for segment in group:
                for batch in segment.iter_batches(0):
                    kept = self._retain(batch, now_ms, delete_retention_ms)
                    if kept is not None:
                        kept_batch = RecordBatch(kept)
                        entries.append((written, kept_batch.last_offset,
                                        kept_batch.max_timestamp))
                        written += len(kept)
                        pending.append(bytes(kept))
                    read += batch.size_in_bytes
                    if read >= self.step_bytes:
                        out.append(b"".join(pending))
                        # fsync as we go: the one before the swap then never waits for a
                        # whole segment's worth of dirty pages on the event loop
                        out.flush()
                        pending.clear()
                        yield read
                        read = 0
                        if not self._unchanged(log, group, sizes):
                            self._abort(log, out, cleaned_path)
                            return
            if pending:
                out.append(b"".join(pending))
            out.flush()
        except GeneratorExit:
            self._abort(log, out, cleaned_path, "ended from outside")  # abort_cleaning
            raise
        except BaseException:
            out.close()
            raise
        out.close()
        if read:
            try:
                yield read
            except GeneratorExit:
                self._abort(log, None, cleaned_path, "ended from outside")
                raise
        if not self._unchanged(log, group, sizes):
            self._abort(log, None, cleaned_path)
            return
        # Kafka's replaceSegments: .cleaned -> .swap (the commit point), the old segments go
        # (.deleted), the swap takes the segment's name.
        fio.rename(cleaned_path, swap_path)
        try:
            fio.fsync_dir(log.dir)
            delay = log.config.file_delete_delay_ms
            for segment in group:
                segment.mark_deleted()
                if delay == 0:
                    segment.delete()
                else:
                    log.pending_deletes.append((now_ms + delay, segment))
            fio.fsync_dir(log.dir)
            fio.rename(swap_path, log_path)
            fio.fsync_dir(log.dir)
            cleaned = log._new_segment(base, group[0].created_ms)
            cleaned.index_appended(0, entries, written)
            for segment in group:  # the markers all stay: so do their entries
                for txn in segment.txn_index.entries:
                    cleaned.update_txn_index(txn)
            cleaned.on_become_inactive()
            cleaned.flush_indexes()
        except OSError:
            # The directory no longer matches the log in memory: the log takes no writes until
            # it is reloaded, which completes the swap (Kafka takes the log dir offline).
            log.failed = True
            raise
        first = log.segments.index(group[0])
        log.segments[first : first + len(group)] = [cleaned]
        log._bases = [s.base_offset for s in log.segments]

    @staticmethod
    def _unchanged(log: Log, group: list[LogSegment], sizes: list[int]) -> bool:
        if log.closed or log.failed:
            return False
        try:
            first = log.segments.index(group[0])
        except ValueError:
            return False
        return (log.segments[first : first + len(group)] == group
                and [s.size for s in group] == sizes)

    def _abort(self, log: Log, out: object, cleaned_path: str | None,
               reason: str = "the log changed under the cleaner") -> None:
        self.aborted = True
        close = getattr(out, "close", None)
        if close is not None:
            close()
        if cleaned_path is not None and log.file_io.exists(cleaned_path):
            log.file_io.remove(cleaned_path)
        logger.info("%s: cleaning aborted: %s", log.dir, reason)


def _position_of(segment: LogSegment, offset: int) -> int:
    found = segment.translate_offset(offset)
    return found[0] if found is not None else segment.size


class Throttler:
    """log.cleaner.io.max.bytes.per.second: how long to pause after reading (Kafka's
    Throttler, without its own clock so the driver can pause however it waits)."""

    def __init__(self, max_bytes_per_second: float) -> None:
        self.rate = max_bytes_per_second
        self._start_s: float | None = None
        self._bytes = 0

    def pause_for(self, read: int, now_s: float) -> float:
        if self.rate == float("inf"):
            return 0.0
        if self._start_s is None:
            self._start_s = now_s
        self._bytes += read
        elapsed = now_s - self._start_s
        due = self._bytes / self.rate
        if due <= elapsed:
            if elapsed > 1.0:  # a fresh window each second, as Kafka's checkIntervalMs
                self._start_s, self._bytes = now_s, 0
            return 0.0
        return due - elapsed


class LogCleanerManager:
    """The cleaner's state across logs: the `cleaner-offset-checkpoint` file per log dir, the
    choice of the dirtiest log, and one cleaning pass at a time per cleaner thread."""

    def __init__(self, log_manager: object, config: CleanerConfig) -> None:
        from tidelog.storage.log_manager import LogManager

        assert isinstance(log_manager, LogManager)
        self.log_manager = log_manager
        self.config = config
        self.in_progress: set[TopicPartition] = set()
        # The running pass of each log in progress, to end it from outside (abort_cleaning).
        self._passes: dict[TopicPartition, Generator[int, None, None]] = {}
        self.uncleanable: dict[TopicPartition, Log] = {}
        self.checkpoints: dict[str, OffsetCheckpointFile] = {
            d: OffsetCheckpointFile.in_dir(log_manager.file_io, d, CLEANER_OFFSET_CHECKPOINT)
            for d in log_manager.log_dirs
        }
        self._attached: dict[int, Log] = {}
        # The swap of a moved replica moves its checkpoint entry (Kafka's LogManager.cleaner).
        log_manager.cleaner = self
        self.cleaners = [
            Cleaner(OffsetMap(config.dedupe_buffer_size // config.num_threads,
                              config.dedupe_buffer_load_factor),
                    producer_id_expiration_ms=config.producer_id_expiration_ms)
            for _ in range(config.num_threads)
        ]

    def _attach(self) -> None:
        """Follow truncations of every log: a checkpoint above a truncated log's end comes
        down to it (Kafka's maybeTruncateCheckpoint), else data appended again over the cut
        would pass for clean."""
        for tp, log in list(self.log_manager.logs.items()):
            if id(log) not in self._attached:
                self._attached[id(log)] = log
                log.truncation_listeners.append(
                    lambda end, tp=tp, log=log: self._truncate_checkpoint(tp, log, end))
        for key in [k for k, log in self._attached.items() if log.closed]:
            del self._attached[key]

    def _truncate_checkpoint(self, tp: TopicPartition, log: Log, end: int) -> None:
        if self.log_manager.logs.get(tp) is not log:
            return
        log_dir = self.log_manager.log_dir_of.get(tp)
        if log_dir is None or log_dir in self.log_manager.offline_dirs:
            return

        def lower(entries: dict[TopicPartition, int]) -> bool:
            if entries.get(tp, -1) <= end:
                return False
            entries[tp] = end
            return True

        self._update_checkpoint(log_dir, lower)

    def _update_checkpoint(self, log_dir: str,
                           change: Callable[[dict[TopicPartition, int]], bool]) -> None:
        """Read `log_dir`'s checkpoint, `change` it and write it back if `change` says so. An
        I/O error takes the dir offline and is logged, not raised (Kafka's updateCheckpoints
        over its CheckpointFileWithFailureHandler)."""
        checkpoint = self.checkpoints[log_dir]
        try:
            entries = checkpoint.read()
            if change(entries):
                checkpoint.write(entries)
        except (KafkaStorageError, OSError) as exc:
            self._report(log_dir, f"Failed to access checkpoint file {CLEANER_OFFSET_CHECKPOINT}"
                                  f" in dir {log_dir}: {exc}")

    def _report(self, log_dir: str, message: str) -> None:
        """The channel logs it and queues the dir for the replica manager to take offline."""
        self.log_manager.log_dir_failure_channel.maybe_add_offline_log_dir(log_dir, message)

    def update_checkpoints(self, log_dir: str, partition_to_remove: TopicPartition) -> None:
        """Kafka's updateCheckpoints(dataDir, partitionToRemove): a deleted log's entry goes
        (kept, a partition created again under its name would pass for clean up to it)."""
        self._update_checkpoint(log_dir,
                                lambda entries: entries.pop(partition_to_remove, None) is not None)

    def alter_checkpoint_dir(self, tp: TopicPartition, source_dir: str, dest_dir: str) -> None:
        """Kafka's LogCleaner.alterCheckpointDir: a replica moved to another log dir takes its
        checkpoint entry along (left behind, the moved log would be cleaned again from its
        start, and a truncation of it would not lower the entry)."""
        moved: list[int] = []

        def take(entries: dict[TopicPartition, int]) -> bool:
            if tp in entries:
                moved.append(entries.pop(tp))
            return bool(moved)

        def put(entries: dict[TopicPartition, int]) -> bool:
            entries[tp] = moved[0]
            return True

        self._update_checkpoint(source_dir, take)
        if moved:
            self._update_checkpoint(dest_dir, put)
        self._attach()  # follow the new log's truncations from now on

    def all_checkpoints(self) -> dict[TopicPartition, int]:
        out: dict[TopicPartition, int] = {}
        for log_dir, checkpoint in self.checkpoints.items():
            if log_dir not in self.log_manager.offline_dirs:
                try:
                    out.update(checkpoint.read())
                except (KafkaStorageError, OSError) as exc:
                    self._report(log_dir, "Failed to access checkpoint file "
                                          f"{CLEANER_OFFSET_CHECKPOINT} in dir {log_dir}: {exc}")
        return out

    def grab_filthiest_log(self, now_ms: int) -> LogToClean | None:
        """Kafka's grabFilthiestCompactedLog: among the compacted logs not being cleaned, those
        past min.cleanable.dirty.ratio or due by max.compaction.lag.ms; the highest ratio."""
        self._attach()
        checkpoints = self.all_checkpoints()
        best: LogToClean | None = None
        for tp, log in list(self.log_manager.logs.items()):
            if (tp in self.in_progress or tp in self.log_manager.cleaning_paused
                    or not is_compacted(log) or log.closed or log.failed
                    or self.uncleanable.get(tp) is log):
                continue
            ltc = log_to_clean(log, checkpoints.get(tp), now_ms)
            if ltc.total_bytes == 0:
                continue
            if not ((ltc.need_compaction_now and ltc.cleanable_bytes > 0)
                    or ltc.cleanable_ratio > log.config.min_cleanable_dirty_ratio):
                continue
            if best is None or ltc.cleanable_ratio > best.cleanable_ratio:
                best = ltc
        if best is not None:
            tp = best.log.topic_partition
            assert tp is not None
            self.in_progress.add(tp)
        return best

    def done_cleaning(self, ltc: LogToClean, end_offset: int | None) -> None:
        tp = ltc.log.topic_partition
        assert tp is not None
        self.in_progress.discard(tp)
        if end_offset is None or self.log_manager.logs.get(tp) is not ltc.log:
            return  # aborted, or the log was deleted (and maybe created again) meanwhile
        log_dir = self.log_manager.log_dir_of.get(tp)
        if log_dir is None or log_dir in self.log_manager.offline_dirs:
            return
        live = {t for t, d in self.log_manager.log_dir_of.items() if d == log_dir}

        def advance(entries: dict[TopicPartition, int]) -> bool:
            entries[tp] = end_offset
            for gone in [t for t in entries if t not in live]:
                del entries[gone]
            return True

        self._update_checkpoint(log_dir, advance)

    def clean_once(self, cleaner: Cleaner, now_ms: int) -> Iterator[int] | None:
        """One pass of `cleaner` on the filthiest log as a generator of bytes read (run it to
        the end), or None when no log is due."""
        ltc = self.grab_filthiest_log(now_ms)
        if ltc is None:
            return None
        tp = ltc.log.topic_partition
        assert tp is not None
        steps = self._passes[tp] = self._clean(cleaner, ltc, now_ms)
        return steps

    def abort_cleaning(self, tp: TopicPartition) -> None:
        """The pass cleaning `tp`, if any, ends at once: it is suspended between two steps
        (one event loop), so closing it runs its cleanup (its .cleaned file removed, no
        checkpoint) before this returns, as Kafka's abortCleaning waits for the cleaner
        thread to stop."""
        running = self._passes.get(tp)
        if running is None:
            return
        started = inspect.getgeneratorstate(running) != inspect.GEN_CREATED
        running.close()
        if not started:  # (its cleanup never ran: nothing of it to undo but its claim)
            self._passes.pop(tp, None)
            self.in_progress.discard(tp)

    def _clean(self, cleaner: Cleaner, ltc: LogToClean, now_ms: int
               ) -> Generator[int, None, None]:
        end: int | None = None
        try:
            yield from cleaner.clean(ltc, now_ms)
            end = cleaner.end_offset
        except Exception as exc:
            # Kafka's markPartitionUncleanable: not tried again while this log object lives
            # (a reload after an I/O error or a recreated log gets a fresh chance).
            tp = ltc.log.topic_partition
            assert tp is not None
            self.uncleanable[tp] = ltc.log
            log_dir = self.log_manager.log_dir_of.get(tp)
            if isinstance(exc, OSError) and log_dir is not None:
                # Kafka's CleanerThread: an IOException takes the log's dir offline (a
                # KafkaStorageError means the log reported it already).
                self._report(log_dir, f"Failed to clean up log for {tp[0]}-{tp[1]} in dir "
                                      f"{log_dir} due to IOException: {exc}")
            raise
        finally:
            self._passes.pop(ltc.log.topic_partition, None)  # type: ignore[arg-type]
            self.done_cleaning(ltc, end)
