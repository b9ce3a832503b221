"""Transactions in the log (KIP-98): the last stable offset, the aborted-transaction index written,
truncated, replicated and recovered with the log, and the leader's validation of transactional
appends."""

from __future__ import annotations

import pytest
from storage_helpers import batch, small_config

from tidelog.protocol.records.builder import Record, build_batch, build_end_transaction_marker
from tidelog.sim.disk import MemoryFileIO
from tidelog.storage.log import Log
from tidelog.storage.transaction_index import AbortedTxn
from tidelog.storage.transactions import (
    AppendOrigin,
    InvalidProducerEpochError,
    InvalidRecordError,
    InvalidTxnStateError,
    TransactionCoordinatorFencedError,
)

DIR = "/data/t-0"
COORDINATOR = AppendOrigin.COORDINATOR


def txn(pid: int, *values: bytes, epoch: int = 0, seq: int = 0) -> bytearray:
    return build_batch([Record(value=v) for v in values or (b"x",)], producer_id=pid,
                       producer_epoch=epoch, base_sequence=seq, transactional=True)


def idempotent(pid: int, epoch: int = 0, seq: int = 0) -> bytearray:
    return build_batch([Record(value=b"i")], producer_id=pid, producer_epoch=epoch,
                       base_sequence=seq)


def marker(pid: int, *, commit: bool, epoch: int = 0, coordinator_epoch: int = 0) -> bytearray:
    return build_end_transaction_marker(commit=commit, producer_id=pid, producer_epoch=epoch,
                                        coordinator_epoch=coordinator_epoch)


def new_log(fio: MemoryFileIO | None = None, **config: object) -> Log:
    return Log(DIR, small_config(**config), fio or MemoryFileIO())


def all_aborted(log: Log) -> list[AbortedTxn]:
    return log.collect_aborted_transactions(0, log.log_end_offset + 1)


def test_an_open_transaction_holds_the_lso_until_its_marker_is_below_the_hw() -> None:
    log = new_log()
    log.append_as_leader(batch(b"plain"), 0, 0)  # offset 0
    log.append_as_leader(txn(1, b"a", b"b"), 0, 0)  # offsets 1-2
    log.update_high_watermark(3)
    assert log.high_watermark == 3 and log.last_stable_offset == 1
    log.append_as_leader(marker(1, commit=True), 0, 0, COORDINATOR)  # offset 3
    log.update_high_watermark(3)  # the marker is written but not replicated
    assert log.last_stable_offset == 1
    log.append_as_leader(batch(b"after"), 0, 0)
    log.update_high_watermark(4)
    assert log.last_stable_offset == 4
    assert all_aborted(log) == []  # a commit leaves no entry


def test_without_transactions_the_lso_is_the_hw() -> None:
    log = new_log()
    log.append_as_leader(idempotent(5), 0, 0)
    log.update_high_watermark(1)
    assert log.last_stable_offset == 1


def test_an_abort_is_indexed_with_the_lso_after_it() -> None:
    log = new_log()
    log.append_as_leader(txn(1, b"a"), 0, 0)  # 0: producer 1 begins
    log.append_as_leader(txn(2, b"b"), 0, 0)  # 1: producer 2 begins
    log.append_as_leader(txn(1, b"c", seq=1), 0, 0)  # 2
    log.append_as_leader(marker(1, commit=False), 0, 0, COORDINATOR)  # 3: 1 aborts
    # Producer 2 is still open at 1: the LSO after the abort is 1, not 4.
    assert all_aborted(log) == [AbortedTxn(1, 0, 3, 1)]
    log.append_as_leader(marker(2, commit=False), 0, 0, COORDINATOR)  # 4: 2 aborts
    assert all_aborted(log)[1] == AbortedTxn(2, 1, 4, 5)
    assert log.collect_aborted_transactions(4, 5) == [AbortedTxn(2, 1, 4, 5)]


def test_the_entry_goes_to_the_segment_holding_the_marker() -> None:
    log = new_log()
    log.append_as_leader(txn(1, b"x" * 300), 0, 0)
    for i in range(6):  # roll a few segments of 1 KiB
        log.append_as_leader(batch(b"y" * 300, timestamp=i), 0, 0)
    log.append_as_leader(marker(1, commit=False), 0, 0, COORDINATOR)
    assert len(log.segments) > 1
    assert [len(s.txn_index) for s in log.segments] == [0] * (len(log.segments) - 1) + [1]
    # A fetch from the first segment finds it by walking the later segments' indexes.
    assert log.collect_aborted_transactions(0, log.log_end_offset) == [
        AbortedTxn(1, 0, log.log_end_offset - 1, log.log_end_offset)
    ]


