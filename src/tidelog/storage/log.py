"""Log: one partition's replica log — a list of segments plus the offsets Kafka tracks on them.

    log_start_offset <= high_watermark <= log_end_offset,  recovery_point <= log_end_offset

The log holds no clock (every time-dependent call takes `now_ms`) and does all I/O through a
`FileIO`, so the simulator runs it over a crash-able in-memory disk.

Append paths never decode records: the leader copies the incoming batches once into a bytearray,
validates each batch header and CRC32C in one pass, stamps base offsets and the leader epoch in
place (both lie outside the CRC), and writes the buffer with one `append`.
"""

from __future__ import annotations

import bisect
import logging
import os
import struct
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import crc32c

from tidelog.protocol.records.batch import (
    ATTRIBUTES_OFFSET,
    CONTROL_FLAG_MASK,
    CRC_OFFSET,
    CURRENT_MAGIC,
    HEADER_SIZE,
    HEADER_STRUCT,
    LOG_OVERHEAD,
    PRODUCER_ID_OFFSET,
    TIMESTAMP_TYPE_MASK,
    TRANSACTIONAL_FLAG_MASK,
    CorruptRecordError,
    RecordBatch,
)
from tidelog.storage.epoch_cache import LeaderEpochFileCache
from tidelog.storage.errors import (
    InvalidOffsetError,
    KafkaStorageError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
    StorageError,
)
from tidelog.storage.file_io import FileIO, FileSlice
from tidelog.storage.log_config import LogConfig
from tidelog.storage.log_validator import needs_validation, validate_and_convert
from tidelog.storage.producer_state_manager import (
    BatchMetadata,
    CorruptSnapshotError,
    ProducerAppendInfo,
    ProducerStateManager,
    VerificationGuard,
    last_sequence,
    read_snapshot,
    snapshot_file_name,
)
from tidelog.storage.segment import (
    DELETED_SUFFIX,
    INDEX_SUFFIX,
    LOG_SUFFIX,
    PREFIX,
    PREFIX_SIZE,
    TIME_INDEX_SUFFIX,
    LogSegment,
    file_name,
    parse_base_offset,
)
from tidelog.storage.transaction_index import TXN_INDEX_SUFFIX, AbortedTxn
from tidelog.storage.transactions import (
    TXN_OR_CONTROL,
    AppendOrigin,
    InvalidRecordError,
    InvalidTxnStateError,
    TransactionTracker,
    TxnBatch,
    txn_batch_of,
)

__all__ = ["FetchDataInfo", "Log", "LogAppendInfo", "parse_topic_partition"]

logger = logging.getLogger(__name__)

_STAMP = struct.Struct(">qii")  # baseOffset, batchLength, partitionLeaderEpoch
_I64 = struct.Struct(">q")
_I32 = struct.Struct(">i")
_I16 = struct.Struct(">h")
_PRODUCER = struct.Struct(">qhi")  # producerId, producerEpoch, baseSequence
_U32 = struct.Struct(">I")
_RECORD_COUNT_OFFSET = 57
_MAX_TIMESTAMP_OFFSET = 35
_EPOCH_OFFSET = 12
_SCRATCH_SUFFIXES = (".tmp", DELETED_SUFFIX, ".cleaned", ".swap")
_SWAP_SUFFIX = ".swap"


_SCRATCH = threading.local()
_SCRATCH_MAX = 16 * 1024 * 1024  # larger appends get a buffer of their own
_VECTORED_MIN = 256 * 1024  # appends from this size on are written with writev


def _scratch_view(size: int) -> memoryview:
    if size > _SCRATCH_MAX:
        return memoryview(bytearray(size))
    buf: bytearray | None = getattr(_SCRATCH, "buf", None)
    if buf is None or len(buf) < size:
        buf = bytearray(max(size, 64 * 1024))
        _SCRATCH.buf = buf
    return memoryview(buf)[:size]


@dataclass(slots=True)
class LogAppendInfo:
    first_offset: int
    last_offset: int
    max_timestamp: int
    valid_bytes: int
    record_count: int
    offset_of_max_timestamp: int = -1
    batch_count: int = 0
    log_append_time: int = -1  # now_ms when the topic stamps LogAppendTime, else -1
    # A retried batch already in the log: nothing was written, the offsets are the original's.
    duplicate: bool = False


@dataclass(slots=True)
class FetchDataInfo:
    """`records`: whole batches (a memoryview, or a FileSlice for sendfile). `first_offset` is
    the offset the read started from (Kafka's fetchOffsetMetadata); the first batch may begin
    before it when that offset lies inside a batch."""

    records: memoryview | FileSlice
    first_offset: int

    @property
    def size_in_bytes(self) -> int:
        return len(self.records)


def _next_offset_of_file(file_io: FileIO, path: str, base_offset: int) -> int:
    """The offset after the last whole batch of a segment file (a header walk)."""
    handle = file_io.open(path)
    try:
        size = handle.size()
        position = 0
        next_offset = base_offset
        while position + PREFIX_SIZE <= size:
            base, length, _, _, _, _, delta = PREFIX.unpack_from(handle.read(position, PREFIX_SIZE), 0)
            if length + LOG_OVERHEAD < HEADER_SIZE or position + length + LOG_OVERHEAD > size:
                break
            next_offset = base + delta + 1
            position += length + LOG_OVERHEAD
        return next_offset
    finally:
        handle.close()


def parse_topic_partition(dir_name: str) -> tuple[str, int] | None:
    """`orders-3` -> ("orders", 3); None for a name that is not `<topic>-<partition>`."""
    topic, sep, partition = dir_name.rpartition("-")
    if not sep or not topic or not partition.isdigit():
        return None
    return topic, int(partition)


