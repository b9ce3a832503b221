"""LogSegment: one `<20-digit base offset>.log` file with its `.index`, `.timeindex` and (when a
transaction aborted in it) `.txnindex`."""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator

import crc32c

from tidelog.protocol.records.batch import (
    ATTRIBUTES_OFFSET,
    CURRENT_MAGIC,
    HEADER_SIZE,
    LOG_OVERHEAD,
    RecordBatch,
)
from tidelog.storage.errors import CorruptIndexError
from tidelog.storage.file_io import FileHandle, FileIO, FileSlice
from tidelog.storage.index import OffsetIndex, TimeIndex
from tidelog.storage.transaction_index import TXN_INDEX_SUFFIX, AbortedTxn, TransactionIndex

__all__ = [
    "INDEX_SUFFIX",
    "LOG_SUFFIX",
    "LogSegment",
    "TIME_INDEX_SUFFIX",
    "file_name",
    "parse_base_offset",
]

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
DELETED_SUFFIX = ".deleted"

# baseOffset, batchLength, partitionLeaderEpoch, magic, crc, attributes, lastOffsetDelta:
# the first 27 bytes of a batch header, all a segment needs to walk and validate batches.
PREFIX = struct.Struct(">qiibIhi")
PREFIX_SIZE = PREFIX.size  # 27
_MAX_TIMESTAMP = struct.Struct(">q")
_MAX_TIMESTAMP_OFFSET = 35
_MIN_BATCH_SIZE = HEADER_SIZE
_INT32_MAX = 2**31 - 1

RECOVERY_CHUNK = 16 * 1024 * 1024
_SCAN_CHUNK = 8 * 1024  # header walks start at an index entry, <= index.interval.bytes away
# One read never materializes more than this (a client may ask for 2 GiB): it returns fewer
# whole batches instead.
MAX_READ_BYTES = 64 * 1024 * 1024


def file_name(base_offset: int, suffix: str) -> str:
    return f"{base_offset:020d}{suffix}"


def parse_base_offset(name: str, suffix: str) -> int | None:
    """The base offset of a segment file name, or None for a name that is not one."""
    if not name.endswith(suffix):
        return None
    stem = name[: -len(suffix)]
    if len(stem) != 20 or not stem.isdigit():
        return None
    return int(stem)


