"""The read_committed consumer filter and the exactly-once invariants, over a real log: what the
log serves a READ_COMMITTED reader (up to the LSO, with the aborted transactions of each read)
passes; a server that forgets the aborted list, or loses a committed record, is caught."""

from __future__ import annotations

from tidelog.protocol.records.batch import iter_batches
from tidelog.protocol.records.builder import Record, build_batch, build_end_transaction_marker
from tidelog.replication.types import TopicPartition
from tidelog.sim.disk import MemoryFileIO
from tidelog.sim.txn_invariants import TxnLedger, read_committed, txn_value
from tidelog.storage.log import Log
from tidelog.storage.log_config import LogConfig
from tidelog.storage.transactions import AppendOrigin

TP = TopicPartition("out", 0)


def write_txn(log: Log, ledger: TxnLedger, tid: str, pid: int, number: int, count: int,
              outcome: bool | None, seq: int) -> int:
    """`count` records in batches of two, then the marker (None: never decided)."""
    values = [txn_value(tid, number, i, count) for i in range(count)]
    ledger.wrote((tid, number), TP, count)
    for i in range(0, count, 2):
        chunk = values[i:i + 2]
        log.append_as_leader(build_batch([Record(v) for v in chunk], producer_id=pid,
                                         producer_epoch=0, base_sequence=seq,
                                         transactional=True), 0, 0)
        seq += len(chunk)
    if outcome is not None:
        marker = build_end_transaction_marker(commit=outcome, producer_id=pid, producer_epoch=0,
                                              coordinator_epoch=0)
        log.append_as_leader(marker, 0, 0, AppendOrigin.COORDINATOR)
        ledger.outcome((tid, number), outcome)
    return seq


def populated() -> tuple[Log, TxnLedger]:
    log = Log("/d/out-0", LogConfig.from_dict({"segment.bytes": 700}), MemoryFileIO())
    ledger = TxnLedger()
    seqs = {1: 0, 2: 0}
    # Interleaved: 1 commits, 2 aborts, 1 aborts, 2 commits, 1 stays open.
    seqs[1] = write_txn(log, ledger, "a", 1, 0, 3, True, seqs[1])
    seqs[2] = write_txn(log, ledger, "b", 2, 0, 4, False, seqs[2])
    seqs[1] = write_txn(log, ledger, "a", 1, 1, 2, False, seqs[1])
    seqs[2] = write_txn(log, ledger, "b", 2, 1, 5, True, seqs[2])
    write_txn(log, ledger, "a", 1, 2, 2, None, seqs[1])
    log.update_high_watermark(log.log_end_offset)
    return log, ledger


def consume(log: Log, ledger: TxnLedger, *, with_aborted: bool = True, max_bytes: int = 150,
            lose: int | None = None) -> None:
    offset = log.log_start_offset
    lso = log.last_stable_offset
    while offset < lso:
        info = log.read(offset, max_bytes, max_offset=lso)
        aborted = [(t.producer_id, t.first_offset) for t in log.aborted_transactions_for_read(info)]
        records = [r for r in read_committed(bytes(info.records), aborted if with_aborted else [])
                   if r.offset != lose]
        ledger.consumed(TP, records)
        offset = [b.last_offset + 1 for b in iter_batches(bytes(info.records))][-1]


def test_the_logs_read_committed_answers_satisfy_exactly_once() -> None:
    log, ledger = populated()
    consume(log, ledger)
    assert ledger.violations == []
    assert ledger.final_checks([TP]) == []
    # The open transaction holds the LSO: none of its records were served.
    assert ("a", 2) not in ledger.seen[TP]


def test_without_the_aborted_list_aborted_records_are_caught() -> None:
    log, ledger = populated()
    consume(log, ledger, with_aborted=False)
    assert {v.invariant for v in ledger.violations} == {"NoAbortedRead"}


def test_a_lost_committed_record_is_caught() -> None:
    log, ledger = populated()
    consume(log, ledger, lose=1)  # record 1 of ("a", 0)
    assert [v.invariant for v in ledger.final_checks([TP])] == ["CommittedExactlyOnce"]


def test_an_undecided_transaction_seen_in_part_is_caught() -> None:
    ledger = TxnLedger()
    ledger.wrote(("x", 0), TP, 2)
    from tidelog.protocol.records.decoder import DecodedRecord

    ledger.consumed(TP, [DecodedRecord(5, 0, None, txn_value("x", 0, 0, 2), ())])
    assert [v.invariant for v in ledger.final_checks([TP])] == ["AtomicVisibility"]
