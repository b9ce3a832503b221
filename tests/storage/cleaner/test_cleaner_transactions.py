"""The log cleaner and transactions: an open transaction's records are never cleaned (the first
uncleanable offset is at most the LSO); an aborted transaction's records neither shadow a
committed value of their key nor survive a clean; markers and `.txnindex` entries stay."""

from __future__ import annotations

from tidelog.protocol.records.builder import Record, build_batch, build_end_transaction_marker
from tidelog.protocol.records.decoder import decode_records
from tidelog.sim.disk import MemoryFileIO
from tidelog.storage.cleaner.log_cleaner import Cleaner, cleanable_offsets, log_to_clean
from tidelog.storage.cleaner.offset_map import OffsetMap
from tidelog.storage.log import Log
from tidelog.storage.log_config import LogConfig
from tidelog.storage.transactions import AppendOrigin


def compacted_log() -> Log:
    config = LogConfig.from_dict({"cleanup.policy": "compact", "segment.bytes": 100_000,
                                  "file.delete.delay.ms": 0})
    return Log("/d/t-0", config, MemoryFileIO())


def plain(log: Log, key: bytes, value: bytes) -> None:
    log.append_as_leader(build_batch([Record(value, key=key)]), 0, 0)


def txn(log: Log, pid: int, key: bytes, value: bytes, seq: int = 0) -> None:
    log.append_as_leader(build_batch([Record(value, key=key)], producer_id=pid,
                                     producer_epoch=0, base_sequence=seq, transactional=True),
                         0, 0)


def end(log: Log, pid: int, commit: bool) -> None:
    marker = build_end_transaction_marker(commit=commit, producer_id=pid, producer_epoch=0,
                                          coordinator_epoch=0)
    log.append_as_leader(marker, 0, 0, AppendOrigin.COORDINATOR)


def data(log: Log) -> list[tuple[int, bytes | None, bytes | None]]:
    return [(r.offset, r.key, r.value) for b in log.batches(0) if not b.is_control_batch
            for r in decode_records(b)]


def clean(log: Log) -> None:
    log.roll(0)
    log.update_high_watermark(log.log_end_offset)
    cleaner = Cleaner(OffsetMap(1 << 20))
    for _ in cleaner.clean(log_to_clean(log, None, 0), 0):
        pass


def test_an_open_transaction_bounds_the_cleanable_section() -> None:
    log = compacted_log()
    plain(log, b"k", b"v0")  # 0
    txn(log, 7, b"k", b"v1")  # 1: open
    plain(log, b"k", b"v2")  # 2
    log.roll(0)
    log.update_high_watermark(log.log_end_offset)
    assert log.last_stable_offset == 1
    assert cleanable_offsets(log, None, 0)[1] == 1


def test_aborted_records_are_dropped_and_never_shadow_a_committed_value() -> None:
    log = compacted_log()
    plain(log, b"k", b"committed")  # 0
    txn(log, 7, b"k", b"aborted")  # 1
    end(log, 7, commit=False)  # 2
    txn(log, 8, b"j", b"kept")  # 3
    end(log, 8, commit=True)  # 4
    before = log.collect_aborted_transactions(0, log.log_end_offset)
    clean(log)
    # Without the aborted filter, offset 1 would be k's latest and "committed" would go.
    assert data(log) == [(0, b"k", b"committed"), (3, b"j", b"kept")]
    assert log.collect_aborted_transactions(0, log.log_end_offset) == before
    assert [b.base_offset for b in log.batches(0) if b.is_control_batch] == [2, 4]
