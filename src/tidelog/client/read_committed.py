"""The consumer's side of READ_COMMITTED (KIP-98), as Kafka's Fetcher does it for one
partition's fetch answer: the broker returns records up to the last stable offset plus the
aborted transactions (producer id, first offset) overlapping them; the reader drops control
batches and the batches of a producer whose aborted transaction began at or before the batch,
until that producer's ABORT marker."""

from __future__ import annotations

import heapq
from collections.abc import Iterable

from tidelog.protocol.records.batch import RecordBatch
from tidelog.protocol.records.decoder import (
    ControlRecordType,
    decode_records,
    parse_control_record,
)

__all__ = ["AbortedTransactions"]


class AbortedTransactions:
    """The filter for one fetch answer; `skip` is asked about every batch, in offset order."""

    __slots__ = ("_queue", "_aborted_producers")

    def __init__(self, aborted: Iterable[tuple[int, int]] | None) -> None:
        self._queue = [(first, pid) for pid, first in aborted or ()]
        heapq.heapify(self._queue)
        self._aborted_producers: set[int] = set()

    def skip(self, batch: RecordBatch) -> bool:
        """Whether a read_committed reader drops `batch`: a control batch, or a transactional
        batch of an aborted transaction."""
        if batch.producer_id >= 0:
            queue = self._queue
            while queue and queue[0][0] <= batch.last_offset:
                self._aborted_producers.add(heapq.heappop(queue)[1])
            if batch.is_control_batch:
                records = decode_records(batch)
                if records and parse_control_record(records[0].key)[1] == ControlRecordType.ABORT:
                    self._aborted_producers.discard(batch.producer_id)
            elif batch.is_transactional and batch.producer_id in self._aborted_producers:
                return True
        return batch.is_control_batch