class LogSegment:
    """Appends go to the end of `.log`; the indexes live in memory and are written on flush and
    close. `next_offset` is the offset after the segment's last batch."""

    def __init__(
        self,
        file_io: FileIO,
        dir: str,
        base_offset: int,
        *,
        index_interval_bytes: int,
        max_index_bytes: int,
        created_ms: int,
    ) -> None:
        self.file_io = file_io
        self.dir = dir
        self.base_offset = base_offset
        self.index_interval_bytes = index_interval_bytes
        self.log_path = os.path.join(dir, file_name(base_offset, LOG_SUFFIX))
        self.index_path = os.path.join(dir, file_name(base_offset, INDEX_SUFFIX))
        self.time_index_path = os.path.join(dir, file_name(base_offset, TIME_INDEX_SUFFIX))
        self.log: FileHandle = file_io.open(self.log_path)
        self.size = self.log.size()
        self.offset_index = OffsetIndex(base_offset, max_index_bytes)
        self.time_index = TimeIndex(base_offset, max_index_bytes)
        self.txn_index = TransactionIndex(
            file_io, os.path.join(dir, file_name(base_offset, TXN_INDEX_SUFFIX)), base_offset
        )
        self.next_offset = base_offset
        self.max_timestamp = -1
        self.offset_of_max_timestamp = base_offset
        self.rolling_based_timestamp: int | None = None  # first batch's max timestamp
        self.created_ms = created_ms
        self.roll_jitter_ms = 0  # segment.jitter.ms share of this segment (set by the log)
        self.bytes_since_last_index_entry = 0
        self._indexes_dirty = True
        # Entries already in the index files ([offset, time]); None = rewrite them whole.
        self._persisted: list[int] | None = None
        self._index_handles: dict[str, FileHandle] = {}

    # -- appends ---------------------------------------------------------------------------
    def can_hold(self, last_offset: int) -> bool:
        return 0 <= last_offset - self.base_offset <= _INT32_MAX

    def append(
        self,
        data: bytes | bytearray | memoryview | list[memoryview],
        batches: list[tuple[int, int, int]],
        size: int | None = None,
    ) -> None:
        """Write `data` (whole batches, or a list of buffers that concatenate to them; `size`
        is then their total) at the end. `batches` = (position in data, last offset, max
        timestamp) per batch, in order, for the indexes."""
        if isinstance(data, list):
            append_parts = getattr(self.log, "append_parts", None)
            if append_parts is not None:
                position = append_parts(data)
            else:
                position = self.log.append(b"".join(data))
            end = size if size is not None else sum(len(p) for p in data)
        else:
            position = self.log.append(data)
            end = len(data)
        self.index_appended(position, batches, end)

    def index_appended(self, position: int, batches: list[tuple[int, int, int]], end: int) -> None:
        """Index batches written at `position` (`batches` as for `append`, `end` their total
        size): the log cleaner writes a cleaned segment's file first, then indexes it."""
        interval = self.index_interval_bytes
        since = self.bytes_since_last_index_entry
        max_ts = self.max_timestamp
        max_ts_offset = self.offset_of_max_timestamp
        offset_index = self.offset_index
        time_index = self.time_index
        count = len(batches)
        if self.rolling_based_timestamp is None and count:
            self.rolling_based_timestamp = batches[0][2]
        for i in range(count):
            rel_pos, last_offset, batch_max_ts = batches[i]
            size = (batches[i + 1][0] if i + 1 < count else end) - rel_pos
            if batch_max_ts > max_ts:
                max_ts = batch_max_ts
                max_ts_offset = last_offset
            if since > interval:
                offset_index.append(last_offset, position + rel_pos)
                time_index.maybe_append(max_ts, max_ts_offset)
                since = 0
            since += size
        self.bytes_since_last_index_entry = since
        self.max_timestamp = max_ts
        self.offset_of_max_timestamp = max_ts_offset
        self.size = position + end
        if count:
            self.next_offset = batches[-1][1] + 1
        self._indexes_dirty = True

    # -- reads -----------------------------------------------------------------------------
    def translate_offset(self, offset: int) -> tuple[int, int, int] | None:
        """(position, base offset, last offset) of the first batch whose last offset >= `offset`,
        or None when the segment has no such batch."""
        if offset >= self.next_offset:
            return None
        _, position = self.offset_index.lookup(max(offset, self.base_offset))
        log = self.log
        end = self.size
        while position < end:
            chunk = log.read(position, min(_SCAN_CHUNK, end - position))
            chunk_len = len(chunk)
            pos = 0
            while pos + PREFIX_SIZE <= chunk_len:
                base, length, _, _, _, _, delta = PREFIX.unpack_from(chunk, pos)
                if base + delta >= offset:
                    return position + pos, base, base + delta
                size = length + LOG_OVERHEAD
                if size < _MIN_BATCH_SIZE:
                    return None
                pos += size
            if pos == 0 and chunk_len < PREFIX_SIZE:
                return None
            position += pos
        return None

    def read(
        self, start_offset: int, max_size: int, max_offset: int | None, min_one_message: bool
    ) -> tuple[memoryview, int] | None:
        """Whole batches from the one holding `start_offset`: at most `max_size` bytes (or the
        first batch when `min_one_message`), none whose last offset >= `max_offset`. Returns
        (bytes, first batch's base offset), or None when the segment holds nothing from there."""
        found = self.translate_offset(start_offset)
        if found is None:
            return None
        return self._read_at(found, max_size, max_offset, min_one_message)

    def _read_at(
        self, found: tuple[int, int, int], max_size: int, max_offset: int | None,
        min_one_message: bool,
    ) -> tuple[memoryview, int]:
        start, first_base, first_last = found
        if max_offset is not None and first_last >= max_offset:
            return memoryview(b""), first_base
        available = self.size - start
        want = min(max(max_size, 0), available, MAX_READ_BYTES)
        data = self.log.read(start, want) if want > 0 else b""
        view = memoryview(data)
        pos = 0
        n = len(view)
        while pos + PREFIX_SIZE <= n:
            base, length, _, _, _, _, delta = PREFIX.unpack_from(view, pos)
            size = length + LOG_OVERHEAD
            if pos + size > n or (max_offset is not None and base + delta >= max_offset):
                break
            pos += size
        if pos == 0:
            if not min_one_message:
                return memoryview(b""), first_base
            header = bytes(view[:PREFIX_SIZE]) if n >= PREFIX_SIZE else self.log.read(start, PREFIX_SIZE)
            size = PREFIX.unpack_from(header, 0)[1] + LOG_OVERHEAD
            # bounded by the segment: a damaged length never asks for more than is there
            return memoryview(self.log.read(start, max(0, min(size, available)))), first_base
        return view[:pos], first_base

    def read_slice(
        self, start_offset: int, max_size: int, max_offset: int | None, min_one_message: bool,
        min_slice_bytes: int,
    ) -> memoryview | FileSlice | None:
        """The batches `read` returns with the same arguments: a FileSlice for sendfile when
        they are at least `min_slice_bytes` (and the file is a real one), else their bytes.
        The range is found from batch headers alone: the records are never read."""
        found = self.translate_offset(start_offset)
        if found is None:
            return None
        fileno = getattr(self.log, "fileno", None)
        start, _, first_last = found
        available = self.size - start
        bound = start + min(max(max_size, 0), available, MAX_READ_BYTES)
        if (fileno is None or (max_offset is not None and first_last >= max_offset)
                or bound - start < min_slice_bytes):
            return self._read_at(found, max_size, max_offset, min_one_message)[0]
        if max_offset is not None:
            stop = self.translate_offset(max_offset)
            if stop is not None:
                bound = min(bound, stop[0])
        end, last = self._batches_end(start, bound)
        if end == start and min_one_message:
            # Kafka's minOneMessage: the first batch whole, however large.
            header = self.log.read(start, PREFIX_SIZE)
            end = start + max(0, min(PREFIX.unpack_from(header, 0)[1] + LOG_OVERHEAD, available))
            last = first_last
        if end - start < max(min_slice_bytes, 1):
            return memoryview(self.log.read(start, end - start) if end > start else b"")
        return FileSlice(fileno(), start, end - start, last + 1)

    def _batches_end(self, start: int, bound: int) -> tuple[int, int]:
        """(end, last offset): the furthest batch boundary <= `bound` walking whole batches
        from the batch at `start`, and the last offset of the batch ending there (-1 when
        end == start). The walk starts at the nearest index entry, not at `start`."""
        end, last = self._walk_headers(max(start, self.offset_index.position_below(bound)), bound)
        if last < 0 and end > start:
            # The batch at that entry does not fit: the one before it ends the range; walk up
            # to the entry from the entry before it for its last offset.
            end, last = self._walk_headers(max(start, self.offset_index.position_below(end)), end)
        return end, last

    def _walk_headers(self, position: int, bound: int) -> tuple[int, int]:
        last = -1
        log = self.log
        while position + PREFIX_SIZE <= bound:
            chunk = log.read(position, min(_SCAN_CHUNK, bound - position))
            n = len(chunk)
            pos = 0
            while pos + PREFIX_SIZE <= n:
                base, length, _, _, _, _, delta = PREFIX.unpack_from(chunk, pos)
                size = length + LOG_OVERHEAD
                if size < _MIN_BATCH_SIZE or position + pos + size > bound:
                    return position + pos, last
                last = base + delta
                pos += size
            if pos == 0:
                break  # fewer bytes than a header left in the file
            position += pos
        return position, last

    def iter_batches(self, start_position: int = 0) -> Iterator[RecordBatch]:
        """Every batch from `start_position` (read in large chunks)."""
        position = start_position
        end = self.size
        while position < end:
            chunk = self.log.read(position, min(RECOVERY_CHUNK, end - position))
            view = memoryview(chunk)
            pos = 0
            n = len(view)
            while pos + PREFIX_SIZE <= n:
                size = PREFIX.unpack_from(view, pos)[1] + LOG_OVERHEAD
                if size < _MIN_BATCH_SIZE:
                    return
                if pos + size > n:
                    break
                yield RecordBatch(view[pos : pos + size])
                pos += size
            if pos == 0:
                if n < PREFIX_SIZE or end - position <= n:
                    return
                # One batch larger than the chunk: read exactly it.
                size = PREFIX.unpack_from(view, 0)[1] + LOG_OVERHEAD
                if size > end - position:
                    return  # a damaged length: never read past the segment
                whole = self.log.read(position, size)
                if len(whole) < size:
                    return
                yield RecordBatch(memoryview(whole))
                pos = size
            position += pos

    # -- recovery --------------------------------------------------------------------------
    def recover(self) -> tuple[int, list[tuple[int, int]]]:
        """Validate every batch (framing, magic, CRC32C, increasing offsets), rebuild both
        indexes, and truncate at the first invalid or torn batch. Returns (bytes truncated,
        [(partition leader epoch, base offset)] of the valid batches whose epoch changes)."""
        self.offset_index.reset()
        self.time_index.reset()
        self.txn_index.reset()  # the log re-adds the aborted transactions of its markers
        self._persisted = None
        self.bytes_since_last_index_entry = 0
        self.max_timestamp = -1
        self.offset_of_max_timestamp = self.base_offset
        self.rolling_based_timestamp = None
        self.next_offset = self.base_offset
        file_size = self.log.size()
        interval = self.index_interval_bytes
        since = 0
        max_ts = -1
        max_ts_offset = self.base_offset
        next_offset = self.base_offset
        epochs: list[tuple[int, int]] = []
        last_epoch = -1
        offset_index = self.offset_index
        time_index = self.time_index
        position = 0
        valid_end = 0
        corrupt = False
        want = RECOVERY_CHUNK
        while position < file_size and not corrupt:
            chunk = self.log.read(position, min(want, file_size - position))
            want = RECOVERY_CHUNK
            view = memoryview(chunk)
            n = len(view)
            if n == 0:
                break
            pos = 0
            while True:
                if pos + PREFIX_SIZE > n:
                    if position + n >= file_size and pos < n:
                        corrupt = True  # torn header at the end of the file
                    break
                base, length, epoch, magic, crc, _, delta = PREFIX.unpack_from(view, pos)
                size = length + LOG_OVERHEAD
                if (
                    magic != CURRENT_MAGIC
                    or size < _MIN_BATCH_SIZE
                    or delta < 0
                    or base < next_offset
                    or base + delta - self.base_offset > _INT32_MAX
                ):
                    corrupt = True
                    break
                if pos + size > n:
                    if position + pos + size > file_size:
                        corrupt = True  # torn batch at the end of the file
                    elif pos == 0:
                        want = size  # one batch larger than a chunk: read exactly it next
                    break
                if crc32c.crc32c(view[pos + ATTRIBUTES_OFFSET : pos + size]) != crc:
                    corrupt = True
                    break
                last = base + delta
                batch_ts = _MAX_TIMESTAMP.unpack_from(view, pos + _MAX_TIMESTAMP_OFFSET)[0]
                if self.rolling_based_timestamp is None:
                    self.rolling_based_timestamp = batch_ts
                if batch_ts > max_ts:
                    max_ts = batch_ts
                    max_ts_offset = last
                if since > interval:
                    offset_index.append(last, position + pos)
                    time_index.maybe_append(max_ts, max_ts_offset)
                    since = 0
                since += size
                if epoch != last_epoch:
                    if epoch >= 0:
                        epochs.append((epoch, base))
                    last_epoch = epoch
                next_offset = last + 1
                pos += size
            position += pos
            valid_end = position
            if pos == 0 and want == RECOVERY_CHUNK:
                break
        self.bytes_since_last_index_entry = since
        self.max_timestamp = max_ts
        self.offset_of_max_timestamp = max_ts_offset
        self.next_offset = next_offset
        truncated = file_size - valid_end
        if truncated:
            self.log.truncate(valid_end)
        self.size = valid_end
        self._indexes_dirty = True
        return truncated, epochs

    def load_indexes(self) -> bool:
        """Load `.index` and `.timeindex` and find `next_offset` by walking the batches after
        the last index entry. False when an index is missing or fails its sanity check, or the
        tail does not walk cleanly (the caller then recovers the segment)."""
        try:
            if self.size > 0 and not (
                self.file_io.exists(self.index_path) and self.file_io.exists(self.time_index_path)
            ):
                return False
            for path, index in ((self.index_path, self.offset_index), (self.time_index_path, self.time_index)):
                if not self.file_io.exists(path):
                    continue
                handle = self.file_io.open(path)
                try:
                    data = bytes(handle.read(0, handle.size()))
                finally:
                    handle.close()
                if isinstance(index, OffsetIndex):
                    index.load_bytes(data, self.size)
                else:
                    index.load_bytes(data, _INT32_MAX)
            self.txn_index.load()
        except CorruptIndexError:
            self.offset_index.reset()
            self.time_index.reset()
            return False
        # The tail after the last offset index entry: walk it to find the next offset.
        last_offset, position = self.offset_index.last_entry
        if len(self.offset_index) and position >= self.size:
            return False
        next_offset = self.base_offset
        since = 0
        first = True
        for batch in self.iter_batches(position):
            base, length, _, magic, stored_crc, _, delta = PREFIX.unpack_from(batch.buf, 0)
            if (
                magic != CURRENT_MAGIC
                or base < next_offset
                or delta < 0
                or base + delta - self.base_offset > _INT32_MAX
                or crc32c.crc32c(batch.buf[ATTRIBUTES_OFFSET:]) != stored_crc
            ):
                return False  # the walked tail is validated like a recovery
            if first and len(self.offset_index) and base + delta != last_offset:
                return False  # the last entry does not point at a batch holding its offset
            if first and self.rolling_based_timestamp is None and position == 0:
                self.rolling_based_timestamp = batch.max_timestamp
            first = False
            ts = batch.max_timestamp
            if ts > self.max_timestamp:
                self.max_timestamp = ts
                self.offset_of_max_timestamp = base + delta
            next_offset = base + delta + 1
            since += length + LOG_OVERHEAD
            position += length + LOG_OVERHEAD
        if position != self.size:
            return False
        ts, ts_offset = self.time_index.last_entry
        if ts > self.max_timestamp:
            self.max_timestamp, self.offset_of_max_timestamp = ts, ts_offset
        if self.time_index.last_entry[1] >= max(next_offset, self.base_offset + 1):
            return False
        self.next_offset = next_offset
        self.bytes_since_last_index_entry = since
        if self.rolling_based_timestamp is None and self.size:
            first_batch = next(self.iter_batches(0), None)
            if first_batch is not None:
                self.rolling_based_timestamp = first_batch.max_timestamp
        self._indexes_dirty = False
        return True

    # -- truncation ------------------------------------------------------------------------
    def truncate_to(self, offset: int) -> int:
        """Remove the batches whose last offset >= `offset` (a batch holding `offset` goes
        whole). Returns the bytes removed; `next_offset` becomes min(offset, the first removed
        batch's base offset)."""
        found = self.translate_offset(offset)
        if found is None:
            self.next_offset = min(self.next_offset, max(offset, self.base_offset))
            return 0
        position, first_removed_base, _ = found
        removed = self.size - position
        self.log.truncate(position)
        self.size = position
        self.offset_index.truncate_to_position(position)
        self.time_index.truncate_to(first_removed_base)
        self.txn_index.truncate_to(first_removed_base)
        self._persisted = None
        self.next_offset = max(self.base_offset, min(offset, first_removed_base))
        # Kafka re-derives the max timestamp from the time index, then the unindexed tail.
        self.max_timestamp, self.offset_of_max_timestamp = self.time_index.last_entry
        if self.max_timestamp < 0:
            self.offset_of_max_timestamp = self.base_offset
        _, tail = self.offset_index.last_entry
        self.bytes_since_last_index_entry = 0
        for batch in self.iter_batches(tail):
            if batch.max_timestamp > self.max_timestamp:
                self.max_timestamp = batch.max_timestamp
                self.offset_of_max_timestamp = batch.last_offset
            self.bytes_since_last_index_entry += batch.size_in_bytes
        if self.size == 0:
            self.rolling_based_timestamp = None
        self._indexes_dirty = True
        return removed

    # -- durability / lifecycle ------------------------------------------------------------
    def _index_handle(self, path: str) -> FileHandle:
        handle = self._index_handles.get(path)
        if handle is None:
            handle = self._index_handles[path] = self.file_io.open(path)
        return handle

    def flush_indexes(self) -> None:
        """Write the index files: only the new entries when the files hold a prefix of them
        (appends), else the whole index (after a truncation, a recovery or a load)."""
        if not self._indexes_dirty:
            return
        persisted = self._persisted
        for i, (path, index) in enumerate(
            ((self.index_path, self.offset_index), (self.time_index_path, self.time_index))
        ):
            handle = self._index_handle(path)
            if persisted is None:
                handle.truncate(0)
                data = index.to_bytes()
            elif persisted[i] == len(index):
                continue
            else:
                data = index.to_bytes(persisted[i])
            if data:
                handle.append(data)
            handle.flush()
        self._persisted = [len(self.offset_index), len(self.time_index)]
        self._indexes_dirty = False

    def _close_index_handles(self) -> None:
        for handle in self._index_handles.values():
            handle.close()
        self._index_handles.clear()

    def flush(self) -> None:
        """fsync the log, then write the indexes (they are rebuilt if lost)."""
        self.log.flush()
        self.flush_indexes()
        self.txn_index.flush()

    def update_txn_index(self, txn: AbortedTxn) -> None:
        """An ABORT marker in this segment: its transaction's entry (Kafka's updateTxnIndex)."""
        self.txn_index.append(txn)

    def on_become_inactive(self) -> None:
        """On roll: the final time index entry, as Kafka's onBecomeInactiveSegment."""
        self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp)
        self._indexes_dirty = True

    def close(self) -> None:
        self._close_index_handles()
        self.txn_index.close()
        self.log.close()

    def mark_deleted(self) -> None:
        """Kafka's asynchronous segment delete, first step: the files take the .deleted suffix
        (a reader holding the open log file keeps reading it); `delete` removes them later."""
        self._close_index_handles()
        for attr in ("log_path", "index_path", "time_index_path"):
            path = getattr(self, attr)
            if self.file_io.exists(path):
                self.file_io.rename(path, path + DELETED_SUFFIX)
            setattr(self, attr, path + DELETED_SUFFIX)
        self.txn_index.rename_to(self.txn_index.path + DELETED_SUFFIX)

    def delete(self) -> None:
        self._close_index_handles()
        self.log.close()
        for path in (self.log_path, self.index_path, self.time_index_path):
            if self.file_io.exists(path):
                self.file_io.remove(path)
        self.txn_index.delete()

    def largest_timestamp(self) -> int:
        """The segment's newest record timestamp, or its creation time when it has none."""
        return self.max_timestamp if self.max_timestamp > 0 else self.created_ms

    def time_waited_for_roll(self, now_ms: int, message_timestamp: int) -> int:
        if self.rolling_based_timestamp is not None and self.rolling_based_timestamp >= 0:
            return message_timestamp - self.rolling_based_timestamp
        return now_ms - self.created_ms

    def __repr__(self) -> str:
        return (
            f"LogSegment(base_offset={self.base_offset}, next_offset={self.next_offset}, "
            f"size={self.size})"
        )
