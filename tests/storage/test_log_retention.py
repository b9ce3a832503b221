"""Retention: retention.ms, retention.bytes, the log start offset (DeleteRecords), and only
below the high watermark."""

from __future__ import annotations

import pytest
from storage_helpers import batch, small_config

from tidelog.sim.disk import MemoryFileIO
from tidelog.storage.errors import OffsetOutOfRangeError
from tidelog.storage.log import Log
from tidelog.storage.log_config import LogConfig

DIR = "/data/r-0"


def make_log(config: LogConfig, count: int = 20, step_ms: int = 100) -> Log:
    log = Log(DIR, config, MemoryFileIO())
    for i in range(count):
        log.append_as_leader(batch(b"x" * 60, timestamp=i * step_ms), 0, now_ms=i * step_ms)
    return log


def test_retention_ms_deletes_old_segments_below_the_high_watermark() -> None:
    log = make_log(small_config(segment_bytes=300, retention_ms=1000))
    assert len(log.segments) >= 5
    assert log.delete_old_segments(now_ms=10_000) == 0  # HW 0: nothing is deletable
    log.update_high_watermark(log.log_end_offset)
    # batch i has timestamp i * 100: at 2000 ms, segments whose newest batch is < 1000 go
    expected = 0
    for segment in log.segments[:-1]:
        if segment.max_timestamp >= 1000:
            break
        expected += 1
    assert expected >= 2
    old_first = log.segments[expected].base_offset
    assert log.delete_old_segments(now_ms=2_000) == expected
    assert log.segments[0].base_offset == old_first
    assert log.log_start_offset == log.segments[0].base_offset
    assert all(s.max_timestamp >= 1000 for s in log.segments[:-1])
    first = next(iter(log.batches(log.log_start_offset)))
    assert first.base_offset == log.log_start_offset
    with pytest.raises(OffsetOutOfRangeError):
        log.read(0, 100)


def test_retention_ms_can_empty_the_log_by_rolling_first() -> None:
    log = make_log(small_config(segment_bytes=300, retention_ms=1000))
    log.update_high_watermark(log.log_end_offset)
    log.delete_old_segments(now_ms=100_000)
    assert log.log_start_offset == log.log_end_offset == 20
    assert len(log.segments) == 1 and log.segments[0].size == 0
    assert log.append_as_leader(batch(), 0, 0).first_offset == 20
    assert log.leader_epoch_cache.entries == [(0, 20)]


def test_retention_bytes_keeps_the_newest_data_within_the_limit() -> None:
    log = make_log(small_config(segment_bytes=300, retention_bytes=700))
    log.update_high_watermark(log.log_end_offset)
    before = log.size
    log.delete_old_segments(now_ms=0)
    assert log.size <= 700 + log.segments[0].size  # never more than one segment over
    assert log.size < before
    sizes = [s.size for s in log.segments]
    # deleting the oldest remaining segment would have gone under the limit
    assert log.size - sizes[0] < 700


def test_segments_above_the_high_watermark_are_kept() -> None:
    log = make_log(small_config(segment_bytes=300, retention_ms=0))
    log.update_high_watermark(log.segments[2].base_offset)
    log.delete_old_segments(now_ms=10**9)
    assert log.log_start_offset == log.segments[0].base_offset
    assert log.segments[0].base_offset <= log.high_watermark
    assert len(log.segments) >= 3


def test_delete_records_moves_the_log_start_then_retention_drops_whole_segments() -> None:
    log = make_log(small_config(segment_bytes=300))
    log.update_high_watermark(15)
    with pytest.raises(OffsetOutOfRangeError):
        log.maybe_increment_log_start_offset(16)  # never past the HW
    assert log.maybe_increment_log_start_offset(7)
    assert not log.maybe_increment_log_start_offset(5)
    assert log.log_start_offset == 7
    assert next(iter(log.batches(7))).base_offset == 7
    with pytest.raises(OffsetOutOfRangeError):
        log.read(6, 100)
    log.delete_old_segments(now_ms=0)
    assert log.segments[0].base_offset <= 7 < (
        log.segments[1].base_offset if len(log.segments) > 1 else 10**9
    )
    assert log.log_start_offset == 7


def test_deleted_segments_files_go_after_file_delete_delay_ms() -> None:
    log = make_log(small_config(segment_bytes=300, retention_ms=1000, file_delete_delay_ms=500))
    log.update_high_watermark(log.log_end_offset)
    gone = log.segments[0]
    assert log.delete_old_segments(now_ms=2_000) >= 1
    names = log.file_io.listdir(DIR)
    assert f"{gone.base_offset:020d}.log.deleted" in names  # renamed, still on disk
    assert f"{gone.base_offset:020d}.log" not in names
    assert log.delete_expired_files(now_ms=2_499) == 0
    assert log.delete_expired_files(now_ms=2_500) >= 1
    assert not any(n.endswith(".deleted") for n in log.file_io.listdir(DIR))


def test_file_delete_delay_ms_0_removes_the_files_at_once() -> None:
    log = make_log(small_config(segment_bytes=300, retention_ms=1000, file_delete_delay_ms=0))
    log.update_high_watermark(log.log_end_offset)
    assert log.delete_old_segments(now_ms=2_000) >= 1
    assert not any(n.endswith(".deleted") for n in log.file_io.listdir(DIR))
    assert log.pending_deletes == []


def test_retention_survives_a_restart() -> None:
    fio = MemoryFileIO()
    config = small_config(segment_bytes=300, retention_ms=1000)
    log = Log(DIR, config, fio)
    for i in range(20):
        log.append_as_leader(batch(b"x" * 60, timestamp=i * 100), 0, now_ms=i * 100)
    log.update_high_watermark(20)
    log.delete_old_segments(now_ms=2000)
    start = log.log_start_offset
    log.flush()
    log.close()
    fio.crash()
    again = Log(DIR, config, fio, log_start_offset=start, recovery_point=log.recovery_point)
    assert again.log_start_offset == start and again.log_end_offset == 20
