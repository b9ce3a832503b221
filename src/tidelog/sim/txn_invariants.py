"""Transactions in the simulator: a READ_COMMITTED consumer as Kafka's client implements it, and
the invariants of exactly-once delivery (KIP-98) over what it reads.

`read_committed` is the consumer's filter (Kafka's Fetcher/CompletedFetch with
isolation.level=read_committed, client/read_committed.py) over one fetched partition.

`TxnLedger` checks, from what transactional producers wrote and learnt and what consumers read:
- NoAbortedRead: a read_committed consumer never receives a record of an aborted transaction;
- CommittedExactlyOnce: at the end, a consumer that read a partition to its end holds every
  record a committed transaction wrote there, once (never at two offsets);
- AtomicVisibility: a transaction whose outcome a producer never learnt (a crash, a timeout)
  is seen whole or not at all, in each partition, whichever way the coordinator decided;
- FencedProducerRefused: once an instance of a transactional id got its epoch from
  InitProducerId, a request an older instance (a lower epoch) sends is refused.
Records of transactions carry values made by `txn_value`, so a read record names its
transaction and its place in it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from tidelog.client.read_committed import AbortedTransactions
from tidelog.protocol.records.batch import iter_batches
from tidelog.protocol.records.decoder import DecodedRecord, decode_records
from tidelog.replication.types import TopicPartition
from tidelog.sim.invariants import Violation

__all__ = ["TxnKey", "TxnLedger", "parse_txn_value", "read_committed", "txn_value"]

TxnKey = tuple[str, int]  # (transactional id, the producer's transaction number)


def txn_value(transactional_id: str, txn_number: int, index: int, count: int) -> bytes:
    """The value of record `index` of the `count` a transaction writes to one partition."""
    return f"txn|{transactional_id}|{txn_number}|{index}|{count}".encode()


def parse_txn_value(value: bytes | None) -> tuple[TxnKey, int, int] | None:
    """(transaction, index, count) of a `txn_value`, or None for another value."""
    if value is None or not value.startswith(b"txn|"):
        return None
    _, tid, number, index, count = value.decode().split("|")
    return (tid, int(number)), int(index), int(count)


def read_committed(
    records: bytes | memoryview, aborted_transactions: Sequence[tuple[int, int]] | None
) -> Iterator[DecodedRecord]:
    """The records a read_committed consumer returns from one partition's fetch answer."""
    aborted = AbortedTransactions(aborted_transactions)
    for batch in iter_batches(records):
        if not aborted.skip(batch):
            yield from decode_records(batch)


