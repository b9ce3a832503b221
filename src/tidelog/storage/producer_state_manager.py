"""Producer state of one partition log (Kafka's `ProducerStateManager`, `ProducerStateEntry`,
`ProducerAppendInfo` and `BatchMetadata`; the `Log` runs its analyzeAndValidateProducerState).

For every producer id the log remembers its epoch, the coordinator epoch of its last
transaction marker, the timestamp of its last write, the first offset of its ongoing
transaction, and the sequence numbers and offsets of its last five batches
(`NUM_BATCHES_TO_RETAIN`: the five in-flight requests a producer may have). The `Log` owns one
manager and keeps it current on every append, as leader and as follower, so a follower that
becomes leader answers the retries of batches its predecessor wrote.

Validation (`ProducerAppendInfo`, origin CLIENT): an epoch older than the known one is
INVALID_PRODUCER_EPOCH; a new epoch must start at sequence 0; within an epoch the first sequence
must follow the last one (wrapping at 2^31-1), except for a producer with no known epoch (never
seen, expired, or removed with the log prefix), whose first batch is accepted at any sequence.
A retried batch (same epoch and sequence range as one of the five) is a duplicate: the `Log`
answers it with the original offsets and writes nothing. Replicated appends and the replay of
the log at load (origin REPLICATION) are not validated, only recorded.

Transactions: each entry also carries Kafka's transactional fields, kept as batches are
recorded: a transactional data batch opens the producer's transaction (`current_txn_first_offset`)
and a COMMIT/ABORT marker closes it and sets `coordinator_epoch`. The transactional rules, the
ongoing and unreplicated transactions, the first unstable offset and the `.txnindex` are the
log's `TransactionTracker` (storage/transactions.py); snapshots store these two fields so that
they survive a restart as Kafka's do.

Snapshots: `<offset>.snapshot` files (20-digit offset, Kafka's format: version 1, a CRC32C of
the entries, and per producer: id, epoch, last sequence, last offset, offset delta, timestamp,
coordinator epoch, current transaction first offset), written atomically (temp file, rename).
The log takes one at every segment roll (at the new segment's base offset), at a truncation
(at the new end) and at a clean close, and loads the latest one not past its end at open,
replaying only the batches after it; expired producers are not reloaded. A snapshot that fails
its CRC is deleted and the next older one is tried. Snapshots past the end go with a
truncation, those below the log start with deleted segments, strays at the next open; a
snapshot holds only each producer's last batch (as Kafka's).
"""

from __future__ import annotations

import bisect
import logging
import os
import struct
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import crc32c

from tidelog.protocol.records.batch import NO_PRODUCER_EPOCH, NO_SEQUENCE
from tidelog.storage.errors import StorageError
from tidelog.storage.file_io import FileIO, write_file_atomically
from tidelog.storage.transactions import AppendOrigin, InvalidProducerEpochError

__all__ = [
    "NUM_BATCHES_TO_RETAIN",
    "PRODUCER_SNAPSHOT_VERSION",
    "SNAPSHOT_SUFFIX",
    "BatchMetadata",
    "VerificationGuard",
    "CorruptSnapshotError",
    "OutOfOrderSequenceError",
    "ProducerAppendInfo",
    "ProducerStateEntry",
    "ProducerStateManager",
    "last_sequence",
    "read_snapshot",
    "snapshot_file_name",
    "write_snapshot",
]

logger = logging.getLogger(__name__)

NUM_BATCHES_TO_RETAIN = 5
PRODUCER_SNAPSHOT_VERSION = 1
SNAPSHOT_SUFFIX = ".snapshot"
_INT_MAX = 2**31 - 1

# Snapshot layout (Kafka's PID_SNAPSHOT_MAP_SCHEMA): version int16, crc uint32, then an array
# (int32 count) of entries; the CRC32C covers everything from the array on.
_HEAD = struct.Struct(">hI")
_COUNT = struct.Struct(">i")
_ENTRY = struct.Struct(">qhiqiqiq")
_ENTRIES_OFFSET = _HEAD.size  # 6


