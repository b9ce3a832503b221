"""Idempotent-producer state of one partition (Kafka's `ProducerStateManager`, without
transactions).

For each producer id the leader remembers the producer epoch and the sequence numbers and
offsets of the last five batches it appended (Kafka's `ProducerStateEntry.NumBatchesToRetain`,
the same five in-flight requests a producer may have). Before an append, `check_batch` says
whether the batch is new, a duplicate of one of those five (answered with the original offsets,
not written twice), or out of order (OUT_OF_ORDER_SEQUENCE_NUMBER), or from a fenced epoch
(INVALID_PRODUCER_EPOCH). Kafka's rules (`ProducerAppendInfo.checkProducerEpoch` /
`checkSequence`):

- an epoch older than the one known is refused;
- a new epoch must start at sequence 0 (unless the producer is unknown: any sequence);
- within an epoch the first sequence must follow the last one (wrapping at 2^31-1), except for
  a producer whose state is unknown (expired or never seen), whose first batch is accepted.

The state is rebuilt from the batch headers of the log the first time a partition becomes a
leader in this process (`rebuild_from_log`; tidelog keeps no producer-state snapshots), and is
then maintained through role changes: a follower updates it from the batches it replicates
(`update_from_batches`) and drops what truncation removes (`truncate`), so a new leader answers
retries of batches the old leader wrote.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from tidelog.protocol.records.batch import RecordBatch

__all__ = [
    "NUM_BATCHES_TO_RETAIN",
    "BatchMetadata",
    "ProducerStateEntry",
    "ProducerStateManager",
    "SequenceCheck",
    "batch_producer_info",
]

NUM_BATCHES_TO_RETAIN = 5
INT_MAX = 2**31 - 1
NO_PRODUCER_EPOCH = -1


class SequenceCheck(Enum):
    OK = "ok"
    DUPLICATE = "duplicate"
    OUT_OF_ORDER = "out_of_order"
    INVALID_EPOCH = "invalid_epoch"


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int
    timestamp: int


@dataclass(slots=True)
class ProducerStateEntry:
    producer_id: int
    producer_epoch: int = NO_PRODUCER_EPOCH
    batches: deque[BatchMetadata] = field(default_factory=lambda: deque(maxlen=NUM_BATCHES_TO_RETAIN))
    last_timestamp: int = -1

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else -1

    def find_duplicate(self, first_seq: int, last_seq: int) -> BatchMetadata | None:
        for b in self.batches:
            if b.first_seq == first_seq and b.last_seq == last_seq:
                return b
        return None


def _in_sequence(last_seq: int, next_seq: int) -> bool:
    return next_seq == last_seq + 1 or (next_seq == 0 and last_seq == INT_MAX)


def _last_seq(base_seq: int, last_offset_delta: int) -> int:
    # Sequences wrap at Int.MaxValue (Kafka's DefaultRecordBatch.incrementSequence).
    if base_seq > INT_MAX - last_offset_delta:
        return base_seq + last_offset_delta - INT_MAX - 1
    return base_seq + last_offset_delta


@dataclass(frozen=True, slots=True)
class ProducerBatchInfo:
    producer_id: int
    producer_epoch: int
    first_seq: int
    last_seq: int
    last_offset_delta: int
    max_timestamp: int


def batch_producer_info(records: bytes | memoryview | Any) -> ProducerBatchInfo | None:
    """The producer fields of a single batch's header, or None when it has no producer id."""
    if len(records) < 61:
        return None
    b = RecordBatch(memoryview(records) if not isinstance(records, memoryview) else records)
    if b.producer_id < 0:
        return None
    return ProducerBatchInfo(
        b.producer_id, b.producer_epoch, b.base_sequence,
        _last_seq(b.base_sequence, b.last_offset_delta), b.last_offset_delta, b.max_timestamp,
    )


class ProducerStateManager:
    """The producers of one partition."""

    def __init__(self) -> None:
        self.producers: dict[int, ProducerStateEntry] = {}

    def __len__(self) -> int:
        return len(self.producers)

    def check_batch(self, info: ProducerBatchInfo) -> tuple[SequenceCheck, BatchMetadata | None]:
        entry = self.producers.get(info.producer_id)
        if entry is None or entry.producer_epoch == NO_PRODUCER_EPOCH:
            return SequenceCheck.OK, None
        if info.producer_epoch < entry.producer_epoch:
            return SequenceCheck.INVALID_EPOCH, None
        if info.producer_epoch > entry.producer_epoch:
            if info.first_seq != 0:
                return SequenceCheck.OUT_OF_ORDER, None
            return SequenceCheck.OK, None
        dup = entry.find_duplicate(info.first_seq, info.last_seq)
        if dup is not None:
            return SequenceCheck.DUPLICATE, dup
        if entry.batches and not _in_sequence(entry.last_seq, info.first_seq):
            return SequenceCheck.OUT_OF_ORDER, None
        return SequenceCheck.OK, None

    def update(self, info: ProducerBatchInfo, first_offset: int) -> None:
        """Record an appended batch (its first offset as written)."""
        entry = self.producers.get(info.producer_id)
        if entry is None:
            entry = self.producers[info.producer_id] = ProducerStateEntry(info.producer_id)
        if info.producer_epoch != entry.producer_epoch:
            entry.producer_epoch = info.producer_epoch
            entry.batches.clear()
        entry.batches.append(
            BatchMetadata(info.first_seq, info.last_seq, first_offset,
                          first_offset + info.last_offset_delta, info.max_timestamp)
        )
        entry.last_timestamp = max(entry.last_timestamp, info.max_timestamp)

    def rebuild_from_log(self, batches: Iterable[RecordBatch]) -> int:
        """Replace the state with what the log's batch headers say; returns batches seen."""
        self.producers.clear()
        n = 0
        for b in batches:
            n += 1
            if b.producer_id < 0 or b.is_control_batch:
                continue
            info = ProducerBatchInfo(
                b.producer_id, b.producer_epoch, b.base_sequence,
                _last_seq(b.base_sequence, b.last_offset_delta), b.last_offset_delta,
                b.max_timestamp,
            )
            self.update(info, b.base_offset)
        return n

    def update_from_batches(
        self, batches: Iterable[RecordBatch], first_offset: int, last_offset: int
    ) -> None:
        """Record batches appended as a follower (they carry the leader's offsets) whose offsets
        lie in [first_offset, last_offset]."""
        for b in batches:
            if b.base_offset > last_offset:
                break
            if b.base_offset < first_offset or b.producer_id < 0 or b.is_control_batch:
                continue
            self.update(ProducerBatchInfo(
                b.producer_id, b.producer_epoch, b.base_sequence,
                _last_seq(b.base_sequence, b.last_offset_delta), b.last_offset_delta,
                b.max_timestamp,
            ), b.base_offset)

    def truncate(self, offset: int) -> None:
        """The log was truncated to `offset`: forget batches at or above it (a producer left
        with none becomes unknown, whose next batch is accepted as Kafka does after expiry)."""
        for pid in list(self.producers):
            entry = self.producers[pid]
            kept = [b for b in entry.batches if b.last_offset < offset]
            if len(kept) == len(entry.batches):
                continue
            if not kept:
                del self.producers[pid]
                continue
            entry.batches.clear()
            entry.batches.extend(kept)

    def expire(self, now_ms: int, expiration_ms: int) -> int:
        """Drop producers idle for `producer.id.expiration.ms`; returns how many."""
        old = [pid for pid, e in self.producers.items()
               if e.last_timestamp >= 0 and now_ms - e.last_timestamp > expiration_ms]
        for pid in old:
            del self.producers[pid]
        return len(old)