class Log:
    def __init__(
        self,
        dir: str,
        config: LogConfig,
        file_io: FileIO,
        *,
        recovery_point: int = 0,
        log_start_offset: int = 0,
        now_ms: int = 0,
        had_clean_shutdown: bool = False,
        producer_id_expiration_ms: int = 86_400_000,
    ) -> None:
        self.dir = dir
        self.config = config
        self.file_io = file_io
        self.topic_partition = parse_topic_partition(os.path.basename(os.path.normpath(dir)))
        self.segments: list[LogSegment] = []
        # file.delete.delay.ms: (when to remove the files, segment renamed to .deleted)
        self.pending_deletes: list[tuple[int, LogSegment]] = []
        self._bases: list[int] = []
        self.log_start_offset = log_start_offset
        self.log_end_offset = log_start_offset
        self.recovery_point = recovery_point
        self.high_watermark = log_start_offset
        self.last_flush_ms = now_ms
        self.closed = False
        # An I/O error happened in its dir: appends and reads are refused until reopened.
        self.failed = False
        # Told of every I/O error (the LogManager reports the log's dir offline: Kafka's
        # LogDirFailureChannel); None for a log outside a LogManager.
        self.on_io_error: Callable[[Exception], None] | None = None
        # Called with the new LEO after a truncation (the log cleaner lowers its checkpoint,
        # as Kafka's LogManager.truncateTo -> maybeTruncateCheckpoint).
        self.truncation_listeners: list[Callable[[int], None]] = []
        self._dir_dirty = False
        # The log's own entry in its parent log dir is not durable yet (a new log): the first
        # flush makes it so, with the names of the files in it (Kafka's LocalLog.flush).
        self._parent_dir_dirty = False
        self.leader_epoch_cache = LeaderEpochFileCache(file_io, dir, lambda: self.log_end_offset)
        # Ongoing transactions and the first unstable offset (KIP-98): the LSO.
        self.transactions = TransactionTracker()
        # Idempotent producers (epochs, sequences, their last batches) and the `.snapshot`
        # files they are reloaded from (Kafka's UnifiedLog.producerStateManager).
        tp = self.topic_partition
        self.producer_state_manager = ProducerStateManager(
            f"{tp[0]}-{tp[1]}" if tp is not None else dir, dir, file_io,
            producer_id_expiration_ms=producer_id_expiration_ms,
            on_dir_change=self._mark_dir_dirty,
        )
        with self._io("load"):
            self._load(had_clean_shutdown, now_ms)

    # -- I/O error mapping -----------------------------------------------------------------
    @contextmanager
    def _io(self, what: str) -> Iterator[None]:
        try:
            yield
        except (OSError, KafkaStorageError) as exc:  # (a checkpoint write's, wrapped)
            raise self._fail(what, exc) from exc

    def _fail(self, what: str, exc: Exception) -> KafkaStorageError:
        """After an I/O error the files may not match the in-memory state (a short write):
        the log refuses further writes until it is reopened. A read's error too: Kafka's
        maybeHandleIOException takes the dir offline at any error and refuses every later
        operation on it, so nothing is appended after a failed read either."""
        self.failed = True
        if self.on_io_error is not None:
            self.on_io_error(exc)
        return KafkaStorageError(f"I/O error during {what} of log {self.dir}: {exc}")

    def _mark_dir_dirty(self) -> None:
        self._dir_dirty = True

    def _check_writable(self) -> None:
        if self.closed:
            raise KafkaStorageError(f"log {self.dir} is closed")
        if self.failed:
            raise KafkaStorageError(
                f"log {self.dir} is offline after an I/O error; reopen it to recover"
            )

    # -- loading and recovery --------------------------------------------------------------
    def _new_segment(self, base_offset: int, now_ms: int) -> LogSegment:
        self._dir_dirty = True
        segment = LogSegment(
            self.file_io,
            self.dir,
            base_offset,
            index_interval_bytes=self.config.index_interval_bytes,
            max_index_bytes=self.config.segment_index_bytes,
            created_ms=now_ms,
        )
        jitter = min(self.config.segment_jitter_ms, self.config.segment_ms)
        if jitter > 0:
            # Kafka draws a random jitter per segment so that partitions do not all roll at
            # once; a hash of (dir, base offset) spreads them the same way, deterministically.
            seed = crc32c.crc32c(f"{self.dir}:{base_offset}".encode())
            segment.roll_jitter_ms = seed % jitter
        return segment

    def _load(self, had_clean_shutdown: bool, now_ms: int) -> None:
        fio = self.file_io
        self._parent_dir_dirty = not fio.exists(self.dir)
        fio.makedirs(self.dir)
        if any(name.endswith(LOG_SUFFIX + _SWAP_SUFFIX) for name in fio.listdir(self.dir)):
            self._complete_swaps()
        names = fio.listdir(self.dir)
        log_bases: set[int] = set()
        for name in names:
            if name.endswith(_SCRATCH_SUFFIXES):
                # Leftovers of an interrupted checkpoint write or segment deletion.
                fio.remove(os.path.join(self.dir, name))
                self._dir_dirty = True
                continue
            base = parse_base_offset(name, LOG_SUFFIX)
            if base is not None:
                log_bases.add(base)
        for name in names:
            for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX):
                base = parse_base_offset(name, suffix)
                if base is not None and base not in log_bases:
                    logger.warning("%s: removing orphaned index file %s", self.dir, name)
                    fio.remove(os.path.join(self.dir, name))
                    self._dir_dirty = True
        try:
            self.leader_epoch_cache.load()
            rebuild_epochs = False
        except StorageError as exc:
            logger.warning("%s: %s; rebuilding the leader epoch cache from the log", self.dir, exc)
            rebuild_epochs = True

        cleaned = self._dir_dirty
        for base in sorted(log_bases):
            self.segments.append(self._new_segment(base, now_ms))
        self._dir_dirty = cleaned  # opening existing segments changes no directory entry
        if not self.segments:
            # A new (or emptied by a crash) log: its first segment's name becomes durable at
            # the first flush, not here (Kafka creates logs without an fsync; an fsync per new
            # log held the event loop ~12 ms per partition of a LeaderAndIsr). A crash before
            # that flush loses no flushed data: the log comes back empty, at its start offset.
            self.segments.append(self._new_segment(self.log_start_offset, now_ms))
            self._dir_dirty = cleaned
        new_segment_pending = not log_bases
        self._bases = [s.base_offset for s in self.segments]

        first_unflushed = max(0, bisect.bisect_right(self._bases, self.recovery_point) - 1)
        recovered_epochs: list[tuple[int, int]] = []
        # Where the recovery of an unclean shutdown starts: the epoch checkpoint is written by
        # `flush`, so past the recovery point it may lag the batches (see below).
        unflushed_from: int | None = None
        recovered: set[int] = set()  # segments whose .txnindex is rebuilt
        i = 0
        while i < len(self.segments):
            segment = self.segments[i]
            if i and segment.base_offset < self.segments[i - 1].next_offset:
                logger.warning("%s: segment %d overlaps its predecessor", self.dir, segment.base_offset)
                self._delete_segments_from(i)
                break
            must_recover = not had_clean_shutdown and i >= first_unflushed
            if not must_recover and not segment.load_indexes():
                must_recover = True
            if must_recover:
                recovered.add(segment.base_offset)
                if unflushed_from is None and not had_clean_shutdown and i >= first_unflushed:
                    unflushed_from = segment.base_offset
                truncated, epochs = segment.recover()
                recovered_epochs.extend(epochs)
                if truncated:
                    segment.log.flush()  # the cut must be durable before anything is appended
                    logger.warning(
                        "%s: truncated %d invalid bytes at offset %d of segment %d",
                        self.dir, truncated, segment.next_offset, segment.base_offset,
                    )
                    self._dir_dirty = True
                    self._delete_segments_from(i + 1)
                    break
            i += 1

        self.log_end_offset = self.segments[-1].next_offset
        self.log_start_offset = max(self.log_start_offset, self.segments[0].base_offset)
        if self.log_start_offset > self.log_end_offset:
            # The checkpointed start is past what survived: the log restarts there, empty.
            self.truncate_fully_and_start_at(self.log_start_offset)
            return
        if rebuild_epochs:
            self.leader_epoch_cache.rebuild(
                [(b.partition_leader_epoch, b.base_offset) for b in self.batches(0)]
            )
        else:
            # Entries past the surviving data go, and after an unclean shutdown every entry
            # past the start of the recovered tail: the checkpoint is written when the log is
            # flushed (not at each new epoch), so there it may miss epochs whose batches
            # survived (a kill -9 keeps the page cache) or hold entries a truncation dropped
            # before later batches landed. The recovered batches' epochs replace them; in the
            # flushed part, only epochs newer than the checkpoint's (Kafka's LogSegment.recover).
            cut = self.log_end_offset if unflushed_from is None else unflushed_from
            self.leader_epoch_cache.truncate_from_end(min(cut, self.log_end_offset))
            for epoch, start in recovered_epochs:
                latest = self.leader_epoch_cache.latest_epoch
                if start >= cut or latest is None or epoch > latest:
                    self.leader_epoch_cache.assign(epoch, start)
        # In memory: the file is written at the next flush that needs it (every empty log a
        # leader once had holds an entry at its end, the epoch assigned at becoming leader, and
        # an fsync'd rewrite per log was most of a 10,000-partition broker's start; Kafka's
        # LogLoader truncates with truncateFromEndAsyncFlush). Until then the file may list
        # entries past the log end, which the next load drops the same way.
        self.leader_epoch_cache.truncate_from_end(self.log_end_offset)
        self.leader_epoch_cache.truncate_from_start(self.log_start_offset)
        self.recovery_point = (
            self.log_end_offset
            if had_clean_shutdown
            else max(self.log_start_offset, min(self.recovery_point, self.log_end_offset))
        )
        self.high_watermark = self.log_start_offset
        # Kafka's LogLoader: snapshots starting no segment go (except the newest one past the
        # last segment's base: a clean shutdown's, at the log end), then the state is loaded.
        self.producer_state_manager.remove_stray_snapshots(self._bases)
        self._rebuild_producer_state(self.log_end_offset, had_clean_shutdown, now_ms)
        self._rebuild_transactions(recovered)
        if self._dir_dirty:
            # (a removal the next load must not see undone, e.g. segments past a torn one)
            self.file_io.fsync_dir(self.dir)
            self._dir_dirty = False
        else:
            # Kafka's LocalLog.flush fsyncs the dir when a segment it flushes starts at or past
            # the recovery point: after an unclean stop such a segment's name may never have
            # been made durable (created, then a kill -9), so the first flush syncs the dir.
            self._dir_dirty = new_segment_pending or (
                not had_clean_shutdown and self._bases[-1] >= self.recovery_point)

    def _rebuild_producer_state(
        self, last_offset: int, reload_from_clean_shutdown: bool, now_ms: int | None
    ) -> None:
        """Kafka's UnifiedLog.rebuildProducerState: the state at `last_offset` from the latest
        snapshot not past it plus the batches after it; snapshots are written at the bases of
        the last two segments when replaying across them, and at `last_offset`. A clean
        shutdown always leaves a snapshot, so a clean log without one predates snapshots
        (Kafka's upgrade case): empty snapshots are written instead of scanning."""
        psm = self.producer_state_manager
        to_snapshot = [s.base_offset for s in self.segments[-2:]] + [last_offset]
        if reload_from_clean_shutdown and psm.latest_snapshot_offset() is None:
            for offset in to_snapshot:
                psm.update_map_end_offset(offset)
                psm.take_snapshot()
            return
        # A log that never had producers stays without: no replay after a truncation.
        empty_before = psm.is_empty() and psm.map_end_offset >= last_offset
        psm.truncate_and_reload(self.log_start_offset, last_offset, now_ms)
        if last_offset > psm.map_end_offset and not empty_before:
            i = max(0, bisect.bisect_right(self._bases, psm.map_end_offset) - 1)
            for segment in self.segments[i:]:
                if segment.base_offset >= last_offset:
                    break
                start = max(psm.map_end_offset, segment.base_offset, self.log_start_offset)
                psm.update_map_end_offset(start)
                if segment.base_offset in to_snapshot:
                    psm.take_snapshot()
                found = segment.translate_offset(start)
                if found is not None:
                    self._load_producers(segment.iter_batches(found[0]), last_offset)
        psm.update_map_end_offset(last_offset)
        psm.take_snapshot()

    def _load_producers(self, batches: Iterator[RecordBatch], end_offset: int) -> None:
        """Replay batches of the log below `end_offset` into the producer state (Kafka's
        loadProducersFromRecords: as replicated batches, unvalidated)."""
        psm = self.producer_state_manager
        found: list[tuple[int, int, int, int, int, int, int]] = []
        txns: dict[int, TxnBatch] = {}
        for b in batches:
            if b.base_offset >= end_offset:
                break
            psm.batches_loaded += 1
            (base, _, _, _, _, attributes, delta, _, max_ts, pid, epoch, base_seq,
             _) = b.header()
            if pid < 0:
                continue
            found.append((base, pid, epoch, base_seq, delta, max_ts, attributes))
            if attributes & TXN_OR_CONTROL and (txn := txn_batch_of(b)) is not None:
                txns[base] = txn
        loaded, _ = self._analyze_producer_batches(found, txns, AppendOrigin.REPLICATION)
        for producer in loaded:
            psm.update(producer)

    def remove_expired_producers(self, now_ms: int) -> int:
        """producer.id.expiration.ms (Kafka's PeriodicProducerExpirationCheck)."""
        return self.producer_state_manager.remove_expired_producers(now_ms)

    def _analyze_producer_batches(
        self,
        batches: list[tuple[int, int, int, int, int, int, int]],
        txns: dict[int, TxnBatch],
        origin: AppendOrigin,
    ) -> tuple[list[ProducerAppendInfo], BatchMetadata | None]:
        """Kafka's analyzeAndValidateProducerState over (first offset, producer id, epoch, base
        sequence, last offset delta, max timestamp, attributes) of the batches with a producer
        id: their ProducerAppendInfos, or the original of a client's retried batch (checked
        first, as Kafka: a duplicate is answered, not validated). Raises for an out-of-order
        sequence or a fenced epoch; nothing is recorded before the batches are written."""
        psm = self.producer_state_manager
        updated: dict[int, ProducerAppendInfo] = {}
        for first, pid, epoch, base_seq, delta, max_ts, attributes in batches:
            info = updated.get(pid)
            if attributes & CONTROL_FLAG_MASK:
                txn = txns.get(first)
                if txn is not None and txn.marker is not None:
                    if info is None:
                        info = updated[pid] = psm.prepare_update(pid, origin)
                    info.append_end_txn_marker(epoch, txn.marker[1], max_ts)
                continue
            last_seq = last_sequence(base_seq, delta)
            if origin is AppendOrigin.CLIENT:
                if base_seq < 0:  # Kafka's LogValidator, for client batches
                    raise InvalidRecordError(
                        f"invalid sequence number {base_seq} in record batch with producerId "
                        f"{pid} in topic partition {psm.topic_partition}")
                entry = psm.producers.get(pid)
                if entry is not None:
                    duplicate = entry.find_duplicate_batch(epoch, base_seq, last_seq)
                    if duplicate is not None:
                        return [], duplicate
            if info is None:
                info = updated[pid] = psm.prepare_update(pid, origin)
            info.append_data_batch(epoch, base_seq, last_seq, max_ts, first, first + delta,
                                   bool(attributes & TRANSACTIONAL_FLAG_MASK))
        return list(updated.values()), None

    def _seed_transactions(self) -> None:
        """The open transactions are those of the producer state (Kafka's loadFromSnapshot)."""
        self.transactions.seed({
            pid: e.current_txn_first_offset
            for pid, e in self.producer_state_manager.producers.items()
            if e.current_txn_first_offset is not None
        })

    def _rebuild_transactions(self, reindex: set[int]) -> None:
        """The transaction state from the producer state, and the `.txnindex` of each segment
        in `reindex` (recovered ones) rebuilt by replaying the log from the producer snapshot at
        or before the first of them (Kafka's LogLoader.recoverSegment)."""
        self._seed_transactions()
        if not reindex:
            return
        first = min(reindex)
        start, ongoing = self._ongoing_at_snapshot(first)
        replay = TransactionTracker()
        replay.seed(ongoing)
        i = max(0, bisect.bisect_right(self._bases, start) - 1)
        for segment in self.segments[i:]:
            rebuild = segment.base_offset in reindex
            if rebuild:
                segment.txn_index.reset()
            for batch in segment.iter_batches(0):
                if (batch.base_offset < start or batch.producer_id < 0
                        or not batch.attributes & TXN_OR_CONTROL):
                    continue
                info = txn_batch_of(batch)
                if info is None:
                    continue
                for done, lso in replay.append((info,), self.high_watermark):
                    if rebuild and done.is_aborted:
                        segment.update_txn_index(
                            AbortedTxn(done.producer_id, done.first_offset, done.last_offset, lso)
                        )

    def _ongoing_at_snapshot(self, offset: int) -> tuple[int, dict[int, int]]:
        """(snapshot offset, open transactions there) of the latest readable producer snapshot
        at or before `offset`; (the first segment's base, none) when there is none."""
        for at in reversed(self.producer_state_manager.snapshot_offsets):
            if at > offset:
                continue
            path = os.path.join(self.dir, snapshot_file_name(at))
            try:
                handle = self.file_io.open(path)
                try:
                    entries = read_snapshot(handle.read(0, handle.size()))
                finally:
                    handle.close()
            except (OSError, CorruptSnapshotError):
                continue
            return at, {e.producer_id: e.current_txn_first_offset for e in entries
                        if e.current_txn_first_offset is not None}
        return self.segments[0].base_offset, {}

    def _complete_swaps(self) -> None:
        """Finish the log cleaner's interrupted segment replacements (Kafka's
        completeSwapOperations): a `<base>.log.swap` file was fsynced before it got that name, so
        it is whole; the old segments it replaces (bases from its base offset up to its last
        offset) go, and it takes the `.log` name. `.cleaned` files (never swapped) are dropped
        with the other scratch files afterwards."""
        fio = self.file_io
        names = fio.listdir(self.dir)
        bases = sorted(b for n in names if (b := parse_base_offset(n, LOG_SUFFIX)) is not None)
        for name in names:
            if not name.endswith(LOG_SUFFIX + _SWAP_SUFFIX):
                continue
            base = parse_base_offset(name[: -len(_SWAP_SUFFIX)], LOG_SUFFIX)
            if base is None:
                continue
            path = os.path.join(self.dir, name)
            end = _next_offset_of_file(fio, path, base)
            for old in bases:
                if base <= old < max(end, base + 1):
                    for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX):
                        old_path = os.path.join(self.dir, file_name(old, suffix))
                        if fio.exists(old_path):
                            fio.remove(old_path)
            fio.fsync_dir(self.dir)
            fio.rename(path, path[: -len(_SWAP_SUFFIX)])
            logger.warning("%s: completed the interrupted swap of cleaned segment %d", self.dir, base)
        fio.fsync_dir(self.dir)

    def _delete_segments_from(self, index: int) -> None:
        for segment in self.segments[index:]:
            segment.delete()
        if index < len(self.segments):
            self._dir_dirty = True
        del self.segments[index:]
        self._bases = [s.base_offset for s in self.segments]

    # -- offsets ---------------------------------------------------------------------------
    @property
    def active_segment(self) -> LogSegment:
        return self.segments[-1]

    @property
    def latest_epoch(self) -> int | None:
        return self.leader_epoch_cache.latest_epoch

    @property
    def size(self) -> int:
        return sum(s.size for s in self.segments)

    @property
    def unflushed_messages(self) -> int:
        return self.log_end_offset - self.recovery_point

    def update_config(self, config: LogConfig) -> None:
        """Use `config` from now on (a topic config change). Index sizes and intervals apply to
        segments created after the change, as in Kafka."""
        self.config = config

    def update_high_watermark(self, hw: int) -> int:
        """Set the HW, clamped to [log_start_offset, log_end_offset]; in memory only."""
        self.high_watermark = min(max(hw, self.log_start_offset), self.log_end_offset)
        self.transactions.on_high_watermark_updated(self.high_watermark)
        return self.high_watermark

    @property
    def last_stable_offset(self) -> int:
        """The LSO (KIP-98): the first offset of the earliest transaction not yet decided and
        replicated, at least the log start, at most the HW (Kafka's UnifiedLog.lastStableOffset)."""
        first = self.transactions.first_unstable_offset
        if first is None:
            return self.high_watermark
        return min(max(first, self.log_start_offset), self.high_watermark)

    def collect_aborted_transactions(self, start_offset: int, upper_bound_offset: int) -> list[AbortedTxn]:
        """The aborted transactions overlapping [start_offset, upper_bound_offset), from the
        `.txnindex` of the segment holding `start_offset` onwards until one is complete (Kafka's
        LocalLog.collectAbortedTransactions)."""
        found: list[AbortedTxn] = []
        i = max(0, bisect.bisect_right(self._bases, start_offset) - 1)
        for segment in self.segments[i:]:
            result = segment.txn_index.collect_aborted_txns(start_offset, upper_bound_offset)
            found.extend(result.aborted_transactions)
            if result.is_complete:
                break
        return found

    def aborted_transactions_for_read(self, info: FetchDataInfo) -> list[AbortedTxn]:
        """The aborted transactions a READ_COMMITTED reader of `info` needs: those overlapping
        the batches read, i.e. [info.first_offset, the offset after the last batch) (Kafka's
        addAbortedTransactions)."""
        records = info.records
        if not len(records):
            return []
        if isinstance(records, FileSlice):
            upper = records.next_offset
        else:
            upper = self.log_end_offset
            position, n = 0, len(records)
            while position + PREFIX_SIZE <= n:
                base, length, _, _, _, _, delta = PREFIX.unpack_from(records, position)
                if position + length + LOG_OVERHEAD > n:
                    break
                upper = base + delta + 1
                position += length + LOG_OVERHEAD
        return self.collect_aborted_transactions(info.first_offset, upper)

    def _index_completed(self, batches: list[TxnBatch]) -> None:
        """Apply appended transactional batches; an ABORT marker's transaction gets its entry
        in the active segment's `.txnindex` (the marker's segment)."""
        for done, lso in self.transactions.append(batches, self.high_watermark):
            if done.is_aborted:
                segment = self.segments[-1]
                if not len(segment.txn_index):
                    self._dir_dirty = True  # the file may be new: its name needs a dir fsync
                segment.update_txn_index(
                    AbortedTxn(done.producer_id, done.first_offset, done.last_offset, lso)
                )

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """(largest epoch <= `epoch`, its end offset) per KIP-279; (-1, -1) when undefined."""
        return self.leader_epoch_cache.end_offset_for(epoch)

    def assign_epoch_start_offset(self, epoch: int, start_offset: int) -> None:
        """A new leader records its epoch at its LEO at once, before any append (KIP-279). In
        memory: the file follows at the flush that moves the recovery point past it. A log
        that failed an I/O refuses (KafkaStorageError), as its other writes do."""
        self._check_writable()
        self.leader_epoch_cache.assign(epoch, start_offset)

    # -- appends ---------------------------------------------------------------------------
    def append_as_leader(
        self,
        records: bytes | bytearray | memoryview,
        leader_epoch: int,
        now_ms: int,
        origin: AppendOrigin = AppendOrigin.CLIENT,
        verification_guard: VerificationGuard | None = None,
    ) -> LogAppendInfo:
        """Validate every batch (magic 2, CRC32C, size <= max.message.bytes, record count, and
        the transactional rules for `origin`: see storage/transactions.py), assign offsets from
        the LEO and stamp `leader_epoch`, then write. Nothing is written unless every batch is
        valid. `verification_guard` (KIP-890, transaction.partition.verification.enable): not
        None, a transactional batch of a producer with no transaction open here must present
        the guard its verification got (`maybe_start_transaction_verification`), else
        INVALID_TXN_STATE; None, no verification is required."""
        if self.closed or self.failed:
            self._check_writable()
        if needs_validation(self.config):  # compression.type, message.timestamp.difference.max.ms
            records = validate_and_convert(records, self.config, now_ms)
        src = records if type(records) is memoryview else memoryview(records)
        if src.itemsize != 1 or src.ndim != 1:
            src = src.cast("B")
        n = len(src)
        # Large appends are written with writev: only the 61-byte headers are copied (to stamp
        # them), the record bytes go from the caller's buffer. Small ones are copied once into a
        # reused per-thread buffer (a fresh bytearray costs page faults) and written at once.
        vectored = n >= _VECTORED_MIN
        headers = bytearray()
        if vectored:
            view = src
        else:
            view = _scratch_view(n)
            view[:] = src
        max_size = self.config.max_message_bytes
        log_append_time = now_ms if self.config.message_timestamp_type == "LogAppendTime" else -1
        next_offset = first_offset = self.log_end_offset
        batches: list[tuple[int, int, int]] = []
        max_ts = -1
        max_ts_offset = -1
        record_count = 0
        pos = 0
        unpack = HEADER_STRUCT.unpack_from
        stamp = _STAMP.pack_into
        crc = crc32c.crc32c
        ongoing = self.transactions.ongoing
        # TxnBatch of each transactional batch (or of a producer with a transaction open);
        # control batches as (position, end, base offset), their marker read after the loop
        txn_items: list[TxnBatch | tuple[int, int, int]] = []
        producer_batches: list[tuple[int, int, int, int, int, int, int]] = []
        while pos < n:
            if n - pos < HEADER_SIZE:
                raise CorruptRecordError(
                    f"truncated record batch: {n - pos} bytes left at position {pos}", pos
                )
            (_, length, _, magic, stored_crc, attributes, delta, _, batch_ts, producer_id,
             producer_epoch, base_sequence, count) = unpack(view, pos)
            size = length + LOG_OVERHEAD
            if magic != CURRENT_MAGIC:
                raise CorruptRecordError(f"unsupported magic {magic} (only v2 is supported)", pos)
            if size < HEADER_SIZE:
                raise CorruptRecordError(f"record batch size {size} is smaller than a header", pos)
            if size > max_size:
                raise RecordTooLargeError(size, max_size)
            end = pos + size
            if end > n:
                raise CorruptRecordError(
                    f"truncated record batch: {size} bytes declared, {n - pos} present", pos
                )
            if crc(view[pos + ATTRIBUTES_OFFSET : end]) != stored_crc:
                raise CorruptRecordError(f"record batch at position {pos} fails its CRC32C", pos)
            if count <= 0 or delta != count - 1:
                raise CorruptRecordError(
                    f"record batch at position {pos} has {count} records but last offset delta "
                    f"{delta}",
                    pos,
                )
            if vectored:
                at = len(headers)
                headers += view[pos : pos + HEADER_SIZE]
                target: bytearray | memoryview = headers
            else:
                at = pos
                target = view
            if log_append_time >= 0:
                # LogAppendTime topics: the broker's clock replaces the max timestamp (inside the
                # CRC, so the CRC is recomputed for these batches only).
                _I16.pack_into(target, at + ATTRIBUTES_OFFSET, attributes | TIMESTAMP_TYPE_MASK)
                _I64.pack_into(target, at + _MAX_TIMESTAMP_OFFSET, log_append_time)
                head_crc = crc(bytes(target[at + ATTRIBUTES_OFFSET : at + HEADER_SIZE]))
                _U32.pack_into(
                    target, at + CRC_OFFSET, crc(view[pos + HEADER_SIZE : end], head_crc)
                )
                batch_ts = log_append_time
            if producer_id >= 0:
                if attributes & CONTROL_FLAG_MASK:
                    txn_items.append((pos, end, next_offset))
                elif attributes & TRANSACTIONAL_FLAG_MASK or producer_id in ongoing:
                    txn_items.append(TxnBatch(
                        producer_id, producer_epoch, next_offset, next_offset + delta,
                        bool(attributes & TRANSACTIONAL_FLAG_MASK)))
                producer_batches.append((next_offset, producer_id, producer_epoch, base_sequence,
                                         delta, batch_ts, attributes))
            # baseOffset, batchLength (unchanged), partitionLeaderEpoch: one pack
            stamp(target, at, next_offset, length, leader_epoch)
            last = next_offset + delta
            if batch_ts > max_ts:
                max_ts, max_ts_offset = batch_ts, last
            batches.append((pos, last, batch_ts))
            record_count += count
            next_offset = last + 1
            pos = end
        if not batches:
            return LogAppendInfo(first_offset, first_offset - 1, -1, 0, 0)
        txn_batches: list[TxnBatch] = []
        for item in txn_items:
            if isinstance(item, TxnBatch):
                txn_batches.append(item)
            elif (info := txn_batch_of(RecordBatch(src[item[0]:item[1]]), item[2])) is not None:
                txn_batches.append(info)
        appended_producers: list[ProducerAppendInfo] = []
        if producer_batches:
            appended_producers, duplicate = self._analyze_producer_batches(
                producer_batches, {t.base_offset: t for t in txn_batches}, origin)
            if duplicate is not None:
                return LogAppendInfo(
                    duplicate.first_offset, duplicate.last_offset, duplicate.timestamp, n,
                    record_count, duplicate.last_offset, len(batches), duplicate.timestamp,
                    duplicate=True,
                )
        if txn_batches:
            self.transactions.validate(txn_batches, origin,
                                       self.producer_state_manager.producers.get)
            if verification_guard is not None:
                self._check_verified(txn_batches, verification_guard)
        data: memoryview | list[memoryview] = view
        if vectored:
            stamped = memoryview(headers)
            parts: list[memoryview] = []
            for i, (start, _, _) in enumerate(batches):
                stop = batches[i + 1][0] if i + 1 < len(batches) else n
                parts.append(stamped[i * HEADER_SIZE : (i + 1) * HEADER_SIZE])
                parts.append(view[start + HEADER_SIZE : stop])
            data = parts
        try:  # (not the _io context manager: this is the hot path)
            if leader_epoch >= 0 and leader_epoch != self.leader_epoch_cache.latest_epoch:
                self.leader_epoch_cache.assign(leader_epoch, first_offset)
            self._write(data, n, batches, first_offset, next_offset - 1, max_ts, now_ms)
            if txn_batches:
                self._index_completed(txn_batches)
        except (OSError, KafkaStorageError) as exc:
            raise self._fail("append", exc) from exc
        for producer in appended_producers:
            self.producer_state_manager.update(producer)
        return LogAppendInfo(
            first_offset, next_offset - 1, max_ts, n, record_count, max_ts_offset, len(batches),
            log_append_time,
        )

    def maybe_start_transaction_verification(self, producer_id: int, now_ms: int
                                             ) -> VerificationGuard:
        """Kafka's UnifiedLog.maybeStartTransactionVerification: SENTINEL when the producer's
        transaction is already open here (nothing to verify), else its guard."""
        if producer_id in self.transactions.ongoing:
            return VerificationGuard.SENTINEL
        return self.producer_state_manager.maybe_create_verification_guard(producer_id, now_ms)

    def _check_verified(self, txn_batches: list[TxnBatch], guard: VerificationGuard) -> None:
        ongoing = self.transactions.ongoing
        psm = self.producer_state_manager
        for t in txn_batches:
            if (t.is_transactional and t.marker is None and t.producer_id not in ongoing
                    and not psm.verification_guard(t.producer_id).verify(guard)):
                raise InvalidTxnStateError(
                    f"record of producer {t.producer_id} was not part of an ongoing transaction")

    def append_as_follower(
        self, records: bytes | bytearray | memoryview, now_ms: int
    ) -> LogAppendInfo:
        """Append batches that already carry the leader's offsets and epochs. The first offset
        must be >= the LEO and offsets must increase (else InvalidOffsetError); each batch's CRC
        is checked. A partial trailing batch (fetch responses may cut one) is ignored.
        max.message.bytes is not applied: the leader accepted these batches."""
        self._check_writable()
        view = memoryview(records)
        if view.ndim != 1 or view.itemsize != 1:
            view = view.cast("B")
        n = len(view)
        expected = self.log_end_offset
        batches: list[tuple[int, int, int]] = []
        epochs: list[tuple[int, int]] = []
        last_epoch = -2
        max_ts = -1
        max_ts_offset = -1
        record_count = 0
        first_offset = -1
        pos = 0
        unpack = PREFIX.unpack_from
        crc = crc32c.crc32c
        txn_positions: list[tuple[int, int]] = []
        producer_batches: list[tuple[int, int, int, int, int, int, int]] = []
        while n - pos >= PREFIX_SIZE:
            base, length, epoch, magic, stored_crc, attributes, delta = unpack(view, pos)
            size = length + LOG_OVERHEAD
            if magic != CURRENT_MAGIC:
                raise CorruptRecordError(f"unsupported magic {magic} (only v2 is supported)", pos)
            if size < HEADER_SIZE:
                raise CorruptRecordError(f"record batch size {size} is smaller than a header", pos)
            if pos + size > n:
                break  # partial trailing batch
            end = pos + size
            if crc(view[pos + ATTRIBUTES_OFFSET : end]) != stored_crc:
                raise CorruptRecordError(f"record batch at offset {base} fails its CRC32C", pos)
            if delta < 0:
                raise CorruptRecordError(f"record batch at offset {base} has a negative delta", pos)
            if base < expected:
                if not batches:
                    raise InvalidOffsetError(
                        f"follower append at offset {base} is below the log end offset "
                        f"{self.log_end_offset}",
                        base,
                        self.log_end_offset,
                    )
                raise InvalidOffsetError(
                    f"out of order offsets in follower append: {base} after {expected - 1}",
                    base,
                    self.log_end_offset,
                )
            if first_offset < 0:
                first_offset = base
            last = base + delta
            batch_ts = _I64.unpack_from(view, pos + _MAX_TIMESTAMP_OFFSET)[0]
            if batch_ts > max_ts:
                max_ts, max_ts_offset = batch_ts, last
            if epoch != last_epoch:
                if epoch >= 0:
                    epochs.append((epoch, base))
                last_epoch = epoch
            batches.append((pos, last, batch_ts))
            if attributes & TXN_OR_CONTROL:
                txn_positions.append((pos, end))
            producer_id, producer_epoch, base_sequence = _PRODUCER.unpack_from(
                view, pos + PRODUCER_ID_OFFSET)
            if producer_id >= 0:
                producer_batches.append((base, producer_id, producer_epoch, base_sequence,
                                         delta, batch_ts, attributes))
            record_count += _I32.unpack_from(view, pos + _RECORD_COUNT_OFFSET)[0]
            expected = last + 1
            pos = end
        if not batches:
            leo = self.log_end_offset
            return LogAppendInfo(leo, leo - 1, -1, 0, 0)
        txn_batches = [
            info for start, end in txn_positions
            if (info := txn_batch_of(RecordBatch(view[start:end]))) is not None
        ]
        replicated: list[ProducerAppendInfo] = []
        if producer_batches:
            replicated, _ = self._analyze_producer_batches(
                producer_batches, {t.base_offset: t for t in txn_batches},
                AppendOrigin.REPLICATION)
        with self._io("append"):
            for epoch, start in epochs:
                self.leader_epoch_cache.assign(epoch, start)
            self._write(view[:pos], pos, batches, first_offset, expected - 1, max_ts, now_ms)
            if txn_batches:
                self._index_completed(txn_batches)
        for producer in replicated:
            self.producer_state_manager.update(producer)
        return LogAppendInfo(
            first_offset, expected - 1, max_ts, pos, record_count, max_ts_offset, len(batches)
        )

    def _write(
        self,
        data: memoryview | list[memoryview],
        size: int,
        batches: list[tuple[int, int, int]],
        first_offset: int,
        last_offset: int,
        max_timestamp: int,
        now_ms: int,
    ) -> None:
        segment = self.segments[-1]
        config = self.config
        used = segment.size
        rolling = segment.rolling_based_timestamp
        if (
            used == 0
            or used > config.segment_bytes - size
            or (
                (max_timestamp - rolling if rolling is not None and rolling >= 0
                 else now_ms - segment.created_ms)
                > config.segment_ms - segment.roll_jitter_ms
            )
            or segment.offset_index.is_full
            or segment.time_index.is_full
            or not segment.can_hold(last_offset)
        ):
            segment = self._maybe_roll(size, first_offset, last_offset, max_timestamp, now_ms)
        segment.append(data, batches, size)
        self.log_end_offset = last_offset + 1
        # Always, producers or not: a snapshot taken now reflects the log up to here.
        self.producer_state_manager.last_map_offset = self.log_end_offset
        if self.unflushed_messages >= self.config.flush_messages:
            self.flush()

    def _maybe_roll(
        self, size: int, first_offset: int, last_offset: int, max_timestamp: int, now_ms: int
    ) -> LogSegment:
        segment = self.segments[-1]
        config = self.config
        if segment.size == 0:
            if segment.can_hold(last_offset) and segment.base_offset <= first_offset:
                return segment
        elif not (
            segment.size > config.segment_bytes - size
            or segment.time_waited_for_roll(now_ms, max_timestamp)
            > config.segment_ms - segment.roll_jitter_ms
            or segment.offset_index.is_full
            or segment.time_index.is_full
            or not segment.can_hold(last_offset)
        ):
            return segment
        return self.roll(now_ms, max(first_offset, self.log_end_offset))

    def roll(self, now_ms: int, base_offset: int | None = None) -> LogSegment:
        """Start a new active segment at `base_offset` (default: the LEO). The old segment gets
        its final time index entry and is flushed, so the recovery point moves up to it."""
        self._check_writable()
        new_base = self.log_end_offset if base_offset is None else base_offset
        old = self.segments[-1]
        if old.size == 0 and old.base_offset == new_base:
            return old  # already an empty segment starting there
        if new_base < old.next_offset:
            raise ValueError(f"cannot roll at {new_base}: the active segment ends at {old.next_offset}")
        with self._io("roll"):
            # An empty old segment stays (Kafka keeps it too): it keeps the log start in place.
            old.on_become_inactive()
            segment = self._new_segment(new_base, now_ms)
            if segment.size:
                # A stale file with this name (cannot normally exist): start it empty.
                segment.log.truncate(0)
                segment.size = 0
            self.segments.append(segment)
            self._bases.append(new_base)
            # A producer snapshot at the new segment's base (recovery and truncation replay
            # from the latest one); the flush below makes its name durable with the segment.
            self.producer_state_manager.update_map_end_offset(new_base)
            self.producer_state_manager.take_snapshot()
            if old.size:
                self.flush(self.log_end_offset)
            if self.log_end_offset < new_base:
                self.log_end_offset = new_base
            self.last_flush_ms = now_ms
        return segment

    # -- reads -----------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self.closed or self.failed:
            self._check_writable()

    def _check_range(self, offset: int) -> None:
        if offset < self.log_start_offset or offset > self.log_end_offset:
            raise OffsetOutOfRangeError(offset, self.log_start_offset, self.log_end_offset)

    def read(
        self,
        start_offset: int,
        max_bytes: int,
        max_offset: int | None = None,
        min_one_message: bool = True,
    ) -> FetchDataInfo:
        """Whole batches from the one holding `start_offset`, up to `max_bytes` (the first batch
        even when larger, if `min_one_message`), none whose last offset >= `max_offset`.
        Empty at the LEO; OffsetOutOfRangeError outside [log_start_offset, log_end_offset]."""
        self._check_open()
        self._check_range(start_offset)
        if start_offset == self.log_end_offset or (
            max_offset is not None and start_offset >= max_offset
        ):
            return FetchDataInfo(memoryview(b""), start_offset)
        try:
            i = max(0, bisect.bisect_right(self._bases, start_offset) - 1)
            while i < len(self.segments):
                found = self.segments[i].read(start_offset, max_bytes, max_offset, min_one_message)
                if found is not None:
                    return FetchDataInfo(found[0], start_offset)
                i += 1
        except OSError as exc:
            raise self._fail("read", exc) from exc
        return FetchDataInfo(memoryview(b""), start_offset)

    def read_slice(
        self,
        start_offset: int,
        max_bytes: int,
        max_offset: int | None = None,
        min_one_message: bool = True,
        *,
        min_slice_bytes: int,
    ) -> FetchDataInfo:
        """What `read` returns with the same arguments (the same whole batches), as a FileSlice
        for sendfile when at least `min_slice_bytes` long; else as bytes (a copy is cheaper
        than a sendfile for a small range, and the simulator's files have no descriptor)."""
        self._check_open()
        self._check_range(start_offset)
        if start_offset == self.log_end_offset or (
            max_offset is not None and start_offset >= max_offset
        ):
            return FetchDataInfo(memoryview(b""), start_offset)
        with self._io("read"):
            i = max(0, bisect.bisect_right(self._bases, start_offset) - 1)
            while i < len(self.segments):
                found = self.segments[i].read_slice(
                    start_offset, max_bytes, max_offset, min_one_message, min_slice_bytes)
                if found is not None:
                    return FetchDataInfo(found, start_offset)
                i += 1
        return FetchDataInfo(memoryview(b""), start_offset)

    def batches(self, start_offset: int = 0) -> Iterator[RecordBatch]:
        """Every batch whose last offset >= `start_offset`, in order (tools, tests, checks,
        ListOffsets). An I/O error is KafkaStorageError, its dir reported."""
        i = max(0, bisect.bisect_right(self._bases, start_offset) - 1)
        try:
            for segment in list(self.segments[i:]):
                found = segment.translate_offset(start_offset)
                if found is None:
                    continue
                yield from segment.iter_batches(found[0])
        except OSError as exc:
            raise self._fail("read", exc) from exc

    def offset_for_timestamp(self, timestamp: int) -> tuple[int, int] | None:
        """ListOffsets by time (Kafka's findOffsetByTimestamp): (offset, timestamp) of the first
        record at or after the log start whose timestamp >= `timestamp`, or None when every
        record is older. The time index finds the batch; only that batch is decoded."""
        from tidelog.protocol.records.decoder import decode_records

        start = self.log_start_offset
        for segment in self.segments:
            if segment.max_timestamp < timestamp:
                continue
            try:
                _, offset = segment.time_index.lookup(timestamp - 1)
            except OSError as exc:
                raise self._fail("time index lookup", exc) from exc
            for batch in self.batches(max(offset, start, segment.base_offset)):
                if batch.max_timestamp < timestamp:
                    continue
                if batch.timestamp_type == 1:  # LogAppendTime: every record has max_timestamp
                    return max(batch.base_offset, start), batch.max_timestamp
                try:
                    for record in decode_records(batch, verify_crc=False):
                        if record.offset >= start and record.timestamp >= timestamp:
                            return record.offset, record.timestamp
                except CorruptRecordError:
                    return max(batch.base_offset, start), batch.max_timestamp
            return None
        return None

    # -- truncation ------------------------------------------------------------------------
    def truncate_to(self, target_offset: int) -> bool:
        """Drop every batch holding an offset >= `target_offset` (a batch straddling it goes
        whole). The epoch cache is truncated from the end; HW and recovery point are capped by
        the new LEO. Returns False when there was nothing to drop."""
        self._check_writable()
        if target_offset < 0:
            raise ValueError(f"cannot truncate to a negative offset {target_offset}")
        if target_offset >= self.log_end_offset:
            # The epoch cache all the same, as Kafka's UnifiedLog.truncateTo: a leader that
            # assigned an epoch at its LEO and appended nothing before losing the leadership
            # keeps a conflicting last entry, and its fetcher would ask the new leader about
            # that epoch forever (sim seed 93: follower stuck at LEO 119 behind 313).
            with self._io("truncation"):
                self.leader_epoch_cache.truncate_from_end(self.log_end_offset)
            return False
        with self._io("truncation"):
            if target_offset < self.segments[0].base_offset or target_offset < self.log_start_offset:
                self.truncate_fully_and_start_at(target_offset)
                return True
            keep = bisect.bisect_right(self._bases, target_offset)
            # The new LEO: the target, or the base of the first batch dropped when it starts
            # before the target (a batch holding the target goes whole).
            new_end = target_offset
            for segment in self.segments[max(keep, 1) - 1 :]:
                found = segment.translate_offset(target_offset)
                if found is not None:
                    new_end = min(target_offset, found[1])
                    break
            if new_end < self.log_start_offset:
                # The batch holding the log start goes: nothing visible is left, so the log
                # restarts at the target (never with its end below its start).
                self.truncate_fully_and_start_at(target_offset)
                return True
            if keep < len(self.segments):
                self._delete_segments_from(max(keep, 1))
                # The later segments must be gone for good before the cut below is durable:
                # else a crash could bring them back behind a shorter segment, a log with a
                # hole whose far side is data this truncation removed.
                self.file_io.fsync_dir(self.dir)
                self._dir_dirty = False
            segment = self.segments[-1]
            segment.truncate_to(target_offset)
            segment.next_offset = max(segment.base_offset, new_end)
            # Durable at once: an undone truncation under newer appends would resurrect
            # batches below the recovery point.
            segment.flush()
            self.log_end_offset = segment.next_offset
            self.leader_epoch_cache.truncate_from_end(self.log_end_offset)
            self.high_watermark = min(self.high_watermark, self.log_end_offset)
            self.recovery_point = min(self.recovery_point, self.log_end_offset)
            # Snapshots past the new end go; the state reloads from the latest one left.
            self._rebuild_producer_state(self.log_end_offset, False, None)
            if not self.transactions.truncate(self.log_end_offset):
                self._seed_transactions()
            if self._dir_dirty:
                self.file_io.fsync_dir(self.dir)
                self._dir_dirty = False
        for listener in self.truncation_listeners:
            listener(self.log_end_offset)
        return True

    def truncate_fully_and_start_at(self, offset: int, now_ms: int | None = None) -> None:
        """Delete every segment and restart the log, empty, at `offset` (a follower whose
        leader's log starts past its LEO)."""
        self._check_writable()
        if offset < 0:
            raise ValueError(f"cannot start a log at a negative offset {offset}")
        with self._io("truncation"):
            created = self.segments[-1].created_ms if now_ms is None else now_ms
            self._delete_segments_from(0)
            self.segments = [self._new_segment(offset, created)]
            self._bases = [offset]
            seg = self.segments[0]
            if seg.size:
                seg.log.truncate(0)
                seg.size = 0
            self.log_start_offset = offset
            self.log_end_offset = offset
            self.recovery_point = offset
            self.high_watermark = offset
            self.transactions.clear()
            self.producer_state_manager.truncate_fully_and_start_at(offset)
            self.leader_epoch_cache.clear_and_flush()
            self.file_io.fsync_dir(self.dir)
            self._dir_dirty = False
        for listener in self.truncation_listeners:
            listener(offset)

    # -- retention -------------------------------------------------------------------------
    def maybe_increment_log_start_offset(self, new_log_start_offset: int) -> bool:
        """DeleteRecords: move the log start offset up (never past the HW). Segments wholly
        below it go at the next `delete_old_segments`."""
        if new_log_start_offset > self.high_watermark:
            raise OffsetOutOfRangeError(
                new_log_start_offset, self.log_start_offset, self.high_watermark
            )
        if new_log_start_offset <= self.log_start_offset:
            return False
        with self._io("log start offset update"):
            self.log_start_offset = new_log_start_offset
            self.producer_state_manager.on_log_start_offset_incremented(new_log_start_offset)
            self.leader_epoch_cache.truncate_from_start(new_log_start_offset)
            self.recovery_point = max(self.recovery_point, new_log_start_offset)
        return True

    def delete_old_segments(self, now_ms: int) -> int:
        """Kafka's retention: delete the oldest segments that breach retention.ms or
        retention.bytes (cleanup.policy with delete) or lie wholly below the log start offset;
        only segments wholly below the HW, and never the last (the active segment is rolled
        first when it must go).
        Returns the number of segments deleted."""
        self._check_writable()
        config = self.config
        deleted = 0
        # retention.ms / retention.bytes only for cleanup.policy with delete (a compact-only
        # topic keeps its segments; the log start offset still moves them out).
        retained = "delete" in config.cleanup_policy.split(",")
        with self._io("retention"):
            if retained and config.retention_ms >= 0:
                deleted += self._delete_while(
                    lambda seg, _: now_ms - seg.largest_timestamp() > config.retention_ms, now_ms
                )
            if retained and config.retention_bytes >= 0:
                excess = [self.size - config.retention_bytes]

                def over_size(seg: LogSegment, _: LogSegment | None) -> bool:
                    if excess[0] - seg.size >= 0:
                        excess[0] -= seg.size
                        return True
                    return False

                deleted += self._delete_while(over_size, now_ms)
            deleted += self._delete_while(
                lambda _, nxt: nxt is not None and nxt.base_offset <= self.log_start_offset, now_ms
            )
        return deleted

    def _delete_while(
        self, predicate: Callable[[LogSegment, LogSegment | None], bool], now_ms: int
    ) -> int:
        doomed: list[LogSegment] = []
        for i, segment in enumerate(self.segments):
            nxt = self.segments[i + 1] if i + 1 < len(self.segments) else None
            upper = nxt.base_offset if nxt is not None else self.log_end_offset
            if self.high_watermark < upper:
                break
            if nxt is None and segment.size == 0:
                break
            if not predicate(segment, nxt):
                break
            doomed.append(segment)
        if not doomed:
            return 0
        if len(doomed) == len(self.segments):
            self.roll(now_ms)
        delay = self.config.file_delete_delay_ms
        for segment in doomed:
            if delay == 0:
                segment.delete()
            else:
                segment.mark_deleted()
                self.pending_deletes.append((now_ms + delay, segment))
        del self.segments[: len(doomed)]
        self._bases = [s.base_offset for s in self.segments]
        self.log_start_offset = max(self.log_start_offset, self.segments[0].base_offset)
        self.high_watermark = max(self.high_watermark, self.log_start_offset)
        self.recovery_point = max(self.recovery_point, self.log_start_offset)
        # The deleted segments' snapshots, and any stray one below the new start, go with them.
        self.producer_state_manager.delete_snapshots_before(self.log_start_offset)
        self.producer_state_manager.on_log_start_offset_incremented(self.log_start_offset)
        self.leader_epoch_cache.truncate_from_start(self.log_start_offset)
        self.file_io.fsync_dir(self.dir)
        self._dir_dirty = False
        return len(doomed)

    def delete_expired_files(self, now_ms: int) -> int:
        """Remove the files of segments deleted at least file.delete.delay.ms ago (Kafka's
        delayed "delete-file"); returns how many segments' files went."""
        due = [s for at, s in self.pending_deletes if at <= now_ms]
        if not due:
            return 0
        with self._io("delete files"):
            for segment in due:
                segment.delete()
        self.pending_deletes = [(at, s) for at, s in self.pending_deletes if at > now_ms]
        return len(due)

    # -- durability ------------------------------------------------------------------------
    def flush(self, offset: int | None = None) -> None:
        """Make everything below `offset` (default: the LEO) durable and move the recovery
        point there. Segment files are fsynced whole; new or removed files get a dir fsync."""
        self._check_writable()
        target = self.log_end_offset if offset is None else min(offset, self.log_end_offset)
        with self._io("flush"):
            # Before the recovery point moves: below it the load trusts the checkpoint.
            if self.leader_epoch_cache.flush_if_needed(self.log_end_offset):
                self._dir_dirty = False  # its write fsynced the dir: every name is durable
            if target > self.recovery_point:
                first = max(0, bisect.bisect_right(self._bases, self.recovery_point) - 1)
                for segment in self.segments[first:]:
                    if segment.base_offset >= target and segment is not self.segments[first]:
                        break
                    segment.flush()
            self._sync_dir_entries()
        if target > self.recovery_point:
            self.recovery_point = target

    def _sync_dir_entries(self) -> None:
        """Make the names of the log's files durable, and a new log's own name in its log dir
        (after its files: a dir that survives a crash holds what was flushed into it). Not
        for an empty log: a load rebuilds it from nothing (Kafka's flush of no segment
        fsyncs no dir), so a shutdown after creating thousands of logs waits on no fsync."""
        if self.log_end_offset == self.log_start_offset:
            return
        if self._dir_dirty:
            self.file_io.fsync_dir(self.dir)
            self._dir_dirty = False
        if self._parent_dir_dirty:
            self.file_io.fsync_dir(os.path.dirname(os.path.normpath(self.dir)))
            self._parent_dir_dirty = False

    def maybe_flush(self, now_ms: int) -> bool:
        """flush.ms: flush when the last flush is older than it and something is unflushed."""
        if self.unflushed_messages <= 0 and not (self._dir_dirty or self._parent_dir_dirty):
            self.last_flush_ms = now_ms
            return False
        if now_ms - self.last_flush_ms < self.config.flush_ms:
            return False
        self.flush()
        self.last_flush_ms = now_ms
        return True

    def close(self) -> None:
        """Write the indexes and a producer snapshot at the log end (so the next open replays
        nothing, as Kafka's close) and close the files (no fsync of the log: `flush` first for
        a clean shutdown)."""
        if self.closed:
            return
        with self._io("close"):
            if not self.failed:
                self.producer_state_manager.take_snapshot()
                if self.leader_epoch_cache.flush_if_needed(self.log_end_offset):
                    self._dir_dirty = False
                self._sync_dir_entries()
            for segment in self.segments:
                segment.flush_indexes()
                segment.close()
            for _, segment in self.pending_deletes:
                segment.close()  # the .deleted files go when the log is next loaded
        self.pending_deletes = []
        self.closed = True

    def close_handlers(self) -> None:
        """Close the files without writing anything (Kafka's closeHandlers): the log's dir
        went offline, so nothing more may be written there."""
        self.closed = True
        for segment in self.segments + [s for _, s in self.pending_deletes]:
            try:
                segment.close()
            except OSError as exc:
                logger.warning("closing %s: %s", self.dir, exc)

    def __repr__(self) -> str:
        return (
            f"Log({self.dir!r}, log_start_offset={self.log_start_offset}, "
            f"log_end_offset={self.log_end_offset}, high_watermark={self.high_watermark}, "
            f"segments={len(self.segments)})"
        )