class OutOfOrderSequenceError(StorageError):
    """OUT_OF_ORDER_SEQUENCE_NUMBER: the batch does not follow the producer's last sequence."""

    error_code = 45


class CorruptSnapshotError(StorageError):
    """A snapshot file that cannot be read (bad version, CRC or length)."""


def decrement_sequence(sequence: int, decrement: int) -> int:
    """Kafka's DefaultRecordBatch.decrementSequence (sequences wrap at Int.MaxValue)."""
    if sequence < decrement:
        return _INT_MAX - (decrement - sequence) + 1
    return sequence - decrement


def last_sequence(base_sequence: int, last_offset_delta: int) -> int:
    if base_sequence == NO_SEQUENCE:
        return NO_SEQUENCE
    return (base_sequence + last_offset_delta) % (_INT_MAX + 1)


def _in_sequence(last_seq: int, next_seq: int) -> bool:
    return next_seq == last_seq + 1 or (next_seq == 0 and last_seq == _INT_MAX)


class VerificationGuard:
    """KIP-890's guard (Kafka's VerificationGuard): made when the leader starts verifying that a
    producer's transaction includes the partition, presented by the verified produce at append.
    Identity is the value: any append by the producer (its transaction began, or a marker ended
    it) drops the partition's guard, so a verification that raced with an abort marker presents
    a guard the log no longer holds. `SENTINEL` (no guard) verifies nothing."""

    __slots__ = ()

    SENTINEL: VerificationGuard

    def verify(self, presented: VerificationGuard | None) -> bool:
        return self is not VerificationGuard.SENTINEL and presented is self


VerificationGuard.SENTINEL = VerificationGuard()


@dataclass(slots=True)
class VerificationStateEntry:
    """A producer's verification in progress on this partition (Kafka's
    VerificationStateEntry): the guard and when it was made (expired with the producers)."""

    guard: VerificationGuard
    timestamp_ms: int


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    last_seq: int
    last_offset: int
    offset_delta: int
    timestamp: int

    @property
    def first_seq(self) -> int:
        return decrement_sequence(self.last_seq, self.offset_delta)

    @property
    def first_offset(self) -> int:
        return self.last_offset - self.offset_delta


@dataclass(slots=True)
class ProducerStateEntry:
    producer_id: int
    producer_epoch: int = NO_PRODUCER_EPOCH
    coordinator_epoch: int = -1
    last_timestamp: int = -1
    current_txn_first_offset: int | None = None
    batch_metadata: deque[BatchMetadata] = field(default_factory=deque)

    @property
    def is_empty(self) -> bool:
        return not self.batch_metadata

    @property
    def last_seq(self) -> int:
        return self.batch_metadata[-1].last_seq if self.batch_metadata else NO_SEQUENCE

    @property
    def last_data_offset(self) -> int:
        return self.batch_metadata[-1].last_offset if self.batch_metadata else -1

    @property
    def last_offset_delta(self) -> int:
        return self.batch_metadata[-1].offset_delta if self.batch_metadata else 0

    def maybe_update_producer_epoch(self, producer_epoch: int) -> bool:
        if self.producer_epoch != producer_epoch:
            self.batch_metadata.clear()
            self.producer_epoch = producer_epoch
            return True
        return False

    def _add_batch_metadata(self, batch: BatchMetadata) -> None:
        if len(self.batch_metadata) == NUM_BATCHES_TO_RETAIN:
            self.batch_metadata.popleft()
        self.batch_metadata.append(batch)

    def add_batch(self, producer_epoch: int, last_seq: int, last_offset: int, offset_delta: int,
                  timestamp: int) -> None:
        self.maybe_update_producer_epoch(producer_epoch)
        self._add_batch_metadata(BatchMetadata(last_seq, last_offset, offset_delta, timestamp))
        self.last_timestamp = timestamp

    def update(self, next_entry: ProducerStateEntry) -> None:
        """Merge what an append produced (`ProducerAppendInfo.to_entry`) into this entry."""
        self.maybe_update_producer_epoch(next_entry.producer_epoch)
        for batch in next_entry.batch_metadata:
            self._add_batch_metadata(batch)
        self.coordinator_epoch = next_entry.coordinator_epoch
        self.current_txn_first_offset = next_entry.current_txn_first_offset
        self.last_timestamp = next_entry.last_timestamp

    def find_duplicate_batch(self, producer_epoch: int, first_seq: int,
                             last_seq: int) -> BatchMetadata | None:
        if producer_epoch != self.producer_epoch:
            return None
        for batch in self.batch_metadata:
            if batch.last_seq == last_seq and batch.first_seq == first_seq:
                return batch
        return None


