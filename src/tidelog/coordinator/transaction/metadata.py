"""A transactional id's state machine (Kafka's `TransactionMetadata` and `TxnTransitMetadata`).

Pure: no clock, no I/O. A change is prepared (`prepare_*` returns the `TxnTransitMetadata` to
write to `__transaction_state` and marks the metadata `pending_state`), and applied with
`complete_transition_to` once the write is acknowledged; a failed write drops the pending state
(`abort_pending`). While a transition is pending, requests for the id get
CONCURRENT_TRANSACTIONS.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

from tidelog.replication.types import TopicPartition

__all__ = [
    "NO_PRODUCER_EPOCH",
    "NO_PRODUCER_ID",
    "IllegalTransitionError",
    "TransactionMetadata",
    "TransactionState",
    "TxnTransitMetadata",
]

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
SHORT_MAX = 2**15 - 1


class TransactionState(IntEnum):
    """Kafka's states with the byte each is stored as in `__transaction_state`."""

    EMPTY = 0
    ONGOING = 1
    PREPARE_COMMIT = 2
    PREPARE_ABORT = 3
    COMPLETE_COMMIT = 4
    COMPLETE_ABORT = 5
    DEAD = 6
    PREPARE_EPOCH_FENCE = 7  # in memory only: written as PREPARE_ABORT

    @property
    def kafka_name(self) -> str:
        """The name DescribeTransactions and ListTransactions use."""
        return _NAMES[self]

    @classmethod
    def from_kafka_name(cls, name: str) -> TransactionState | None:
        return _BY_NAME.get(name)


_NAMES = {
    TransactionState.EMPTY: "Empty",
    TransactionState.ONGOING: "Ongoing",
    TransactionState.PREPARE_COMMIT: "PrepareCommit",
    TransactionState.PREPARE_ABORT: "PrepareAbort",
    TransactionState.COMPLETE_COMMIT: "CompleteCommit",
    TransactionState.COMPLETE_ABORT: "CompleteAbort",
    TransactionState.DEAD: "Dead",
    TransactionState.PREPARE_EPOCH_FENCE: "PrepareEpochFence",
}
_BY_NAME = {v: k for k, v in _NAMES.items()}