def test_a_stale_producer_epoch_is_refused_and_nothing_is_written() -> None:
    log = new_log()
    log.append_as_leader(txn(1, epoch=3), 0, 0)
    with pytest.raises(InvalidProducerEpochError):
        log.append_as_leader(txn(1, epoch=2, seq=1), 0, 0)
    with pytest.raises(InvalidProducerEpochError):
        log.append_as_leader(marker(1, commit=True, epoch=2), 0, 0, COORDINATOR)
    assert log.log_end_offset == 1


def test_a_non_transactional_batch_inside_a_transaction_is_refused() -> None:
    log = new_log()
    log.append_as_leader(txn(1), 0, 0)
    with pytest.raises(InvalidTxnStateError):
        log.append_as_leader(idempotent(1, seq=1), 0, 0)
    # Checked in order within one append: the marker first closes the transaction.
    log.append_as_leader(marker(1, commit=True), 0, 0, COORDINATOR)
    log.append_as_leader(idempotent(1, seq=1), 0, 0)
    assert log.log_end_offset == 3


def test_only_the_coordinator_writes_markers_and_a_zombie_coordinator_is_fenced() -> None:
    log = new_log()
    log.append_as_leader(txn(1), 0, 0)
    with pytest.raises(InvalidRecordError):
        log.append_as_leader(marker(1, commit=True), 0, 0)  # from a client
    log.append_as_leader(marker(1, commit=True, coordinator_epoch=5), 0, 0, COORDINATOR)
    log.append_as_leader(txn(1, seq=1), 0, 0)
    with pytest.raises(TransactionCoordinatorFencedError):
        log.append_as_leader(marker(1, commit=False, coordinator_epoch=4), 0, 0, COORDINATOR)
    assert log.log_end_offset == 3


def test_truncating_a_commit_marker_away_reopens_its_transaction() -> None:
    log = new_log()
    log.append_as_leader(txn(1, b"a"), 0, 0)  # 0
    log.append_as_leader(marker(1, commit=True), 0, 0, COORDINATOR)  # 1
    log.append_as_leader(batch(b"z"), 0, 0)  # 2
    log.update_high_watermark(1)
    log.truncate_to(1)
    log.update_high_watermark(1)
    assert log.last_stable_offset == 0  # open again: a new leader may still abort it


def test_truncating_an_abort_marker_away_removes_its_index_entry_and_reopens_it() -> None:
    log = new_log()
    log.append_as_leader(txn(1, b"a"), 0, 0)  # 0
    log.append_as_leader(marker(1, commit=False), 0, 0, COORDINATOR)  # 1
    assert len(all_aborted(log)) == 1
    log.truncate_to(1)
    assert all_aborted(log) == []
    log.append_as_leader(marker(1, commit=True), 0, 0, COORDINATOR)  # the new leader commits
    assert all_aborted(log) == []
    log.update_high_watermark(2)
    assert log.last_stable_offset == 2


def test_truncating_a_transaction_from_its_start_forgets_it() -> None:
    log = new_log()
    log.append_as_leader(batch(b"a"), 0, 0)  # 0
    log.append_as_leader(txn(1), 0, 0)  # 1
    log.update_high_watermark(1)
    log.truncate_to(1)
    log.append_as_leader(batch(b"b"), 0, 0)
    log.update_high_watermark(2)
    assert log.last_stable_offset == 2


def test_truncating_below_a_forgotten_marker_rebuilds_the_state_from_the_log() -> None:
    log = new_log()
    log.append_as_leader(txn(1), 0, 0)  # 0
    log.append_as_leader(marker(1, commit=True), 0, 0, COORDINATOR)  # 1
    log.append_as_leader(batch(b"z"), 0, 0)  # 2
    log.update_high_watermark(3)  # the marker is below the HW: forgotten from memory
    assert not log.transactions.unreplicated
    log.truncate_to(1)  # (an unclean election)
    log.update_high_watermark(1)
    assert log.last_stable_offset == 0


def test_a_follower_replicating_the_leaders_batches_has_the_same_index_and_lso() -> None:
    leader = new_log()
    leader.append_as_leader(txn(1, b"a"), 0, 0)
    leader.append_as_leader(txn(2, b"b"), 0, 0)
    leader.append_as_leader(marker(1, commit=False), 0, 0, COORDINATOR)
    follower = Log("/data/f-0", small_config(), MemoryFileIO())
    for b in leader.batches():
        follower.append_as_follower(bytes(b.buf), 0)
    assert follower.collect_aborted_transactions(0, 10) == all_aborted(leader)
    follower.update_high_watermark(3)
    assert follower.last_stable_offset == 1  # producer 2 is still open