class ProducerAppendInfo:
    """The validation and bookkeeping of one producer's batches within one append; applied to
    the manager with `ProducerStateManager.update` once the batches are written."""

    __slots__ = ("producer_id", "current_entry", "origin", "_updated", "_tp")

    def __init__(self, topic_partition: str, producer_id: int, current_entry: ProducerStateEntry,
                 origin: AppendOrigin) -> None:
        self._tp = topic_partition
        self.producer_id = producer_id
        self.current_entry = current_entry
        self.origin = origin
        # Kafka's withProducerIdAndBatchMetadata(producerId, empty): the known epochs, timestamp
        # and open transaction, no batches yet.
        self._updated = ProducerStateEntry(
            producer_id, current_entry.producer_epoch, current_entry.coordinator_epoch,
            current_entry.last_timestamp, current_entry.current_txn_first_offset)

    def to_entry(self) -> ProducerStateEntry:
        return self._updated

    def _check_producer_epoch(self, producer_epoch: int, offset: int) -> None:
        current = self._updated.producer_epoch
        if producer_epoch < current:
            message = (f"epoch of producer {self.producer_id} at offset {offset} in {self._tp} is "
                       f"{producer_epoch}, which is smaller than the last seen epoch {current}")
            if self.origin is AppendOrigin.REPLICATION:
                logger.warning("%s", message)
            else:
                raise InvalidProducerEpochError(message)

    def _check_sequence(self, producer_epoch: int, first_seq: int, offset: int) -> None:
        updated = self._updated
        if producer_epoch != updated.producer_epoch:
            if first_seq != 0 and updated.producer_epoch != NO_PRODUCER_EPOCH:
                raise OutOfOrderSequenceError(
                    f"invalid sequence number for new epoch of producer {self.producer_id} at "
                    f"offset {offset} in {self._tp}: {producer_epoch} (request epoch), "
                    f"{first_seq} (seq. number), {updated.producer_epoch} (current epoch)")
            return
        if not updated.is_empty:
            current_last_seq = updated.last_seq
        elif producer_epoch == self.current_entry.producer_epoch:
            current_last_seq = self.current_entry.last_seq
        else:
            current_last_seq = NO_SEQUENCE
        # A producer with no known epoch (never seen, expired, or its state lost with the log
        # prefix) may continue at any sequence.
        if not (self.current_entry.producer_epoch == NO_PRODUCER_EPOCH
                or _in_sequence(current_last_seq, first_seq)):
            raise OutOfOrderSequenceError(
                f"out of order sequence number for producer {self.producer_id} at offset "
                f"{offset} in {self._tp}: {first_seq} (incoming seq. number), "
                f"{current_last_seq} (current end sequence number)")

    def append_data_batch(self, producer_epoch: int, first_seq: int, last_seq: int,
                          last_timestamp: int, first_offset: int, last_offset: int,
                          is_transactional: bool) -> None:
        """Validate (per origin) and record a data batch; the transactional rules are the
        TransactionTracker's, here a transactional batch only opens the entry's transaction."""
        self._check_producer_epoch(producer_epoch, first_offset)
        if self.origin is AppendOrigin.CLIENT:
            self._check_sequence(producer_epoch, first_seq, first_offset)
        updated = self._updated
        updated.add_batch(producer_epoch, last_seq, last_offset, last_offset - first_offset,
                          last_timestamp)
        if is_transactional and updated.current_txn_first_offset is None:
            updated.current_txn_first_offset = first_offset

    def append_end_txn_marker(self, producer_epoch: int, coordinator_epoch: int,
                              timestamp: int) -> None:
        """Record a COMMIT/ABORT marker (validated by the TransactionTracker): the transaction
        closes (Kafka's ProducerStateEntry.update(epoch, coordinatorEpoch, timestamp))."""
        updated = self._updated
        updated.maybe_update_producer_epoch(producer_epoch)
        updated.coordinator_epoch = coordinator_epoch
        updated.current_txn_first_offset = None
        updated.last_timestamp = timestamp