S = TransactionState
# Kafka's TransactionState.validPreviousStates.
VALID_PREVIOUS_STATES: dict[TransactionState, frozenset[TransactionState]] = {
    S.EMPTY: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.ONGOING: frozenset({S.ONGOING, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.PREPARE_COMMIT: frozenset({S.ONGOING}),
    S.PREPARE_ABORT: frozenset({S.ONGOING, S.PREPARE_EPOCH_FENCE}),
    S.COMPLETE_COMMIT: frozenset({S.PREPARE_COMMIT}),
    S.COMPLETE_ABORT: frozenset({S.PREPARE_ABORT}),
    S.DEAD: frozenset({S.EMPTY, S.COMPLETE_ABORT, S.COMPLETE_COMMIT}),
    S.PREPARE_EPOCH_FENCE: frozenset({S.ONGOING}),
}


class IllegalTransitionError(Exception):
    """A transition Kafka's coordinator treats as a bug (it throws IllegalStateException)."""


@dataclass(frozen=True, slots=True)
class TxnTransitMetadata:
    """What one write to `__transaction_state` says about a transactional id."""

    producer_id: int
    last_producer_id: int
    producer_epoch: int
    last_producer_epoch: int
    txn_timeout_ms: int
    txn_state: TransactionState
    topic_partitions: frozenset[TopicPartition]
    txn_start_timestamp: int
    txn_last_update_timestamp: int


def is_epoch_exhausted(epoch: int) -> bool:
    """Kafka keeps one epoch in reserve for fencing (`TransactionMetadata.isEpochExhausted`)."""
    return epoch >= SHORT_MAX - 1


@dataclass(slots=True)
class TransactionMetadata:
    transactional_id: str
    producer_id: int
    last_producer_id: int
    producer_epoch: int
    last_producer_epoch: int
    txn_timeout_ms: int
    state: TransactionState
    topic_partitions: set[TopicPartition] = field(default_factory=set)
    txn_start_timestamp: int = -1
    txn_last_update_timestamp: int = -1
    pending_state: TransactionState | None = None
    # An epoch fence whose write failed: the next fence reuses the epoch (never handed out).
    has_failed_epoch_fence: bool = False

    # ------------------------------------------------------------------ queries
    @property
    def pending_transition_in_progress(self) -> bool:
        return self.pending_state is not None

    @property
    def is_producer_epoch_exhausted(self) -> bool:
        return is_epoch_exhausted(self.producer_epoch)

    @property
    def has_pending_transaction(self) -> bool:
        return self.state in (S.ONGOING, S.PREPARE_ABORT, S.PREPARE_COMMIT)

    def transit(self) -> TxnTransitMetadata:
        """The metadata as it stands (what a re-sent marker completes from)."""
        return TxnTransitMetadata(
            self.producer_id, self.last_producer_id, self.producer_epoch,
            self.last_producer_epoch, self.txn_timeout_ms, self.state,
            frozenset(self.topic_partitions), self.txn_start_timestamp,
            self.txn_last_update_timestamp)

    # ------------------------------------------------------------------ prepare
    def _prepare(self, new_state: TransactionState, producer_id: int, producer_epoch: int,
                 last_producer_epoch: int, txn_timeout_ms: int,
                 partitions: frozenset[TopicPartition], start_ms: int, update_ms: int
                 ) -> TxnTransitMetadata:
        if self.pending_state is not None:
            raise IllegalTransitionError(
                f"{self.transactional_id}: preparing {new_state.kafka_name} while "
                f"{self.pending_state.kafka_name} is pending")
        if self.state not in VALID_PREVIOUS_STATES[new_state]:
            raise IllegalTransitionError(
                f"{self.transactional_id}: {self.state.kafka_name} -> {new_state.kafka_name}")
        if not 0 <= producer_epoch <= SHORT_MAX:
            raise IllegalTransitionError(f"illegal producer epoch {producer_epoch}")
        self.pending_state = new_state
        return TxnTransitMetadata(producer_id, self.producer_id, producer_epoch,
                                  last_producer_epoch, txn_timeout_ms, new_state, partitions,
                                  start_ms, update_ms)

    def prepare_no_transit(self) -> TxnTransitMetadata:
        """The same state again (a no-op AddPartitions) without a pending state."""
        return self.transit()

    def prepare_fence_producer_epoch(self) -> TxnTransitMetadata:
        """InitProducerId while a transaction is Ongoing: bump the epoch (once, even when the
        previous fence's write failed) so the ongoing transaction is aborted under it."""
        if self.producer_epoch == SHORT_MAX:
            raise IllegalTransitionError("cannot fence a producer at epoch Short.MaxValue")
        bumped = self.producer_epoch if self.has_failed_epoch_fence else self.producer_epoch + 1
        return self._prepare(S.PREPARE_EPOCH_FENCE, self.producer_id, bumped, NO_PRODUCER_EPOCH,
                             self.txn_timeout_ms, frozenset(self.topic_partitions),
                             self.txn_start_timestamp, self.txn_last_update_timestamp)

    def prepare_increment_producer_epoch(
        self, txn_timeout_ms: int, expected_epoch: int | None, now_ms: int
    ) -> TxnTransitMetadata | str:
        """InitProducerId on a completed or empty transaction (KIP-360 when `expected_epoch`
        is given). Returns the transit or "PRODUCER_FENCED"."""
        if self.is_producer_epoch_exhausted:
            raise IllegalTransitionError(f"no producer epoch left for {self.producer_id}")
        bumped = self.producer_epoch + 1
        if expected_epoch is None:
            epochs = (bumped, NO_PRODUCER_EPOCH)
        elif self.producer_epoch == NO_PRODUCER_EPOCH or expected_epoch == self.producer_epoch:
            epochs = (bumped, self.producer_epoch)
        elif expected_epoch == self.last_producer_epoch:
            # A retry of a bump whose answer was lost: hand out the same epoch again.
            epochs = (self.producer_epoch, self.last_producer_epoch)
        else:
            return "PRODUCER_FENCED"
        return self._prepare(S.EMPTY, self.producer_id, epochs[0], epochs[1], txn_timeout_ms,
                             frozenset(), -1, now_ms)

    def prepare_producer_id_rotation(self, new_producer_id: int, txn_timeout_ms: int,
                                     now_ms: int, record_last_epoch: bool) -> TxnTransitMetadata:
        if self.has_pending_transaction:
            raise IllegalTransitionError("cannot rotate producer ids during a transaction")
        return self._prepare(S.EMPTY, new_producer_id, 0,
                             self.producer_epoch if record_last_epoch else NO_PRODUCER_EPOCH,
                             txn_timeout_ms, frozenset(), -1, now_ms)

    def prepare_add_partitions(self, added: set[TopicPartition], now_ms: int
                               ) -> TxnTransitMetadata:
        start = now_ms if self.state in (S.EMPTY, S.COMPLETE_ABORT, S.COMPLETE_COMMIT) \
            else self.txn_start_timestamp
        return self._prepare(S.ONGOING, self.producer_id, self.producer_epoch,
                             self.last_producer_epoch, self.txn_timeout_ms,
                             frozenset(self.topic_partitions | added), start, now_ms)

    def prepare_abort_or_commit(self, new_state: TransactionState, now_ms: int
                                ) -> TxnTransitMetadata:
        return self._prepare(new_state, self.producer_id, self.producer_epoch,
                             self.last_producer_epoch, self.txn_timeout_ms,
                             frozenset(self.topic_partitions), self.txn_start_timestamp, now_ms)

    def prepare_complete(self, now_ms: int) -> TxnTransitMetadata:
        new_state = S.COMPLETE_COMMIT if self.state == S.PREPARE_COMMIT else S.COMPLETE_ABORT
        # The prepare record is in the log: a later fence bumps the epoch again.
        self.has_failed_epoch_fence = False
        return self._prepare(new_state, self.producer_id, self.producer_epoch,
                             self.last_producer_epoch, self.txn_timeout_ms, frozenset(),
                             self.txn_start_timestamp, now_ms)

    def prepare_dead(self) -> TxnTransitMetadata:
        return self._prepare(S.DEAD, self.producer_id, self.producer_epoch,
                             self.last_producer_epoch, self.txn_timeout_ms, frozenset(),
                             self.txn_start_timestamp, self.txn_last_update_timestamp)

    # ------------------------------------------------------------------ complete
    def abort_pending(self) -> None:
        self.pending_state = None

    def complete_transition_to(self, t: TxnTransitMetadata) -> None:
        """Apply a transit whose write was acknowledged (Kafka's `completeTransitionTo` and
        its consistency checks)."""
        to = self.pending_state
        if to is None or to != t.txn_state:
            raise IllegalTransitionError(
                f"{self.transactional_id}: completing {t.txn_state.kafka_name}, pending "
                f"{to.kafka_name if to is not None else None}")
        if to == S.EMPTY:
            if t.topic_partitions or t.txn_start_timestamp != -1:
                raise IllegalTransitionError(f"{self.transactional_id}: bad Empty transit")
            self.topic_partitions.clear()
        elif to == S.ONGOING:
            if (t.producer_epoch != self.producer_epoch
                    or not self.topic_partitions <= t.topic_partitions
                    or t.txn_timeout_ms != self.txn_timeout_ms):
                raise IllegalTransitionError(f"{self.transactional_id}: bad Ongoing transit")
            self.topic_partitions |= t.topic_partitions
        elif to in (S.PREPARE_ABORT, S.PREPARE_COMMIT):
            if t.producer_epoch != self.producer_epoch or t.topic_partitions != frozenset(
                    self.topic_partitions):
                raise IllegalTransitionError(f"{self.transactional_id}: bad prepare transit")
        elif to in (S.COMPLETE_ABORT, S.COMPLETE_COMMIT):
            if t.producer_epoch != self.producer_epoch:
                raise IllegalTransitionError(f"{self.transactional_id}: bad complete transit")
            self.topic_partitions.clear()
        elif to == S.PREPARE_EPOCH_FENCE:
            raise IllegalTransitionError("PrepareEpochFence is never written")
        self.txn_start_timestamp = t.txn_start_timestamp
        self.producer_id = t.producer_id
        self.last_producer_id = t.last_producer_id
        self.producer_epoch = t.producer_epoch
        self.last_producer_epoch = t.last_producer_epoch
        self.txn_timeout_ms = t.txn_timeout_ms
        self.txn_last_update_timestamp = t.txn_last_update_timestamp
        self.state = to
        self.pending_state = None

    @classmethod
    def from_transit(cls, transactional_id: str, t: TxnTransitMetadata) -> TransactionMetadata:
        """The metadata a loaded record describes."""
        return cls(transactional_id, t.producer_id, t.last_producer_id, t.producer_epoch,
                   t.last_producer_epoch, t.txn_timeout_ms, t.txn_state,
                   set(t.topic_partitions), t.txn_start_timestamp, t.txn_last_update_timestamp)
