"""The transactions of one partition's log: which are ongoing, the first unstable offset, and
what a COMMIT/ABORT marker completes (the transactional part of Kafka's ProducerStateManager and
ProducerAppendInfo, KIP-98).

A producer's first transactional batch begins its transaction (at that batch's base offset); the
control batch holding its COMMIT or ABORT marker completes it. A completed transaction stays
*unreplicated* until the high watermark passes its marker, so the last stable offset

    LSO = min(first offset of any ongoing or unreplicated transaction, HW)

never lets a READ_COMMITTED consumer read a transaction whose marker could still be truncated
away. An aborted transaction gets an `AbortedTxn` entry in the `.txnindex` of the segment that
holds its marker, with the LSO right after the abort (Kafka's `lastStableOffset(completedTxn)`:
the first offset of the earliest other ongoing transaction, else the marker's offset + 1).

On the leader (`origin` CLIENT or COORDINATOR) batches are validated before anything is written,
with the transactional rules of Kafka's ProducerAppendInfo over the producer state manager's
entries (storage/producer_state_manager.py checks data batches' epochs and sequences): a
non-transactional batch while the producer has a transaction open (INVALID_TXN_STATE), a marker
with an older producer epoch (INVALID_PRODUCER_EPOCH) or from an older coordinator epoch
(TRANSACTION_COORDINATOR_FENCED), a control batch from a client (INVALID_RECORD). Replicated
batches are applied unchecked.

The ongoing transactions are rebuilt from the producer state (its entries' open transactions,
from the latest snapshot and the log after it), as Kafka's loadFromSnapshot; a completed
transaction whose marker is not yet below the HW is then forgotten (as in Kafka).
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from tidelog.protocol.records.batch import (
    CONTROL_FLAG_MASK,
    TRANSACTIONAL_FLAG_MASK,
    CorruptRecordError,
    RecordBatch,
)
from tidelog.protocol.records.decoder import (
    ControlRecordType,
    decode_records,
    parse_end_transaction_marker,
)
from tidelog.storage.errors import StorageError
from tidelog.storage.transaction_index import AbortedTxn

__all__ = [
    "AbortedRanges",
    "AppendOrigin",
    "CompletedTxn",
    "InvalidProducerEpochError",
    "InvalidRecordError",
    "InvalidTxnStateError",
    "ProducerTxnFields",
    "TransactionCoordinatorFencedError",
    "TransactionTracker",
    "TxnBatch",
    "txn_batch_of",
]

TXN_OR_CONTROL = TRANSACTIONAL_FLAG_MASK | CONTROL_FLAG_MASK


class AppendOrigin(Enum):
    """Who appends (Kafka's AppendOrigin): what is validated depends on it."""

    CLIENT = "client"
    COORDINATOR = "coordinator"
    REPLICATION = "replication"


class InvalidProducerEpochError(StorageError):
    error_code = 47  # INVALID_PRODUCER_EPOCH


class InvalidTxnStateError(StorageError):
    error_code = 48  # INVALID_TXN_STATE


class TransactionCoordinatorFencedError(StorageError):
    error_code = 52  # TRANSACTION_COORDINATOR_FENCED


class InvalidRecordError(StorageError):
    error_code = 87  # INVALID_RECORD


@dataclass(frozen=True, slots=True)
class CompletedTxn:
    producer_id: int
    first_offset: int
    last_offset: int  # the marker's offset
    is_aborted: bool


@dataclass(frozen=True, slots=True)
class TxnBatch:
    """What the transaction state needs of one batch with a producer id."""

    producer_id: int
    producer_epoch: int
    base_offset: int
    last_offset: int
    is_transactional: bool
    # control batches: (is ABORT, coordinator epoch) of the marker; None for data batches
    marker: tuple[bool, int] | None = None


def txn_batch_of(batch: RecordBatch, base_offset: int | None = None) -> TxnBatch | None:
    """The TxnBatch of `batch` (at `base_offset`, default its own), or None when it has no
    producer id or is a control batch holding no end-transaction marker (cleaned, or another
    control type)."""
    pid = batch.producer_id
    if pid < 0:
        return None
    base = batch.base_offset if base_offset is None else base_offset
    attributes = batch.attributes
    marker = None
    if attributes & CONTROL_FLAG_MASK:
        records = decode_records(batch, verify_crc=False)
        if not records:
            return None  # every record cleaned away: nothing to complete
        record = records[0]
        try:
            end = parse_end_transaction_marker(record)
        except CorruptRecordError:
            return None  # another control type (e.g. LEADER_CHANGE): no transaction
        marker = (end.control_type == ControlRecordType.ABORT, end.coordinator_epoch)
    return TxnBatch(pid, batch.producer_epoch, base, base + batch.last_offset_delta,
                    bool(attributes & TRANSACTIONAL_FLAG_MASK), marker)


class ProducerTxnFields(Protocol):
    """What validation reads of a producer's state (the producer state manager's entry)."""

    producer_epoch: int
    coordinator_epoch: int
    current_txn_first_offset: int | None


@dataclass(slots=True)
class _Overlay:
    producer_epoch: int = -1
    coordinator_epoch: int = -1
    current_txn_first_offset: int | None = None


class TransactionTracker:
    """Ongoing and unreplicated transactions of one log (Kafka's ongoingTxns and
    unreplicatedTxns); the producers' epochs and open transactions themselves are the producer
    state manager's entries, which `validate` reads."""

    def __init__(self) -> None:
        # producer id -> first offset of its open transaction
        self.ongoing: dict[int, int] = {}
        # completed transactions whose marker is not yet below the HW, in marker order (they
        # leave from the front as the HW moves)
        self.unreplicated: deque[CompletedTxn] = deque()
        # the earliest first offset among them: a monotonic queue (each entry's first offset
        # is smaller than every later one's), so appends and removals stay O(1) amortized
        self._unreplicated_min: deque[CompletedTxn] = deque()
        # the largest marker offset of a completed transaction forgotten (HW passed it): a
        # truncation at or below it cannot be undone from memory
        self.forgotten_up_to = -1
        self._first_unstable: int | None = None

    # -- views -------------------------------------------------------------------------------
    @property
    def first_unstable_offset(self) -> int | None:
        return self._first_unstable

    def _update_first_unstable(self) -> None:
        first = min(self.ongoing.values()) if self.ongoing else None
        if self._unreplicated_min:
            earliest = self._unreplicated_min[0].first_offset
            first = earliest if first is None else min(first, earliest)
        self._first_unstable = first

    def _push_unreplicated(self, txn: CompletedTxn) -> None:
        self.unreplicated.append(txn)
        mins = self._unreplicated_min
        while mins and mins[-1].first_offset >= txn.first_offset:
            mins.pop()
        mins.append(txn)

    def last_stable_offset_after(self, completed: CompletedTxn) -> int:
        """The LSO right after `completed` (Kafka's lastStableOffset(completedTxn)), for its
        aborted-transaction entry: the first offset of the earliest transaction still open by
        another producer, else the marker's offset + 1."""
        others = [first for pid, first in self.ongoing.items() if pid != completed.producer_id]
        return min(others) if others else completed.last_offset + 1

    def seed(self, ongoing: Mapping[int, int]) -> None:
        """Start over from the open transactions of a producer state (Kafka's
        loadFromSnapshot): nothing is unreplicated."""
        self.clear()
        self.ongoing = dict(ongoing)
        self._update_first_unstable()

    # -- appends -----------------------------------------------------------------------------
    def validate(
        self,
        batches: Iterable[TxnBatch],
        origin: AppendOrigin,
        producer: Callable[[int], ProducerTxnFields | None],
    ) -> None:
        """Check leader appends before anything is written (`producer(pid)`: its current state,
        or None); the batches of one append are checked in order, each against the state the
        earlier ones leave. Data batches' epochs and sequences are the producer state
        manager's to check."""
        if origin is AppendOrigin.REPLICATION:
            return
        overlay: dict[int, _Overlay] = {}
        for b in batches:
            state = overlay.get(b.producer_id)
            if state is None:
                known = producer(b.producer_id)
                state = overlay[b.producer_id] = (
                    _Overlay() if known is None
                    else _Overlay(known.producer_epoch, known.coordinator_epoch,
                                  known.current_txn_first_offset))
            self._check(state, b, origin)

    @staticmethod
    def _check(state: _Overlay, b: TxnBatch, origin: AppendOrigin) -> None:
        if b.marker is None:
            if state.current_txn_first_offset is not None and not b.is_transactional:
                raise InvalidTxnStateError(
                    f"expected a transactional write from producer {b.producer_id} at offset "
                    f"{b.base_offset}"
                )
            if state.current_txn_first_offset is None and b.is_transactional:
                state.current_txn_first_offset = b.base_offset
            state.producer_epoch = max(state.producer_epoch, b.producer_epoch)
            return
        if origin is AppendOrigin.CLIENT:
            raise InvalidRecordError(
                f"clients may not write control records (producer {b.producer_id} at offset "
                f"{b.base_offset})"
            )
        if b.producer_epoch < state.producer_epoch:
            raise InvalidProducerEpochError(
                f"epoch of producer {b.producer_id} at offset {b.base_offset} is "
                f"{b.producer_epoch}, older than the last seen epoch {state.producer_epoch}"
            )
        _, coordinator_epoch = b.marker
        if coordinator_epoch < state.coordinator_epoch:
            raise TransactionCoordinatorFencedError(
                f"invalid coordinator epoch for producer {b.producer_id} at offset "
                f"{b.base_offset}: {coordinator_epoch} (zombie), {state.coordinator_epoch} "
                "(current)"
            )
        state.producer_epoch = b.producer_epoch
        state.coordinator_epoch = coordinator_epoch
        state.current_txn_first_offset = None

    def append(
        self, batches: Iterable[TxnBatch], high_watermark: int
    ) -> list[tuple[CompletedTxn, int]]:
        """Apply batches that are now in the log. Returns the transactions their markers
        completed, in order, each with the LSO right after it (for the aborted ones'
        `.txnindex` entries). A marker closing no transaction (an empty one) completes none."""
        completed: list[tuple[CompletedTxn, int]] = []
        changed = False
        for b in batches:
            if b.marker is not None:
                first = self.ongoing.pop(b.producer_id, None)
                if first is not None:
                    done = CompletedTxn(b.producer_id, first, b.base_offset, b.marker[0])
                    completed.append((done, self.last_stable_offset_after(done)))
                    self._complete(done, high_watermark)
                    changed = True
            elif b.is_transactional and b.producer_id not in self.ongoing:
                self.ongoing[b.producer_id] = b.base_offset
                changed = True
        if changed:
            self._update_first_unstable()
        return completed

    def _complete(self, completed: CompletedTxn, high_watermark: int) -> None:
        """A completed transaction stays unstable until the HW passes its marker."""
        if completed.last_offset >= high_watermark:
            self._push_unreplicated(completed)
        else:
            self.forgotten_up_to = max(self.forgotten_up_to, completed.last_offset)

    def on_high_watermark_updated(self, high_watermark: int) -> None:
        """Forget completed transactions whose marker is now below the HW (Kafka's
        ProducerStateManager.onHighWatermarkUpdated)."""
        unreplicated = self.unreplicated
        if not unreplicated or unreplicated[0].last_offset >= high_watermark:
            return
        while unreplicated and unreplicated[0].last_offset < high_watermark:
            txn = unreplicated.popleft()
            self.forgotten_up_to = max(self.forgotten_up_to, txn.last_offset)
            if self._unreplicated_min and self._unreplicated_min[0] is txn:
                self._unreplicated_min.popleft()
        self._update_first_unstable()

    # -- truncation --------------------------------------------------------------------------
    def truncate(self, offset: int) -> bool:
        """The log was truncated to `offset`. Transactions begun at or after it go; those whose
        marker went are open again. Returns False when that cannot be known from memory (a
        completed transaction already forgotten may have had its marker there): the caller then
        seeds the state from the producer state."""
        if offset <= self.forgotten_up_to:
            return False
        self.ongoing = {pid: first for pid, first in self.ongoing.items() if first < offset}
        reopened = [t for t in self.unreplicated if t.last_offset >= offset]
        kept = [t for t in self.unreplicated if t.last_offset < offset]
        self.unreplicated = deque()
        self._unreplicated_min = deque()
        for txn in kept:
            self._push_unreplicated(txn)
        for txn in reopened:
            if txn.first_offset < offset:
                self.ongoing[txn.producer_id] = txn.first_offset
        self._update_first_unstable()
        return True

    def clear(self) -> None:
        self.ongoing = {}
        self.unreplicated = deque()
        self._unreplicated_min = deque()
        self.forgotten_up_to = -1
        self._first_unstable = None


class AbortedRanges:
    """Which batches belong to aborted transactions, from `.txnindex` entries: a batch of
    producer P at offset O is aborted when an entry of P has first_offset <= O < last_offset
    (its marker). The log cleaner keeps such records out of its offset map and drops them
    (Kafka's CleanedTransactionMetadata)."""

    def __init__(self, aborted: Iterable[AbortedTxn]) -> None:
        self._ranges: dict[int, list[tuple[int, int]]] = {}
        for txn in aborted:
            self._ranges.setdefault(txn.producer_id, []).append(
                (txn.first_offset, txn.last_offset))
        for ranges in self._ranges.values():
            ranges.sort()

    def __bool__(self) -> bool:
        return bool(self._ranges)

    def is_aborted(self, batch: RecordBatch) -> bool:
        ranges = self._ranges.get(batch.producer_id)
        if ranges is None or batch.is_control_batch:
            return False
        offset = batch.base_offset
        i = bisect.bisect_right(ranges, (offset, 2**63)) - 1
        return i >= 0 and ranges[i][0] <= offset < ranges[i][1]
