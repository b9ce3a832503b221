"""Sparse segment indexes, kept in memory and persisted in Kafka's file formats.

- offset index (`.index`): 8-byte entries, 4-byte offset relative to the segment's base offset
  and 4-byte file position, big-endian. An entry maps the last offset of a batch to the
  position of that batch; one is added every `index.interval.bytes` of log.
- time index (`.timeindex`): 12-byte entries, 8-byte timestamp and 4-byte relative offset; a
  new entry only when the segment's max timestamp grew.

The in-memory arrays are the truth while the segment is open; `to_bytes` is written on
flush/roll/close, and `from_bytes` checks a file's sanity so that a corrupt one is rebuilt.
"""

from __future__ import annotations

import bisect
import struct
import sys
from array import array

from tidelog.storage.errors import CorruptIndexError

__all__ = ["OFFSET_ENTRY_SIZE", "OffsetIndex", "TIME_ENTRY_SIZE", "TimeIndex"]

OFFSET_ENTRY_SIZE = 8
TIME_ENTRY_SIZE = 12
_BIG_ENDIAN = sys.byteorder == "big"


class _TimeEntryPacker:
    """Packs (timestamp int64, relative offset int32) pairs big-endian in one struct call."""

    def pack_many(self, timestamps: array, relative: array) -> bytes:
        flat: list[int] = [0] * (2 * len(timestamps))
        flat[0::2] = timestamps
        flat[1::2] = relative
        return struct.pack(">" + "qi" * len(timestamps), *flat)


_TIME_ENTRY = _TimeEntryPacker()


def _to_big_endian(values: array) -> bytes:
    if _BIG_ENDIAN:
        return values.tobytes()
    swapped = array(values.typecode, values)
    swapped.byteswap()
    return swapped.tobytes()


def _from_big_endian(typecode: str, data: bytes) -> array:
    values = array(typecode)
    values.frombytes(data)
    if not _BIG_ENDIAN:
        values.byteswap()
    return values