@dataclass(slots=True)
class TxnLedger:
    # what each transaction wrote per partition: {txn: {tp: record count}}
    written: dict[TxnKey, dict[TopicPartition, int]] = field(default_factory=dict)
    committed: set[TxnKey] = field(default_factory=set)
    aborted: set[TxnKey] = field(default_factory=set)
    # {tp: {txn: {index: offsets seen}}}
    seen: dict[TopicPartition, dict[TxnKey, dict[int, set[int]]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(lambda: defaultdict(set))))
    violations: list[Violation] = field(default_factory=list)
    # transactional id -> (the latest epoch InitProducerId granted, when its answer arrived)
    granted_epochs: dict[str, tuple[int, int]] = field(default_factory=dict)
    numbers: dict[str, int] = field(default_factory=dict)
    # told of each violation as it is found (the simulator's per-event checker)
    report: Callable[[Violation], None] | None = None

    def _violate(self, v: Violation) -> None:
        self.violations.append(v)
        if self.report is not None:
            self.report(v)

    # -- the producers' side -----------------------------------------------------------------
    def next_number(self, transactional_id: str) -> int:
        """The next transaction number of the id (across the id's producer instances)."""
        n = self.numbers.get(transactional_id, 0) + 1
        self.numbers[transactional_id] = n
        return n

    @staticmethod
    def value(txn: TxnKey, index: int, count: int) -> bytes:
        return txn_value(txn[0], txn[1], index, count)

    def granted(self, transactional_id: str, epoch: int, now_ms: int) -> None:
        """An instance of the id got `epoch` from InitProducerId (its answer arrived now)."""
        old = self.granted_epochs.get(transactional_id)
        if old is None or epoch > old[0]:
            self.granted_epochs[transactional_id] = (epoch, now_ms)

    def check_not_fenced(self, transactional_id: str, epoch: int, sent_ms: int, what: str,
                         now_ms: int) -> None:
        """A coordinator accepted `what` from an instance at `epoch`, sent at `sent_ms`."""
        newest = self.granted_epochs.get(transactional_id)
        if newest is not None and epoch < newest[0] and sent_ms > newest[1]:
            self._violate(Violation(
                now_ms, "FencedProducerRefused", None,
                f"{transactional_id}: {what} at epoch {epoch} accepted, sent at {sent_ms} after "
                f"epoch {newest[0]} was granted at {newest[1]}"))

    def wrote(self, txn: TxnKey, tp: TopicPartition, count: int) -> None:
        """A transaction sent `count` records to `tp` (values `txn_value(.., i, count)`)."""
        self.written.setdefault(txn, {})[tp] = count

    def outcome(self, txn: TxnKey, committed: bool, now_ms: int = 0) -> None:
        """The producer learnt its EndTxn's result (or the coordinator's abort)."""
        (self.committed if committed else self.aborted).add(txn)
        if committed and txn in self.aborted or not committed and txn in self.committed:
            self._violate(Violation(now_ms, "ConflictingOutcome", None, f"{txn}"))

    def given_up(self, txn: TxnKey, tp: TopicPartition, count: int) -> None:
        """A batch of `count` records whose producer gave up on it (a zombie's late produce):
        it must never be read, as an aborted transaction's."""
        self.wrote(txn, tp, count)
        self.aborted.add(txn)

    def fresh_reader(self) -> TxnLedger:
        """A ledger for another reader: the same transactions and outcomes, nothing read yet
        (e.g. one reading the final logs from their start)."""
        return TxnLedger(written=self.written, committed=self.committed, aborted=self.aborted,
                         report=self.report)

    # -- the consumers' side -----------------------------------------------------------------
    def consumed(self, tp: TopicPartition, records: Iterable[DecodedRecord],
                 now_ms: int = 0) -> None:
        """Records a read_committed consumer returned from `tp` (at simulated time `now_ms`)."""
        for record in records:
            parsed = parse_txn_value(record.value)
            if parsed is None:
                continue
            txn, index, _ = parsed
            if txn in self.aborted:
                self._violate(Violation(
                    now_ms, "NoAbortedRead", tp,
                    f"record {index} of aborted {txn} at {record.offset}"))
            self.seen[tp][txn][index].add(record.offset)

    # -- at the end --------------------------------------------------------------------------
    def final_checks(self, read_to_end: Iterable[TopicPartition],
                     now_ms: int = 0) -> list[Violation]:
        """After the consumers of `read_to_end` caught up with the partitions' LSOs (every
        transaction decided and its markers replicated)."""
        out: list[Violation] = []
        for tp in read_to_end:
            seen = self.seen.get(tp, {})
            for txn, parts in self.written.items():
                want = parts.get(tp)
                if want is None:
                    continue
                got = seen.get(txn, {})
                for index, offsets in got.items():
                    if len(offsets) > 1:
                        out.append(Violation(
                            now_ms, "CommittedExactlyOnce", tp,
                            f"{txn} record {index} at offsets {sorted(offsets)}"))
                if txn in self.aborted and got:  # read before its outcome was learnt
                    out.append(Violation(now_ms, "NoAbortedRead", tp,
                                         f"aborted {txn}: {len(got)} records read"))
                elif txn in self.committed and len(got) != want:
                    out.append(Violation(
                        now_ms, "CommittedExactlyOnce", tp,
                        f"committed {txn}: {len(got)} of {want} records read"))
                elif txn not in self.committed and txn not in self.aborted and got and (
                        len(got) != want):
                    out.append(Violation(
                        now_ms, "AtomicVisibility", tp,
                        f"undecided {txn}: {len(got)} of {want} records read"))
        self.violations.extend(out)
        return out