def snapshot_file_name(offset: int) -> str:
    return f"{offset:020d}{SNAPSHOT_SUFFIX}"


def snapshot_offset(name: str) -> int | None:
    """The offset of a `<offset>.snapshot` file name, or None for another name."""
    if not name.endswith(SNAPSHOT_SUFFIX):
        return None
    stem = name[: -len(SNAPSHOT_SUFFIX)]
    return int(stem) if stem.isdigit() else None


def write_snapshot(entries: Iterable[ProducerStateEntry]) -> bytes:
    """The bytes of a snapshot file holding `entries` (each with its last batch only)."""
    items = list(entries)
    body = bytearray(_COUNT.pack(len(items)))
    for e in items:
        body += _ENTRY.pack(
            e.producer_id, e.producer_epoch, e.last_seq, e.last_data_offset,
            e.last_offset_delta, e.last_timestamp, e.coordinator_epoch,
            -1 if e.current_txn_first_offset is None else e.current_txn_first_offset)
    return _HEAD.pack(PRODUCER_SNAPSHOT_VERSION, crc32c.crc32c(body)) + bytes(body)


def read_snapshot(data: bytes | memoryview) -> list[ProducerStateEntry]:
    """Parse a snapshot file's bytes; CorruptSnapshotError when they are not a whole, valid one."""
    data = bytes(data)
    if len(data) < _ENTRIES_OFFSET + _COUNT.size:
        raise CorruptSnapshotError(f"snapshot of {len(data)} bytes is too short")
    version, crc = _HEAD.unpack_from(data, 0)
    if version != PRODUCER_SNAPSHOT_VERSION:
        raise CorruptSnapshotError(f"snapshot contained an unknown file version {version}")
    computed = crc32c.crc32c(memoryview(data)[_ENTRIES_OFFSET:])
    if crc != computed:
        raise CorruptSnapshotError(
            f"snapshot is corrupt (CRC is no longer valid). Stored crc: {crc}. "
            f"Computed crc: {computed}")
    (count,) = _COUNT.unpack_from(data, _ENTRIES_OFFSET)
    start = _ENTRIES_OFFSET + _COUNT.size
    if count < 0 or start + count * _ENTRY.size != len(data):
        raise CorruptSnapshotError(f"snapshot declares {count} entries in {len(data)} bytes")
    out = []
    for i in range(count):
        (pid, epoch, seq, offset, delta, ts, coordinator_epoch,
         txn_first) = _ENTRY.unpack_from(data, start + i * _ENTRY.size)
        entry = ProducerStateEntry(pid, epoch, coordinator_epoch, ts,
                                   txn_first if txn_first >= 0 else None)
        if offset >= 0:
            entry.batch_metadata.append(BatchMetadata(seq, offset, delta, ts))
        out.append(entry)
    return out


