"""LeaderEpochFileCache: the (leader epoch, start offset) history of a partition log.

Persisted in `leader-epoch-checkpoint` by the log's flush, not at every change: `flush_if_needed`
writes the file (temp, fsync, rename, dir fsync) before the log's recovery point moves past an
entry that differs from the file. Crash safety: below the recovery point the file matches the
log's batches; past it the log's load drops the file's entries and takes the epochs of the
recovered batches instead (storage/log.py `_load`). An entry at or past the log end (a new
leader's epoch, KIP-279, before it appends) never needs the disk: the next load drops it.
Kafka 3.9 fsyncs the file on every assign; here a broker moving thousands of leaderships
would pay one fsync (~12 ms on this machine) per partition on its event loop.
Followers answer the KIP-101/KIP-279 truncation question with `end_offset_for`: for a requested
epoch, the largest epoch <= it that this log knows and the offset where the next epoch starts
(or the LEO for the latest epoch).
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Callable

from tidelog.storage.checkpoint import CheckpointFile
from tidelog.storage.file_io import FileIO

__all__ = ["EpochEntry", "LEADER_EPOCH_CHECKPOINT", "LeaderEpochFileCache", "UNDEFINED_EPOCH",
           "UNDEFINED_EPOCH_OFFSET"]

LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"
UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1

EpochEntry = tuple[int, int]  # (epoch, start_offset)


def _format(entry: EpochEntry) -> str:
    return f"{entry[0]} {entry[1]}"


def _parse(parts: list[str]) -> EpochEntry:
    if len(parts) != 2:
        raise ValueError("expected: epoch start_offset")
    epoch, start = int(parts[0]), int(parts[1])
    if epoch < 0 or start < 0:
        raise ValueError("negative epoch or offset")
    return epoch, start


class LeaderEpochFileCache:
    """Epochs strictly increasing with non-decreasing start offsets; `log_end_offset` is asked
    of the log when the latest epoch's end is needed."""

    def __init__(
        self,
        file_io: FileIO | None,
        dir: str,
        log_end_offset: Callable[[], int],
        entries: list[EpochEntry] | None = None,
    ) -> None:
        self._file = (
            CheckpointFile(file_io, os.path.join(dir, LEADER_EPOCH_CHECKPOINT), _format, _parse)
            if file_io is not None
            else None
        )
        self._log_end_offset = log_end_offset
        self._epochs: list[int] = []
        self._starts: list[int] = []
        # What the file holds (as read or last written); None when unknown (unreadable).
        self._persisted: list[EpochEntry] | None = []
        for epoch, start in entries or []:
            self._epochs.append(epoch)
            self._starts.append(start)

    # -- loading ---------------------------------------------------------------------------
    def load(self) -> None:
        """Read the checkpoint (KafkaStorageError when malformed). Entries that are not
        monotonic are dropped from the first offending one, as Kafka does on assign."""
        if self._file is None:
            return
        self._epochs.clear()
        self._starts.clear()
        self._persisted = None
        read = self._file.read()
        self._persisted = read
        for epoch, start in read:
            self._append_monotonic(epoch, start)

    def _append_monotonic(self, epoch: int, start: int) -> None:
        while self._epochs and (self._epochs[-1] >= epoch or self._starts[-1] > start):
            self._epochs.pop()
            self._starts.pop()
        self._epochs.append(epoch)
        self._starts.append(start)

    def flush(self) -> None:
        entries = list(zip(self._epochs, self._starts, strict=True))
        if self._file is not None:
            self._persisted = None  # a failed write leaves the file unknown
            self._file.write(entries)
        self._persisted = entries

    def needs_flush(self, end_offset: int) -> bool:
        """Whether the file differs from the cache in an entry starting below `end_offset`
        (the log end: entries from there on are dropped by the next load anyway)."""
        if self._persisted is None:
            return True
        on_disk = [e for e in self._persisted if e[1] < end_offset]
        cut = bisect.bisect_left(self._starts, end_offset)
        return on_disk != list(zip(self._epochs[:cut], self._starts[:cut], strict=True))

    def flush_if_needed(self, end_offset: int) -> bool:
        """Write the file when `needs_flush(end_offset)`; returns whether it wrote."""
        if not self.needs_flush(end_offset):
            return False
        self.flush()
        return True

    # -- queries ---------------------------------------------------------------------------
    @property
    def entries(self) -> list[EpochEntry]:
        return list(zip(self._epochs, self._starts, strict=True))

    @property
    def latest_epoch(self) -> int | None:
        return self._epochs[-1] if self._epochs else None

    @property
    def earliest_entry(self) -> EpochEntry | None:
        return (self._epochs[0], self._starts[0]) if self._epochs else None

    @property
    def latest_entry(self) -> EpochEntry | None:
        return (self._epochs[-1], self._starts[-1]) if self._epochs else None

    def __len__(self) -> int:
        return len(self._epochs)

    def end_offset_for(self, requested_epoch: int) -> tuple[int, int]:
        """Kafka's LeaderEpochFileCache.endOffsetFor (KIP-279): (epoch, end offset) where epoch is
        the largest known epoch <= requested and end offset is the start of the next known epoch
        (the LEO for the latest epoch). (-1, -1) when the requested epoch is undefined or newer
        than anything here; (requested, first start offset) when older than every entry."""
        if requested_epoch == UNDEFINED_EPOCH or not self._epochs:
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        if requested_epoch == self._epochs[-1]:
            return requested_epoch, self._log_end_offset()
        higher = bisect.bisect_right(self._epochs, requested_epoch)
        if higher == len(self._epochs):
            # Newer than our latest epoch: Kafka answers UNDEFINED so the follower keeps asking.
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        if higher == 0:
            return requested_epoch, self._starts[0]
        return self._epochs[higher - 1], self._starts[higher]

    def epoch_for_offset(self, offset: int) -> int | None:
        """The epoch whose range holds `offset`, if any."""
        index = bisect.bisect_right(self._starts, offset) - 1
        return self._epochs[index] if index >= 0 else None

    # -- updates ---------------------------------------------------------------------------
    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that `epoch` starts at `start_offset` (Kafka's assign). Entries with an epoch
        >= it or a start offset >= it are removed first: they describe a history the log no
        longer has (a follower's data is the truth). Returns whether the cache changed. In
        memory only: the log's flush writes the file (see the module's doc)."""
        if epoch < 0 or start_offset < 0:
            return False
        if self._epochs and epoch == self._epochs[-1] and start_offset >= self._starts[-1]:
            return False
        while self._epochs and (self._epochs[-1] >= epoch or self._starts[-1] >= start_offset):
            self._epochs.pop()
            self._starts.pop()
        self._epochs.append(epoch)
        self._starts.append(start_offset)
        return True

    def truncate_from_end(self, end_offset: int) -> None:
        """Drop the entries starting at or after `end_offset` (the log was truncated there).
        In memory only, as Kafka's truncateFromEndAsyncFlush: the file's extra entries start
        at or past the log end, where the next load drops them again, until the log's flush
        writes the file before data lands past them (`needs_flush`)."""
        if end_offset < 0 or not self._starts or self._starts[-1] < end_offset:
            return
        cut = bisect.bisect_left(self._starts, end_offset)
        del self._epochs[cut:]
        del self._starts[cut:]

    def truncate_from_start(self, start_offset: int) -> None:
        """The log now starts at `start_offset`: drop the epochs wholly before it and move the
        start of the epoch that covers it up to it. In memory only (Kafka's
        truncateFromStartAsyncFlush): the load truncates the file's entries the same way from
        the checkpointed log start offset."""
        if not self._starts or self._starts[0] >= start_offset:
            return
        covering = bisect.bisect_right(self._starts, start_offset) - 1
        del self._epochs[:covering]
        del self._starts[:covering]
        self._starts[0] = start_offset

    def clear_and_flush(self) -> None:
        self._epochs.clear()
        self._starts.clear()
        self.flush()

    def rebuild(self, batch_epochs: list[EpochEntry]) -> None:
        """Replace the history with the (epoch, base offset) of the log's batches, in order."""
        self._epochs.clear()
        self._starts.clear()
        for epoch, start in batch_epochs:
            if epoch < 0:
                continue
            if self._epochs and epoch <= self._epochs[-1]:
                continue
            self._append_monotonic(epoch, start)
        self.flush()