def test_recovery_rebuilds_the_lost_index_and_the_open_transactions() -> None:
    fio = MemoryFileIO()
    log = new_log(fio)
    log.append_as_leader(txn(1, b"a"), 0, 0)  # 0
    log.append_as_leader(txn(2, b"b"), 0, 0)  # 1
    log.append_as_leader(marker(1, commit=False), 0, 0, COORDINATOR)  # 2
    log.flush()
    before = all_aborted(log)
    fio.remove(log.segments[0].txn_index.path)  # lost with an unclean shutdown
    fio.crash()
    again = Log(DIR, small_config(), fio, recovery_point=0)
    assert all_aborted(again) == before == [AbortedTxn(1, 0, 2, 1)]
    again.update_high_watermark(3)
    assert again.last_stable_offset == 1


def aborted_and_closed(fio: MemoryFileIO) -> str:
    """A log holding one aborted transaction (offsets 0-1), closed cleanly; its .txnindex."""
    log = new_log(fio)
    log.append_as_leader(txn(1), 0, 0)
    log.append_as_leader(marker(1, commit=False), 0, 0, COORDINATOR)
    log.flush()
    log.close()
    return log.segments[0].txn_index.path


def test_a_clean_reopen_loads_the_index_file() -> None:
    fio = MemoryFileIO()
    aborted_and_closed(fio)
    again = Log(DIR, small_config(), fio, recovery_point=2, had_clean_shutdown=True)
    assert all_aborted(again) == [AbortedTxn(1, 0, 1, 2)]


def test_a_corrupt_index_file_is_rebuilt_by_recovering_its_segment() -> None:
    fio = MemoryFileIO()
    fio.open(aborted_and_closed(fio)).append(b"\x00" * 5)  # torn entry
    again = Log(DIR, small_config(), fio, recovery_point=2, had_clean_shutdown=True)
    assert all_aborted(again) == [AbortedTxn(1, 0, 1, 2)]


def test_retention_deletes_a_segments_index_with_it() -> None:
    fio = MemoryFileIO()
    log = new_log(fio, retention_bytes=0)
    log.append_as_leader(txn(1, b"x" * 300), 0, 0)
    log.append_as_leader(marker(1, commit=False), 0, 0, COORDINATOR)
    path = log.segments[0].txn_index.path
    for i in range(6):
        log.append_as_leader(batch(b"y" * 300, timestamp=i), 0, 0)
    log.update_high_watermark(log.log_end_offset)
    assert fio.exists(path)
    assert log.delete_old_segments(now_ms=0) >= 1
    assert not fio.exists(path)


def test_a_clean_reopen_restores_open_transactions_from_the_producer_snapshot() -> None:
    fio = MemoryFileIO()
    log = new_log(fio)
    log.append_as_leader(txn(1), 0, 0)  # 0: stays open
    log.append_as_leader(batch(b"z"), 0, 0)
    log.flush()
    log.close()
    again = Log(DIR, small_config(), fio, recovery_point=2, had_clean_shutdown=True)
    assert again.transactions.ongoing == {1: 0}
    again.update_high_watermark(2)
    assert again.last_stable_offset == 0


def test_recovery_indexes_an_abort_whose_transaction_began_in_an_earlier_segment() -> None:
    fio = MemoryFileIO()
    log = new_log(fio)
    log.append_as_leader(txn(1, b"x" * 300), 0, 0)  # 0: begins in the first segment
    for i in range(4):
        log.append_as_leader(batch(b"y" * 300, timestamp=i), 0, 0)
    # The transaction's first segment goes (DeleteRecords): only the producer snapshots of
    # the rolls still know where it began.
    log.update_high_watermark(log.log_end_offset)
    log.maybe_increment_log_start_offset(log.segments[1].base_offset)
    assert log.delete_old_segments(now_ms=0) == 1
    log.flush()  # everything so far durable
    recovery_point = log.log_end_offset
    log.append_as_leader(marker(1, commit=False), 0, 0, COORDINATOR)
    marker_offset = log.log_end_offset - 1
    log.flush(log.log_end_offset)
    fio.remove(log.segments[-1].txn_index.path)  # the recovered segment's index is rebuilt
    fio.crash()
    again = Log(DIR, small_config(), fio, recovery_point=recovery_point,
                log_start_offset=log.log_start_offset)
    assert all_aborted(again) == [AbortedTxn(1, 0, marker_offset, marker_offset + 1)]