class OffsetIndex:
    __slots__ = ("base_offset", "max_entries", "_relative", "_positions")

    def __init__(self, base_offset: int, max_index_bytes: int) -> None:
        self.base_offset = base_offset
        self.max_entries = max(1, max_index_bytes // OFFSET_ENTRY_SIZE)
        self._relative = array("i")
        self._positions = array("i")

    def __len__(self) -> int:
        return len(self._relative)

    @property
    def is_full(self) -> bool:
        return len(self._relative) >= self.max_entries

    @property
    def last_entry(self) -> tuple[int, int]:
        """(offset, position) of the last entry, or (base offset, 0) when empty."""
        if not self._relative:
            return self.base_offset, 0
        return self.base_offset + self._relative[-1], self._positions[-1]

    def entries(self) -> list[tuple[int, int]]:
        return [(self.base_offset + r, p) for r, p in zip(self._relative, self._positions, strict=True)]

    def append(self, offset: int, position: int) -> None:
        relative = offset - self.base_offset
        if self._relative and (relative <= self._relative[-1] or position <= self._positions[-1]):
            return  # only strictly increasing entries: a repeat adds nothing
        self._relative.append(relative)
        self._positions.append(position)

    def lookup(self, offset: int) -> tuple[int, int]:
        """The entry with the largest offset <= `offset`; (base offset, 0) when there is none."""
        i = bisect.bisect_right(self._relative, offset - self.base_offset) - 1
        if i < 0:
            return self.base_offset, 0
        return self.base_offset + self._relative[i], self._positions[i]

    def position_below(self, position: int) -> int:
        """The largest entry position < `position` (a batch start), or 0 when there is none."""
        i = bisect.bisect_left(self._positions, position) - 1
        return self._positions[i] if i >= 0 else 0

    def truncate_to(self, offset: int) -> None:
        """Remove entries for offsets >= `offset`."""
        i = bisect.bisect_left(self._relative, offset - self.base_offset)
        del self._relative[i:]
        del self._positions[i:]

    def truncate_to_position(self, position: int) -> None:
        """Remove entries pointing at or past `position`."""
        i = bisect.bisect_left(self._positions, position)
        del self._relative[i:]
        del self._positions[i:]

    def reset(self) -> None:
        del self._relative[:]
        del self._positions[:]

    def to_bytes(self, start: int = 0) -> bytes:
        """The file bytes of entries[start:]."""
        relative = self._relative[start:]
        interleaved = array("i", bytes(8 * len(relative)))
        interleaved[0::2] = relative
        interleaved[1::2] = self._positions[start:]
        return _to_big_endian(interleaved)

    def load_bytes(self, data: bytes, segment_size: int) -> None:
        """Load a file's content; CorruptIndexError unless its entries increase and point
        inside the segment. Trailing zero entries (Kafka's preallocation) are ignored."""
        if len(data) % OFFSET_ENTRY_SIZE:
            raise CorruptIndexError(
                f"offset index size {len(data)} is not a multiple of {OFFSET_ENTRY_SIZE}"
            )
        values = _from_big_endian("i", data)
        relative, positions = values[0::2], values[1::2]
        count = len(relative)
        while count > 1 and relative[count - 1] == 0 and positions[count - 1] == 0:
            count -= 1
        if count == 1 and relative[0] == 0 and positions[0] == 0:
            count = 0  # a single zero entry is preallocation too: no batch lives at position 0
        del relative[count:]
        del positions[count:]
        for i in range(count):
            if relative[i] < 0 or positions[i] < 0 or positions[i] >= max(segment_size, 1):
                raise CorruptIndexError(f"offset index entry {i} points outside the segment")
            if i and (relative[i] <= relative[i - 1] or positions[i] <= positions[i - 1]):
                raise CorruptIndexError(f"offset index entry {i} does not increase")
        self._relative = relative
        self._positions = positions


class TimeIndex:
    __slots__ = ("base_offset", "max_entries", "_timestamps", "_relative")

    def __init__(self, base_offset: int, max_index_bytes: int) -> None:
        self.base_offset = base_offset
        self.max_entries = max(1, max_index_bytes // TIME_ENTRY_SIZE)
        self._timestamps = array("q")
        self._relative = array("i")

    def __len__(self) -> int:
        return len(self._timestamps)

    @property
    def is_full(self) -> bool:
        return len(self._timestamps) >= self.max_entries

    @property
    def last_entry(self) -> tuple[int, int]:
        """(timestamp, offset) of the last entry, or (-1, base offset) when empty."""
        if not self._timestamps:
            return -1, self.base_offset
        return self._timestamps[-1], self.base_offset + self._relative[-1]

    def entries(self) -> list[tuple[int, int]]:
        return [
            (t, self.base_offset + r) for t, r in zip(self._timestamps, self._relative, strict=True)
        ]

    def maybe_append(self, timestamp: int, offset: int) -> None:
        relative = offset - self.base_offset
        if self._timestamps and (
            timestamp <= self._timestamps[-1] or relative <= self._relative[-1]
        ):
            return
        if timestamp < 0:
            return
        self._timestamps.append(timestamp)
        self._relative.append(relative)

    def lookup(self, timestamp: int) -> tuple[int, int]:
        """The entry with the largest timestamp <= `timestamp`; (-1, base offset) if none."""
        i = bisect.bisect_right(self._timestamps, timestamp) - 1
        if i < 0:
            return -1, self.base_offset
        return self._timestamps[i], self.base_offset + self._relative[i]

    def truncate_to(self, offset: int) -> None:
        """Remove entries for offsets >= `offset`."""
        i = bisect.bisect_left(self._relative, offset - self.base_offset)
        del self._timestamps[i:]
        del self._relative[i:]

    def reset(self) -> None:
        del self._timestamps[:]
        del self._relative[:]

    def to_bytes(self, start: int = 0) -> bytes:
        """The file bytes of entries[start:]."""
        count = len(self._timestamps) - start
        if count <= 0:
            return b""
        return _TIME_ENTRY.pack_many(self._timestamps[start:], self._relative[start:])

    def load_bytes(self, data: bytes, max_relative_offset: int) -> None:
        if len(data) % TIME_ENTRY_SIZE:
            raise CorruptIndexError(
                f"time index size {len(data)} is not a multiple of {TIME_ENTRY_SIZE}"
            )
        count = len(data) // TIME_ENTRY_SIZE
        pairs = list(struct.iter_unpack(">qi", data))
        timestamps = array("q", [p[0] for p in pairs])
        relative = array("i", [p[1] for p in pairs])
        while count and timestamps[count - 1] == 0 and relative[count - 1] == 0:
            count -= 1
        del timestamps[count:]
        del relative[count:]
        for i in range(count):
            if relative[i] < 0 or relative[i] > max_relative_offset or timestamps[i] < 0:
                raise CorruptIndexError(f"time index entry {i} points outside the segment")
            if i and (timestamps[i] <= timestamps[i - 1] or relative[i] <= relative[i - 1]):
                raise CorruptIndexError(f"time index entry {i} does not increase")
        self._timestamps = timestamps
        self._relative = relative
