"""LeaderEpochFileCache: assignment, KIP-279 end offsets, truncation, persistence."""

from __future__ import annotations

import pytest

from tidelog.sim.disk import MemoryFileIO
from tidelog.storage.epoch_cache import LeaderEpochFileCache
from tidelog.storage.errors import KafkaStorageError


@pytest.fixture
def fio() -> MemoryFileIO:
    fio = MemoryFileIO()
    fio.makedirs("/d")
    return fio


def cache(fio: MemoryFileIO, leo: list[int]) -> LeaderEpochFileCache:
    return LeaderEpochFileCache(fio, "/d", lambda: leo[0])


def test_assign_keeps_epochs_increasing_and_ignores_repeats(fio: MemoryFileIO) -> None:
    c = cache(fio, [0])
    assert c.assign(1, 0)
    assert not c.assign(1, 5)  # same epoch, later offset: no change
    assert c.assign(3, 10)
    assert c.assign(4, 20)
    # a new epoch at an earlier offset rewrites the conflicting tail (Kafka's assign)
    assert c.assign(5, 15)
    assert c.entries == [(1, 0), (3, 10), (5, 15)]
    # an older epoch for later data (a follower copying its leader): the data wins
    assert c.assign(2, 30)
    assert c.entries == [(1, 0), (2, 30)]
    assert not c.assign(-1, 20)


def test_end_offset_for_follows_kip_279(fio: MemoryFileIO) -> None:
    leo = [40]
    c = cache(fio, leo)
    assert c.end_offset_for(0) == (-1, -1)  # empty cache
    for epoch, start in ((1, 5), (3, 12), (6, 30)):
        c.assign(epoch, start)
    assert c.end_offset_for(6) == (6, 40)  # latest epoch: the LEO
    assert c.end_offset_for(3) == (3, 30)
    assert c.end_offset_for(4) == (3, 30)  # unknown epoch: largest known below it
    assert c.end_offset_for(5) == (3, 30)
    assert c.end_offset_for(1) == (1, 12)
    assert c.end_offset_for(2) == (1, 12)
    assert c.end_offset_for(0) == (0, 5)  # older than everything: the first start offset
    assert c.end_offset_for(7) == (-1, -1)  # newer than the latest
    assert c.end_offset_for(-1) == (-1, -1)
    leo[0] = 55
    assert c.end_offset_for(6) == (6, 55)


def test_truncate_from_end_and_from_start(fio: MemoryFileIO) -> None:
    c = cache(fio, [100])
    for epoch, start in ((1, 0), (2, 10), (3, 20), (4, 30)):
        c.assign(epoch, start)
    c.truncate_from_end(20)
    assert c.entries == [(1, 0), (2, 10)]
    c.truncate_from_end(50)
    assert c.entries == [(1, 0), (2, 10)]
    c.truncate_from_start(15)
    assert c.entries == [(2, 15)]
    c.truncate_from_start(5)
    assert c.entries == [(2, 15)]
    assert c.epoch_for_offset(16) == 2 and c.epoch_for_offset(3) is None


def test_changes_stay_in_memory_until_a_flush_needs_them(fio: MemoryFileIO) -> None:
    leo = [7]
    c = cache(fio, leo)
    c.assign(2, 0)
    assert not c.flush_if_needed(0)  # a new leader's epoch at the log end: no batch yet
    assert c.flush_if_needed(7)
    assert fio.read_file("/d/leader-epoch-checkpoint") == b"0\n1\n2 0\n"
    fsyncs = fio.fsyncs
    c.assign(5, 7)
    assert fio.fsyncs == fsyncs
    # Entries at or past the log end are dropped by the next load anyway: nothing to write.
    assert not c.flush_if_needed(7)
    assert c.flush_if_needed(8)  # epoch 5 now has data below the end
    assert fio.read_file("/d/leader-epoch-checkpoint") == b"0\n2\n2 0\n5 7\n"
    assert not c.flush_if_needed(8)  # the file matches
    fio.crash()
    again = cache(fio, leo)
    again.load()
    assert again.entries == [(2, 0), (5, 7)]
    again.truncate_from_end(7)  # a truncation: memory only, the file's extra entry is at 7
    assert not again.flush_if_needed(7)
    again.assign(6, 7)
    assert again.flush_if_needed(9)
    assert fio.read_file("/d/leader-epoch-checkpoint") == b"0\n2\n2 0\n6 7\n"
    again.truncate_from_start(3)
    assert again.flush_if_needed(9)
    assert fio.read_file("/d/leader-epoch-checkpoint") == b"0\n2\n2 3\n6 7\n"
    again.clear_and_flush()
    assert fio.read_file("/d/leader-epoch-checkpoint") == b"0\n0\n"


def test_an_unreadable_checkpoint_is_rewritten_at_the_next_flush(fio: MemoryFileIO) -> None:
    fio.write_file("/d/leader-epoch-checkpoint", b"0\n1\n-3 4\n")
    c = cache(fio, [0])
    with pytest.raises(KafkaStorageError):
        c.load()
    assert c.flush_if_needed(0)
    assert fio.read_file("/d/leader-epoch-checkpoint") == b"0\n0\n"


def test_a_corrupt_checkpoint_fails_load(fio: MemoryFileIO) -> None:
    fio.write_file("/d/leader-epoch-checkpoint", b"0\n1\n-3 4\n")
    with pytest.raises(KafkaStorageError, match="bad line"):
        cache(fio, [0]).load()


def test_non_monotonic_entries_on_disk_are_dropped_on_load(fio: MemoryFileIO) -> None:
    fio.write_file("/d/leader-epoch-checkpoint", b"0\n3\n1 0\n4 10\n3 12\n")
    c = cache(fio, [0])
    c.load()
    assert c.entries == [(1, 0), (3, 12)]