class ProducerStateManager:
    """The producers of one partition log, and its snapshot files in `log_dir` (listed by
    `remove_stray_snapshots`, the first step of loading). `on_dir_change` is called when a
    snapshot file is removed (the log fsyncs its directory before it relies on that)."""

    def __init__(self, topic_partition: str, log_dir: str, file_io: FileIO, *,
                 producer_id_expiration_ms: int = 86_400_000,
                 on_dir_change: Callable[[], None] | None = None) -> None:
        self.topic_partition = topic_partition
        self.log_dir = log_dir
        self.file_io = file_io
        self.producer_id_expiration_ms = producer_id_expiration_ms
        self._on_dir_change = on_dir_change
        self.producers: dict[int, ProducerStateEntry] = {}
        # KIP-890: producers whose transaction the leader is verifying here (not in snapshots,
        # as Kafka's: a new leader verifies again)
        self.verification_states: dict[int, VerificationStateEntry] = {}
        self._snapshots: list[int] = []  # offsets of the snapshot files, ascending
        self.last_map_offset = 0
        self.last_snap_offset = 0
        self.batches_loaded = 0  # batches replayed from the log to rebuild the state

    # -- state -----------------------------------------------------------------------------
    @property
    def map_end_offset(self) -> int:
        """The offset up to which the state reflects the log."""
        return self.last_map_offset

    def is_empty(self) -> bool:
        return not self.producers

    def prepare_update(self, producer_id: int, origin: AppendOrigin) -> ProducerAppendInfo:
        current = self.producers.get(producer_id)
        if current is None:
            current = ProducerStateEntry(producer_id)
        return ProducerAppendInfo(self.topic_partition, producer_id, current, origin)

    def maybe_create_verification_guard(self, producer_id: int, now_ms: int
                                        ) -> VerificationGuard:
        """The producer's guard here, made if it has none (Kafka's
        maybeCreateVerificationStateEntry: concurrent produces share it)."""
        entry = self.verification_states.get(producer_id)
        if entry is None:
            entry = self.verification_states[producer_id] = VerificationStateEntry(
                VerificationGuard(), now_ms)
        return entry.guard

    def verification_guard(self, producer_id: int) -> VerificationGuard:
        entry = self.verification_states.get(producer_id)
        return VerificationGuard.SENTINEL if entry is None else entry.guard

    def update(self, append_info: ProducerAppendInfo) -> None:
        # The producer's append began or ended its transaction here: a verification started
        # before it is stale.
        self.verification_states.pop(append_info.producer_id, None)
        updated = append_info.to_entry()
        current = self.producers.get(append_info.producer_id)
        if current is not None:
            current.update(updated)
        else:
            self.producers[append_info.producer_id] = updated

    def update_map_end_offset(self, offset: int) -> None:
        self.last_map_offset = offset

    def is_producer_expired(self, now_ms: int, entry: ProducerStateEntry) -> bool:
        return (entry.current_txn_first_offset is None
                and now_ms - entry.last_timestamp >= self.producer_id_expiration_ms)

    def remove_expired_producers(self, now_ms: int) -> int:
        """producer.id.expiration.ms: forget producers idle that long with no open transaction."""
        expired = [pid for pid, e in self.producers.items() if self.is_producer_expired(now_ms, e)]
        for pid in expired:
            del self.producers[pid]
        stale = [pid for pid, v in self.verification_states.items()
                 if now_ms - v.timestamp_ms >= self.producer_id_expiration_ms]
        for pid in stale:
            del self.verification_states[pid]
        return len(expired)

    # -- snapshots -------------------------------------------------------------------------
    def _path(self, offset: int) -> str:
        return os.path.join(self.log_dir, snapshot_file_name(offset))

    def _load_snapshot_offsets(self) -> None:
        try:
            names = self.file_io.listdir(self.log_dir)
        except FileNotFoundError:
            names = []
        self._snapshots = sorted(o for n in names if (o := snapshot_offset(n)) is not None)

    @property
    def snapshot_offsets(self) -> list[int]:
        return list(self._snapshots)

    def latest_snapshot_offset(self) -> int | None:
        return self._snapshots[-1] if self._snapshots else None

    def take_snapshot(self) -> bool:
        """Write a snapshot at the map end offset unless one is there already, durably.
        Returns True when one was written."""
        if self.last_map_offset <= self.last_snap_offset:
            return False
        offset = self.last_map_offset
        # Temp file, fsync, rename, dir fsync (Kafka writes in place and relies on the CRC): a
        # crash shows the whole new snapshot or none, never an older one under its name.
        write_file_atomically(self.file_io, self._path(offset),
                              write_snapshot(self.producers.values()))
        i = bisect.bisect_left(self._snapshots, offset)
        if i == len(self._snapshots) or self._snapshots[i] != offset:
            self._snapshots.insert(i, offset)
        self.last_snap_offset = offset
        return True

    def delete_snapshot(self, offset: int) -> None:
        """Remove the snapshot at `offset`, if any."""
        i = bisect.bisect_left(self._snapshots, offset)
        if i < len(self._snapshots) and self._snapshots[i] == offset:
            del self._snapshots[i]
        path = self._path(offset)
        if self.file_io.exists(path):
            self.file_io.remove(path)
            if self._on_dir_change is not None:
                self._on_dir_change()

    def delete_snapshots_before(self, offset: int) -> None:
        """Remove every snapshot below `offset` (the log start: replay never begins there)."""
        for o in self._snapshots[: bisect.bisect_left(self._snapshots, offset)]:
            self.delete_snapshot(o)

    def remove_stray_snapshots(self, segment_base_offsets: Iterable[int]) -> None:
        """Delete snapshots that start no segment, except the newest one when it lies past
        every segment's base (the one a clean shutdown wrote at the log end)."""
        self._load_snapshot_offsets()
        bases = set(segment_base_offsets)
        strays = [o for o in self._snapshots if o not in bases]
        keep = strays[-1] if strays and (not bases or strays[-1] > max(bases)) else None
        for o in strays:
            if o != keep:
                self.delete_snapshot(o)

    def _read_snapshot_file(self, offset: int) -> list[ProducerStateEntry]:
        handle = self.file_io.open(self._path(offset))
        try:
            return read_snapshot(handle.read(0, handle.size()))
        finally:
            handle.close()

    def _load_from_snapshot(self, log_start_offset: int, now_ms: int | None) -> None:
        while self._snapshots:
            offset = self._snapshots[-1]
            try:
                entries = self._read_snapshot_file(offset)
            except CorruptSnapshotError as exc:
                logger.warning("%s: failed to load producer snapshot %s: %s",
                               self.topic_partition, self._path(offset), exc)
                self.delete_snapshot(offset)
                continue
            for entry in entries:
                if now_ms is None or not self.is_producer_expired(now_ms, entry):
                    self.producers[entry.producer_id] = entry
            self.last_snap_offset = self.last_map_offset = offset
            return
        self.last_snap_offset = self.last_map_offset = log_start_offset

    def truncate_and_reload(self, log_start_offset: int, log_end_offset: int,
                            now_ms: int | None) -> None:
        """Drop snapshots outside (log start, log end] and, unless the state already ends at
        the log end, reload it from the latest remaining snapshot (the caller replays the log
        from `map_end_offset`). `now_ms` None: expired entries are kept (the periodic check
        removes them)."""
        for o in [o for o in self._snapshots if o > log_end_offset or o <= log_start_offset]:
            self.delete_snapshot(o)
        if log_end_offset != self.last_map_offset:
            self.producers.clear()
            self._load_from_snapshot(log_start_offset, now_ms)
        else:
            self.on_log_start_offset_incremented(log_start_offset)

    def on_log_start_offset_incremented(self, log_start_offset: int) -> None:
        """The log start moved up. The state keeps producers whose batches went (as Kafka)."""
        if self.last_map_offset < log_start_offset:
            self.last_map_offset = log_start_offset
        latest = self.latest_snapshot_offset()
        self.last_snap_offset = latest if latest is not None else log_start_offset

    def truncate_fully_and_start_at(self, offset: int) -> None:
        self.producers.clear()
        for o in list(self._snapshots):
            self.delete_snapshot(o)
        self.last_snap_offset = 0
        self.last_map_offset = offset
