"""Loading and recovery: torn and corrupt batches, lost or corrupt indexes, garbage files."""

from __future__ import annotations

import random

import pytest
from storage_helpers import batch, small_config

from tidelog.sim.disk import MemoryFileIO
from tidelog.storage.log import Log
from tidelog.storage.log_config import LogConfig

DIR = "/data/t-0"
SEG0 = f"{DIR}/00000000000000000000.log"


def filled_log(fio: MemoryFileIO, count: int = 40, config: LogConfig | None = None) -> Log:
    log = Log(DIR, config or small_config(), fio)
    for i in range(count):
        log.append_as_leader(batch(b"record-%03d" % i, timestamp=i), i // 10, now_ms=i)
    return log


def contents(log: Log) -> list[tuple[int, int, bytes]]:
    return [(b.base_offset, b.partition_leader_epoch, bytes(b.buf)) for b in log.batches()]


def reopen(fio: MemoryFileIO, **kw: object) -> Log:
    return Log(DIR, small_config(), fio, **kw)  # type: ignore[arg-type]


def test_a_clean_reopen_keeps_everything(fio_log: tuple[MemoryFileIO, Log]) -> None:
    fio, log = fio_log
    before = contents(log)
    log.flush()
    log.close()
    again = reopen(fio, recovery_point=log.recovery_point, had_clean_shutdown=True)
    assert contents(again) == before
    assert again.log_end_offset == 40 and again.recovery_point == 40
    assert again.leader_epoch_cache.entries == [(0, 0), (1, 10), (2, 20), (3, 30)]
    assert [len(s.offset_index) for s in again.segments] == [
        len(s.offset_index) for s in log.segments
    ]


@pytest.fixture
def fio_log() -> tuple[MemoryFileIO, Log]:
    fio = MemoryFileIO()
    return fio, filled_log(fio)


def test_a_crash_loses_only_the_unflushed_tail(fio_log: tuple[MemoryFileIO, Log]) -> None:
    fio, log = fio_log
    log.flush(25)
    flushed = [c for c in contents(log) if c[0] < log.recovery_point]
    fio.crash()
    again = reopen(fio, recovery_point=log.recovery_point)
    kept = contents(again)
    assert kept[: len(flushed)] == flushed
    assert again.log_end_offset >= 25
    assert again.recovery_point <= again.log_end_offset


@pytest.mark.parametrize("seed", range(8))
def test_a_torn_write_is_cut_at_the_last_whole_batch(seed: int) -> None:
    fio = MemoryFileIO()
    log = filled_log(fio, count=5, config=small_config(segment_bytes=1 << 20))
    log.flush()
    everything = filled_batches = contents(log)
    for i in range(5, 12):
        log.append_as_leader(batch(b"record-%03d" % i, timestamp=i), 0, now_ms=i)
    everything = contents(log)
    fio.crash(random.Random(seed), tear=True)
    again = reopen(fio, recovery_point=5)
    kept = contents(again)
    assert kept == everything[: len(kept)]  # a prefix of what was written, no torn batch
    assert len(kept) >= len(filled_batches)
    assert again.log_end_offset == len(kept)
    assert all(b.is_valid() for b in again.batches())
    assert again.append_as_leader(batch(), 0, 0).first_offset == len(kept)


def test_a_corrupt_batch_truncates_the_log_there(fio_log: tuple[MemoryFileIO, Log]) -> None:
    fio, log = fio_log
    log.flush()
    before = contents(log)
    segment = log.segments[1]
    # flip a byte inside the third batch of the second segment
    positions = [0]
    for b in segment.iter_batches():
        positions.append(positions[-1] + b.size_in_bytes)
    data = bytearray(fio.read_file(segment.log_path))
    data[positions[2] + 70] ^= 0x55
    fio.write_file(segment.log_path, bytes(data))
    again = reopen(fio, recovery_point=0)
    cut = segment.base_offset + 2
    assert again.log_end_offset == cut
    assert contents(again) == before[:cut]
    assert len(again.segments) == 2  # the later segments went with it
    assert again.leader_epoch_cache.end_offset_for(again.latest_epoch or 0)[1] == cut


def test_corruption_below_the_recovery_point_is_found_through_the_index_check() -> None:
    fio = MemoryFileIO()
    log = filled_log(fio)
    log.flush()
    log.close()
    data = bytearray(fio.read_file(SEG0))
    data[5:9] = b"\xff\xff\xff\xff"  # the first batch's length: now garbage
    fio.write_file(SEG0, bytes(data))
    fio.remove(f"{DIR}/00000000000000000000.index")
    again = reopen(fio, recovery_point=40, had_clean_shutdown=True)
    assert again.log_end_offset == 0
    assert again.append_as_leader(batch(), 0, 0).first_offset == 0


@pytest.mark.parametrize("damage", ["missing", "truncated", "garbage", "past_end"])
def test_a_missing_or_corrupt_index_is_rebuilt(damage: str) -> None:
    fio = MemoryFileIO()
    log = filled_log(fio)
    log.flush()
    expected = [s.offset_index.entries() for s in log.segments]
    log.close()
    path = f"{DIR}/00000000000000000000.index"
    original = fio.read_file(path)
    assert original  # the first segment is indexed
    if damage == "missing":
        fio.remove(path)
    elif damage == "truncated":
        fio.write_file(path, original[:-3])
    elif damage == "garbage":
        fio.write_file(path, bytes(reversed(original)))
    else:
        fio.write_file(path, original[:-4] + (100_000).to_bytes(4, "big"))
    again = reopen(fio, recovery_point=40, had_clean_shutdown=True)
    assert [s.offset_index.entries() for s in again.segments] == expected
    assert again.log_end_offset == 40
    for target in (0, 13, 39):
        assert next(iter(again.batches(target))).base_offset == target


def test_a_corrupt_leader_epoch_checkpoint_is_rebuilt_from_the_batches() -> None:
    fio = MemoryFileIO()
    log = filled_log(fio)
    log.flush()
    log.close()
    fio.write_file(f"{DIR}/leader-epoch-checkpoint", b"0\n7\n1 2\n")
    again = reopen(fio, recovery_point=40, had_clean_shutdown=True)
    assert again.leader_epoch_cache.entries == [(0, 0), (1, 10), (2, 20), (3, 30)]


def test_garbage_files_in_the_log_dir_are_ignored_or_cleaned() -> None:
    fio = MemoryFileIO()
    log = filled_log(fio, count=5)
    log.flush()
    log.close()
    fio.write_file(f"{DIR}/notes.txt", b"hello")
    fio.write_file(f"{DIR}/foo.log", b"\x00" * 100)
    fio.write_file(f"{DIR}/00000000000000000999.index", b"\x00" * 8)  # orphan index
    fio.write_file(f"{DIR}/00000000000000000000.log.deleted", b"old")
    fio.write_file(f"{DIR}/leader-epoch-checkpoint.tmp", b"half")
    again = reopen(fio, recovery_point=0)
    assert again.log_end_offset == 5
    names = fio.listdir(DIR)
    assert "notes.txt" in names and "foo.log" in names
    assert "00000000000000000999.index" not in names
    assert not any(n.endswith((".deleted", ".tmp")) for n in names)


def test_a_segment_of_pure_garbage_becomes_empty() -> None:
    fio = MemoryFileIO()
    rng = random.Random(7)
    fio.write_file(SEG0, bytes(rng.randrange(256) for _ in range(5000)))
    log = reopen(fio)
    assert (log.log_start_offset, log.log_end_offset) == (0, 0)
    assert fio.read_file(SEG0) == b""


def test_overlapping_segments_keep_the_first_consistent_prefix() -> None:
    fio = MemoryFileIO()
    log = filled_log(fio, count=10, config=small_config(segment_bytes=1 << 20))
    log.flush()
    log.close()
    # a stray segment whose base offset lies inside the first one
    fio.write_file(f"{DIR}/00000000000000000005.log", bytes(batch(base_offset=5)))
    again = reopen(fio)
    assert again.log_end_offset == 10
    assert [s.base_offset for s in again.segments] == [0]


def test_the_log_start_offset_checkpoint_past_the_surviving_data_restarts_the_log() -> None:
    fio = MemoryFileIO()
    log = filled_log(fio, count=5)
    log.flush()
    log.close()
    again = reopen(fio, log_start_offset=20, recovery_point=5)
    assert (again.log_start_offset, again.log_end_offset) == (20, 20)


def test_an_io_failure_surfaces_as_kafka_storage_error() -> None:
    from tidelog.storage.errors import KafkaStorageError

    fio = MemoryFileIO()
    log = filled_log(fio, count=3)
    fio.fail_io("/data")
    with pytest.raises(KafkaStorageError) as info:
        log.append_as_leader(batch(), 0, 0)
    assert info.value.error_code == 56
    with pytest.raises(KafkaStorageError):
        log.read(0, 100)
    with pytest.raises(KafkaStorageError):
        reopen(fio)
    fio.heal()
    assert reopen(fio).log_end_offset == 3


def test_real_files_with_a_torn_tail_are_recovered(tmp_path: object) -> None:
    import os

    from tidelog.storage.file_io import OsFileIO

    d = f"{tmp_path}/t-0"
    log = Log(d, small_config(segment_bytes=1 << 20), OsFileIO())
    for i in range(10):
        log.append_as_leader(batch(b"value-%d" % i), 0, 0)
    log.close()
    path = f"{d}/00000000000000000000.log"
    os.truncate(path, os.path.getsize(path) - 7)  # the last batch is torn
    with open(f"{d}/00000000000000000000.index", "wb") as f:
        f.write(b"\x01" * 13)  # and the index is garbage
    again = Log(d, small_config(segment_bytes=1 << 20), OsFileIO())
    assert again.log_end_offset == 9
    assert [b.base_offset for b in again.batches()] == list(range(9))
    assert again.append_as_leader(batch(), 0, 0).first_offset == 9


def test_cleaned_up_leftovers_stay_gone_after_a_crash() -> None:
    fio = MemoryFileIO()
    log = filled_log(fio, count=3)
    log.flush()
    log.close()
    fio.write_file(f"{DIR}/00000000000000000000.log.deleted", b"old")
    fio.write_file(f"{DIR}/00000000000000000077.timeindex", b"")
    reopen(fio)
    fio.crash()
    names = fio.listdir(DIR)
    assert "00000000000000000000.log.deleted" not in names
    assert "00000000000000000077.timeindex" not in names


def test_a_full_disk_refuses_appends_and_then_fetch_reads_with_a_storage_error() -> None:
    import errno

    from tidelog.storage.errors import KafkaStorageError

    fio = MemoryFileIO()
    log = filled_log(fio, count=5)
    fio.fail_io("/data", error=errno.ENOSPC, writes_only=True)
    with pytest.raises(KafkaStorageError, match="No space left"):
        log.append_as_leader(batch(), 0, 0)
    assert log.log_end_offset == 5
    assert [b.base_offset for b in log.batches()] == [0, 1, 2, 3, 4]
    # Kafka's maybeHandleIOException: nothing is read from a dir after its first error.
    with pytest.raises(KafkaStorageError, match="offline after an I/O error"):
        log.read(2, 1000)
    fio.heal()
    with pytest.raises(KafkaStorageError, match="offline after an I/O error"):
        log.append_as_leader(batch(), 0, 0)  # files may not match memory: reopen first
    again = reopen(fio, recovery_point=0)
    assert again.append_as_leader(batch(), 0, 0).first_offset == 5


def test_reads_over_bytes_damaged_after_loading_stay_bounded() -> None:
    fio = MemoryFileIO()
    log = filled_log(fio, count=6, config=small_config(segment_bytes=1 << 20))
    path = log.active_segment.log_path
    data = bytearray(fio.read_file(path))
    data[8:12] = (2**31 - 1).to_bytes(4, "big")  # the first batch now claims 2 GiB
    fio.files[path].data[:] = data
    got = log.read(0, 100)  # min_one_message: bounded by the segment, no huge allocation
    assert len(got.records) <= len(data)
    assert list(log.batches()) == []  # the walk stops at the damaged length


def test_the_load_truncates_the_epoch_cache_and_the_flush_writes_it_once_data_follows() -> None:
    # A leader records its epoch at its log end at once (KIP-279); an empty log reloaded holds
    # that entry past its end. The load drops it in memory only (Kafka's
    # truncateFromEndAsyncFlush: one fsync'd rewrite per log was most of a 10,000-partition
    # broker's start); the file is rewritten by the flush that follows data landing past the
    # entry's offset, and a load before that drops the entry again.
    fio = MemoryFileIO()
    checkpoint = f"{DIR}/leader-epoch-checkpoint"
    log = Log(DIR, small_config(), fio)
    log.append_as_leader(batch(b"a"), 0, now_ms=0)
    log.append_as_leader(batch(b"b"), 1, now_ms=0)
    log.flush()
    log.truncate_to(1)
    log.close()
    assert fio.read_file(checkpoint) == b"0\n2\n0 0\n1 1\n"
    again = reopen(fio, recovery_point=1, had_clean_shutdown=True)
    assert again.leader_epoch_cache.entries == [(0, 0)]  # epoch 1 starts at the log end
    assert fio.read_file(checkpoint) == b"0\n2\n0 0\n1 1\n"  # not rewritten by the load
    again.close()
    third = reopen(fio, recovery_point=1, had_clean_shutdown=True)
    assert third.leader_epoch_cache.entries == [(0, 0)]
    third.append_as_follower(batch(b"b", base_offset=1, epoch=0), now_ms=0)  # no new epoch
    third.flush()
    assert fio.read_file(checkpoint) == b"0\n1\n0 0\n"


def test_becoming_leader_writes_nothing_and_the_flush_writes_the_epoch_once_it_has_data() -> None:
    # One fsync'd checkpoint per new leadership was ~12 ms each on the broker's event loop:
    # 3,333 leaderships moved in a controlled shutdown cost ~20 s per receiving broker.
    fio = MemoryFileIO()
    checkpoint = f"{DIR}/leader-epoch-checkpoint"
    log = Log(DIR, small_config(), fio)
    log.append_as_leader(batch(b"a"), 0, now_ms=0)
    log.flush()
    assert fio.read_file(checkpoint) == b"0\n1\n0 0\n"
    fsyncs = fio.fsyncs
    log.assign_epoch_start_offset(3, 1)
    assert fio.fsyncs == fsyncs and fio.read_file(checkpoint) == b"0\n1\n0 0\n"
    log.flush()  # the new epoch has no batch yet: nothing to write
    assert fio.fsyncs == fsyncs
    log.append_as_leader(batch(b"b"), 3, now_ms=0)
    assert fio.read_file(checkpoint) == b"0\n1\n0 0\n"
    log.flush()
    assert fio.read_file(checkpoint) == b"0\n2\n0 0\n3 1\n"


@pytest.mark.parametrize("power_loss", [False, True])
def test_after_a_crash_the_epochs_past_the_recovery_point_come_from_the_batches(
    power_loss: bool,
) -> None:
    # The checkpoint lags the log between flushes. Here it holds (1, 1) from a leadership whose
    # batch a truncation removed; the follower then copied its leader's epoch-0 batches to the
    # same offsets. A kill -9 (the page cache survives) or a power loss before the next flush:
    # the reloaded cache must follow the batches, not the stale entry.
    fio = MemoryFileIO()
    log = Log(DIR, small_config(segment_bytes=1 << 20), fio)
    log.append_as_leader(batch(b"a"), 0, now_ms=0)
    log.assign_epoch_start_offset(1, 1)
    log.append_as_leader(batch(b"b"), 1, now_ms=0)
    log.flush()
    assert fio.read_file(f"{DIR}/leader-epoch-checkpoint") == b"0\n2\n0 0\n1 1\n"
    log.truncate_to(1)  # the new leader (epoch 2) ends epoch 0 at 6: our epoch 1 diverged
    for offset in range(1, 6):
        log.append_as_follower(batch(b"f", base_offset=offset, epoch=0), now_ms=0)
    log.assign_epoch_start_offset(4, 6)  # and we lead again, at the log end
    for _ in range(6, 8):
        log.append_as_leader(batch(b"g"), 4, now_ms=0)
    if power_loss:
        log.segments[-1].flush()  # the batches reached the disk, the checkpoint did not
        fio.crash()
    again = reopen(fio, recovery_point=log.recovery_point)
    assert again.log_end_offset == 8
    assert again.leader_epoch_cache.entries == [(0, 0), (4, 6)]
    assert [again.leader_epoch_cache.epoch_for_offset(b.base_offset) for b in again.batches()] \
        == [b.partition_leader_epoch for b in again.batches()]
    assert again.end_offset_for_epoch(1) == (0, 6)
