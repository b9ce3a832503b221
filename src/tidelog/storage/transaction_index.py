"""The aborted-transaction index of a segment (`.txnindex`), in Kafka's file format.

One 34-byte big-endian entry per transaction aborted by a marker in the segment (Kafka's
`AbortedTxn`): version int16 (0), producerId int64, firstOffset int64, lastOffset int64 (the
ABORT marker's offset) and lastStableOffset int64 (the LSO right after the abort). Entries are
in the order of their markers, so `last_offset` increases.

A READ_COMMITTED fetch asks the segments' indexes for the aborted transactions overlapping the
offsets it returns (`collect_aborted_txns`); the consumer drops those producers' records.
Each segment's index is truncated with it and rebuilt when the segment is recovered.

As in Kafka the file is created lazily, on the first aborted transaction of the segment: most
segments have none and keep no `.txnindex`. Entries are written to the file as they are
appended (Kafka writes through its channel) and made durable by `flush`.
"""

from __future__ import annotations

import bisect
import struct
from dataclasses import dataclass

from tidelog.storage.errors import CorruptIndexError
from tidelog.storage.file_io import FileHandle, FileIO

__all__ = [
    "ABORTED_TXN_SIZE",
    "TXN_INDEX_SUFFIX",
    "AbortedTxn",
    "TransactionIndex",
    "TxnIndexSearchResult",
]

TXN_INDEX_SUFFIX = ".txnindex"
_ENTRY = struct.Struct(">hqqqq")  # version, producerId, firstOffset, lastOffset, lastStableOffset
ABORTED_TXN_SIZE = _ENTRY.size  # 34
CURRENT_VERSION = 0


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int
    version: int = CURRENT_VERSION

    def to_bytes(self) -> bytes:
        return _ENTRY.pack(
            self.version, self.producer_id, self.first_offset, self.last_offset,
            self.last_stable_offset,
        )


@dataclass(frozen=True, slots=True)
class TxnIndexSearchResult:
    """The aborted transactions of one index overlapping a fetch range; `is_complete` when an
    entry's LSO reached the range's upper bound, so later segments cannot add any."""

    aborted_transactions: list[AbortedTxn]
    is_complete: bool


def parse_entries(data: bytes | memoryview, start_offset: int, path: str = "") -> list[AbortedTxn]:
    """The entries of a `.txnindex` file's bytes; CorruptIndexError for a torn entry, an
    unknown version, an entry before the segment (`start_offset`) or out of order."""
    if len(data) % ABORTED_TXN_SIZE:
        raise CorruptIndexError(
            f"transaction index {path} has {len(data)} bytes, not a multiple of "
            f"{ABORTED_TXN_SIZE}"
        )
    entries: list[AbortedTxn] = []
    last = -1
    for version, pid, first, last_offset, lso in _ENTRY.iter_unpack(data):
        if version != CURRENT_VERSION:
            raise CorruptIndexError(f"transaction index {path}: unknown entry version {version}")
        if last_offset < start_offset or last_offset <= last or first > last_offset:
            raise CorruptIndexError(
                f"transaction index {path}: entry (producer {pid}, {first}..{last_offset}) out "
                f"of order or before the segment's start offset {start_offset}"
            )
        last = last_offset
        entries.append(AbortedTxn(pid, first, last_offset, lso, version))
    return entries


class TransactionIndex:
    """The in-memory entries are the truth while the segment is open; each append also goes to
    the file at once."""

    __slots__ = ("file_io", "path", "start_offset", "entries", "_last_offsets", "_handle")

    def __init__(self, file_io: FileIO, path: str, start_offset: int) -> None:
        self.file_io = file_io
        self.path = path
        self.start_offset = start_offset
        self.entries: list[AbortedTxn] = []
        self._last_offsets: list[int] = []  # entries' markers, increasing: searched by bisect
        self._handle: FileHandle | None = None

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def last_offset(self) -> int | None:
        return self.entries[-1].last_offset if self.entries else None

    def _file(self) -> FileHandle:
        if self._handle is None:
            self._handle = self.file_io.open(self.path)
        return self._handle

    def load(self) -> None:
        """Read the file (absent: no entries). CorruptIndexError when it fails the sanity check
        (the caller then rebuilds it by recovering the segment)."""
        self.entries = []
        self._last_offsets = []
        if not self.file_io.exists(self.path):
            return
        handle = self._file()
        self.entries = parse_entries(bytes(handle.read(0, handle.size())), self.start_offset,
                                     self.path)
        self._last_offsets = [t.last_offset for t in self.entries]

    def append(self, txn: AbortedTxn) -> None:
        last = self.last_offset
        if last is not None and txn.last_offset <= last:
            raise ValueError(
                f"the last offset of an aborted transaction ({txn.last_offset}) must be larger "
                f"than the previous one ({last}) in {self.path}"
            )
        self._file().append(txn.to_bytes())
        self.entries.append(txn)
        self._last_offsets.append(txn.last_offset)

    def truncate_to(self, offset: int) -> None:
        """Drop the entries whose marker lies at or after `offset`."""
        keep = len(self.entries)
        while keep and self.entries[keep - 1].last_offset >= offset:
            keep -= 1
        if keep == len(self.entries):
            return
        del self.entries[keep:]
        del self._last_offsets[keep:]
        self._file().truncate(keep * ABORTED_TXN_SIZE)

    def reset(self) -> None:
        """Empty the index (a segment recovery rebuilds it)."""
        self.entries = []
        self._last_offsets = []
        if self._handle is not None or self.file_io.exists(self.path):
            self._file().truncate(0)

    def collect_aborted_txns(self, fetch_offset: int, upper_bound_offset: int) -> TxnIndexSearchResult:
        """Kafka's TransactionIndex.collectAbortedTxns: the entries overlapping
        [fetch_offset, upper_bound_offset), stopping at the first whose LSO reaches the bound.
        Entries whose marker is before the fetch are skipped by bisect (Kafka reads them all):
        their LSO is at most the fetch offset, so none of them could end the search."""
        found: list[AbortedTxn] = []
        start = bisect.bisect_left(self._last_offsets, fetch_offset)
        for txn in self.entries[start:] if start else self.entries:
            if txn.last_offset >= fetch_offset and txn.first_offset < upper_bound_offset:
                found.append(txn)
            if txn.last_stable_offset >= upper_bound_offset:
                return TxnIndexSearchResult(found, True)
        return TxnIndexSearchResult(found, False)

    def flush(self) -> None:
        if self._handle is not None:
            self._handle.flush()

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None

    def rename_to(self, path: str) -> None:
        """Follow the segment's rename (to `.deleted`): the file, when there is one, moves."""
        self.close()
        if self.file_io.exists(self.path):
            self.file_io.rename(self.path, path)
        self.path = path

    def delete(self) -> None:
        self.close()
        if self.file_io.exists(self.path):
            self.file_io.remove(self.path)
