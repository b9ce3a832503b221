"""The `.txnindex` file: Kafka's 34-byte AbortedTxn entries, lazy creation, truncation,
search, and the sanity check that makes a damaged file rebuilt."""

from __future__ import annotations

import struct

import pytest

from tidelog.sim.disk import MemoryFileIO
from tidelog.storage.errors import CorruptIndexError
from tidelog.storage.transaction_index import (
    ABORTED_TXN_SIZE,
    AbortedTxn,
    TransactionIndex,
)

PATH = "/data/t-0/00000000000000000100.txnindex"


def new_index(fio: MemoryFileIO) -> TransactionIndex:
    fio.makedirs("/data/t-0", durable=True)  # the log's dir, on the disk already
    return TransactionIndex(fio, PATH, 100)


def test_an_entry_is_kafkas_34_byte_big_endian_layout() -> None:
    fio = MemoryFileIO()
    index = new_index(fio)
    index.append(AbortedTxn(producer_id=7, first_offset=100, last_offset=105, last_stable_offset=106))
    handle = fio.open(PATH)
    data = bytes(handle.read(0, handle.size()))
    assert ABORTED_TXN_SIZE == 34
    # version int16, producerId, firstOffset, lastOffset, lastStableOffset int64
    assert data == struct.pack(">hqqqq", 0, 7, 100, 105, 106)


def test_no_file_exists_until_a_transaction_aborts() -> None:
    fio = MemoryFileIO()
    index = new_index(fio)
    index.load()
    index.flush()
    index.truncate_to(0)
    assert not fio.exists(PATH)
    index.append(AbortedTxn(1, 100, 101, 102))
    assert fio.exists(PATH)


def test_entries_survive_a_reload_once_flushed_and_a_crash_keeps_only_flushed_ones() -> None:
    fio = MemoryFileIO()
    index = new_index(fio)
    index.append(AbortedTxn(1, 100, 103, 104))
    index.flush()
    fio.fsync_dir("/data/t-0")  # the new file's name
    index.append(AbortedTxn(2, 101, 110, 111))
    fio.crash()
    again = TransactionIndex(fio, PATH, 100)
    again.load()
    assert again.entries == [AbortedTxn(1, 100, 103, 104)]


def test_markers_must_come_in_order() -> None:
    index = new_index(MemoryFileIO())
    index.append(AbortedTxn(1, 100, 103, 104))
    with pytest.raises(ValueError):
        index.append(AbortedTxn(2, 100, 103, 104))


def test_truncation_drops_the_entries_whose_marker_is_at_or_after_the_offset() -> None:
    fio = MemoryFileIO()
    index = new_index(fio)
    for pid, last in ((1, 103), (2, 110), (3, 120)):
        index.append(AbortedTxn(pid, 100, last, last + 1))
    index.truncate_to(110)
    assert [t.producer_id for t in index.entries] == [1]
    assert fio.open(PATH).size() == ABORTED_TXN_SIZE
    index.append(AbortedTxn(4, 105, 111, 112))  # appends continue after the cut
    index.flush()
    again = TransactionIndex(fio, PATH, 100)
    again.load()
    assert [t.producer_id for t in again.entries] == [1, 4]


def test_collect_returns_overlapping_entries_and_stops_at_the_first_lso_past_the_bound() -> None:
    index = new_index(MemoryFileIO())
    index.append(AbortedTxn(1, 100, 104, 105))
    index.append(AbortedTxn(2, 102, 110, 106))
    index.append(AbortedTxn(3, 111, 115, 116))
    found = index.collect_aborted_txns(fetch_offset=105, upper_bound_offset=112)
    # producer 1's marker (104) is before the fetch; 2 and 3 overlap [105, 112)
    assert [t.producer_id for t in found.aborted_transactions] == [2, 3]
    assert found.is_complete  # producer 3's LSO 116 >= 112
    open_ended = index.collect_aborted_txns(fetch_offset=100, upper_bound_offset=200)
    assert len(open_ended.aborted_transactions) == 3 and not open_ended.is_complete


@pytest.mark.parametrize(
    "data",
    [
        struct.pack(">hqqqq", 0, 1, 100, 105, 106)[:-3],  # torn entry
        struct.pack(">hqqqq", 1, 1, 100, 105, 106),  # unknown version
        struct.pack(">hqqqq", 0, 1, 90, 95, 96),  # before the segment's base offset
        struct.pack(">hqqqq", 0, 1, 100, 105, 106) * 2,  # markers not increasing
    ],
)
def test_a_damaged_file_fails_the_sanity_check(data: bytes) -> None:
    fio = MemoryFileIO()
    fio.makedirs("/data/t-0")
    fio.open(PATH).append(data)
    with pytest.raises(CorruptIndexError):
        TransactionIndex(fio, PATH, 100).load()
