"""Log: appends as leader and follower, reads, rolls, truncation, HW, flush."""

from __future__ import annotations

import pytest
from storage_helpers import batch, small_config

from tidelog.protocol.records.batch import CorruptRecordError, RecordBatch, iter_batches
from tidelog.protocol.records.builder import build_values
from tidelog.sim.disk import MemoryFileIO
from tidelog.storage.errors import (
    InvalidOffsetError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
)
from tidelog.storage.file_io import OsFileIO
from tidelog.storage.log import Log, parse_topic_partition
from tidelog.storage.log_config import LogConfig

DIR = "/data/orders-0"


def offsets(records: object) -> list[tuple[int, int]]:
    return [(b.base_offset, b.last_offset) for b in iter_batches(records)]  # type: ignore[arg-type]


@pytest.fixture
def fio() -> MemoryFileIO:
    return MemoryFileIO()


def new_log(fio: MemoryFileIO, config: LogConfig | None = None, **kw: int) -> Log:
    return Log(DIR, config or small_config(), fio, **kw)


def test_leader_append_assigns_offsets_from_the_log_end_and_stamps_the_epoch(fio: MemoryFileIO) -> None:
    log = new_log(fio)
    first = log.append_as_leader(batch(b"a", b"b", base_offset=77), leader_epoch=3, now_ms=0)
    assert (first.first_offset, first.last_offset, first.record_count) == (0, 1, 2)
    two = batch(b"c") + batch(b"d", b"e", b"f")
    second = log.append_as_leader(two, leader_epoch=3, now_ms=0)
    assert (second.first_offset, second.last_offset, second.batch_count) == (2, 5, 2)
    assert second.valid_bytes == len(two)
    assert log.log_end_offset == 6
    stored = list(log.batches())
    assert [(b.base_offset, b.last_offset) for b in stored] == [(0, 1), (2, 2), (3, 5)]
    assert all(b.partition_leader_epoch == 3 and b.is_valid() for b in stored)
    assert log.leader_epoch_cache.entries == [(3, 0)]
    # the caller's buffer is untouched: the log stamps its own copy
    assert RecordBatch(two).base_offset == 0


def test_a_new_leader_epoch_is_recorded_at_its_first_offset(fio: MemoryFileIO) -> None:
    log = new_log(fio)
    log.append_as_leader(batch(), 1, 0)
    log.append_as_leader(batch(), 1, 0)
    log.append_as_leader(batch(), 4, 0)
    assert log.leader_epoch_cache.entries == [(1, 0), (4, 2)]
    assert log.latest_epoch == 4


def test_leader_append_rejects_bad_batches_and_writes_nothing(fio: MemoryFileIO) -> None:
    log = new_log(fio)
    good = batch(b"ok")
    corrupt = bytearray(batch(b"bad"))
    corrupt[-1] ^= 0xFF
    with pytest.raises(CorruptRecordError, match="CRC"):
        log.append_as_leader(good + corrupt, 0, 0)
    with pytest.raises(CorruptRecordError, match="truncated"):
        log.append_as_leader(good + good[:30], 0, 0)
    wrong_magic = bytearray(good)
    wrong_magic[16] = 1
    with pytest.raises(CorruptRecordError, match="magic"):
        log.append_as_leader(wrong_magic, 0, 0)
    assert log.log_end_offset == 0 and log.size == 0


def test_an_append_larger_than_max_message_bytes_is_refused(fio: MemoryFileIO) -> None:
    log = new_log(fio, small_config(max_message_bytes=200))
    with pytest.raises(RecordTooLargeError) as info:
        log.append_as_leader(batch(b"x" * 300), 0, 0)
    assert info.value.error_code == 10 and info.value.max_size == 200
    assert log.log_end_offset == 0
    log.append_as_leader(batch(b"x" * 50), 0, 0)
    assert log.log_end_offset == 1


def test_log_append_time_topics_stamp_the_broker_time_and_keep_the_crc_valid(fio: MemoryFileIO) -> None:
    log = new_log(fio, small_config(message_timestamp_type="LogAppendTime"))
    info = log.append_as_leader(batch(timestamp=5), 0, now_ms=1234)
    assert info.max_timestamp == 1234 and info.log_append_time == 1234
    (stored,) = log.batches()
    assert stored.max_timestamp == 1234 and stored.timestamp_type == 1 and stored.is_valid()


def test_follower_append_keeps_the_leaders_offsets_and_epochs(fio: MemoryFileIO) -> None:
    leader = Log("/data/l-0", small_config(), fio)
    for epoch in (0, 0, 2, 2, 5):
        leader.append_as_leader(batch(b"x", b"y"), epoch, 0)
    follower = Log("/data/f-0", small_config(), fio)
    data = leader.read(0, 10_000).records
    info = follower.append_as_follower(data, 0)
    assert (info.first_offset, info.last_offset) == (0, 9)
    assert follower.log_end_offset == 10
    assert [bytes(b.buf) for b in follower.batches()] == [bytes(b.buf) for b in leader.batches()]
    assert follower.leader_epoch_cache.entries == [(0, 0), (2, 4), (5, 8)]


def test_follower_append_ignores_a_partial_trailing_batch(fio: MemoryFileIO) -> None:
    log = new_log(fio)
    data = batch(b"a") + batch(b"b", base_offset=1)
    info = log.append_as_follower(data[: len(data) - 5], 0)
    assert (info.first_offset, info.last_offset) == (0, 0) and log.log_end_offset == 1


def test_follower_append_rejects_offsets_below_the_log_end_or_out_of_order(fio: MemoryFileIO) -> None:
    log = new_log(fio)
    log.append_as_follower(batch(b"a", b"b", base_offset=0), 0)
    with pytest.raises(InvalidOffsetError, match="below the log end offset 2"):
        log.append_as_follower(batch(base_offset=1), 0)
    with pytest.raises(InvalidOffsetError, match="out of order"):
        log.append_as_follower(batch(base_offset=5) + batch(base_offset=4), 0)
    assert log.log_end_offset == 2
    corrupt = batch(base_offset=2)
    corrupt[-1] ^= 1
    with pytest.raises(CorruptRecordError):
        log.append_as_follower(corrupt, 0)
    # a gap is allowed (compacted leaders), the LEO follows the last batch
    log.append_as_follower(batch(base_offset=10), 0)
    assert log.log_end_offset == 11


def test_read_returns_whole_batches_from_the_one_holding_the_offset(fio: MemoryFileIO) -> None:
    log = new_log(fio, small_config(segment_bytes=100_000))
    for i in range(20):
        log.append_as_leader(batch(b"%d" % i, b"second"), 0, 0)
    size = len(batch(b"1", b"second"))
    info = log.read(7, max_bytes=3 * size + 10)
    assert offsets(info.records) == [(6, 7), (8, 9), (10, 11)]
    assert info.first_offset == 7
    assert offsets(log.read(0, size - 1).records) == [(0, 1)]  # min_one_message
    assert len(log.read(0, size - 1, min_one_message=False).records) == 0
    assert len(log.read(40, 1000).records) == 0  # at the LEO: empty


def test_read_never_returns_a_batch_at_or_past_max_offset(fio: MemoryFileIO) -> None:
    log = new_log(fio)
    for _ in range(5):
        log.append_as_leader(batch(b"a", b"b"), 0, 0)
    log.update_high_watermark(6)
    assert offsets(log.read(0, 10_000, max_offset=log.high_watermark).records) == [
        (0, 1), (2, 3), (4, 5)
    ]
    assert len(log.read(6, 10_000, max_offset=6).records) == 0
    # a batch straddling max_offset is withheld whole
    assert offsets(log.read(0, 10_000, max_offset=5).records) == [(0, 1), (2, 3)]


def test_read_outside_the_log_raises_offset_out_of_range_with_both_ends(fio: MemoryFileIO) -> None:
    log = new_log(fio)
    log.truncate_fully_and_start_at(100)
    log.append_as_leader(batch(), 0, 0)
    for bad in (99, 102, -1):
        with pytest.raises(OffsetOutOfRangeError) as info:
            log.read(bad, 1000)
        assert (info.value.offset, info.value.log_start_offset, info.value.log_end_offset) == (
            bad, 100, 101,
        )
        assert info.value.error_code == 1
        assert "[100, 101)" in str(info.value)


def test_reads_cross_segments_and_use_the_index(fio: MemoryFileIO) -> None:
    log = new_log(fio)
    for i in range(60):
        log.append_as_leader(batch(b"value-%02d" % i), 0, 0)
    assert len(log.segments) > 3
    assert any(len(s.offset_index) for s in log.segments)
    for target in range(60):
        got = offsets(log.read(target, 1).records)
        assert got == [(target, target)]
    assert [b.base_offset for b in log.batches(55)] == [55, 56, 57, 58, 59]


def test_roll_by_segment_bytes(fio: MemoryFileIO) -> None:
    log = new_log(fio, small_config(segment_bytes=300))
    size = len(batch(b"x" * 40))
    for _ in range(10):
        log.append_as_leader(batch(b"x" * 40), 0, 0)
    assert all(s.size <= 300 for s in log.segments)
    assert len(log.segments) == -(-10 * size // ((300 // size) * size))
    names = fio.listdir(DIR)
    assert "00000000000000000000.log" in names
    assert f"{log.segments[1].base_offset:020d}.log" in names
    assert f"{log.segments[1].base_offset:020d}.index" in names


def test_roll_by_segment_ms_uses_the_first_batch_timestamp(fio: MemoryFileIO) -> None:
    log = new_log(fio, small_config(segment_bytes=1 << 20, segment_ms=1000))
    log.append_as_leader(batch(timestamp=10_000), 0, now_ms=10_000)
    log.append_as_leader(batch(timestamp=10_900), 0, now_ms=10_900)
    assert len(log.segments) == 1
    log.append_as_leader(batch(timestamp=11_001), 0, now_ms=11_001)
    assert [s.base_offset for s in log.segments] == [0, 2]


def test_roll_when_the_offset_index_is_full(fio: MemoryFileIO) -> None:
    log = new_log(fio, small_config(segment_bytes=1 << 20, index_interval_bytes=0,
                                    segment_index_bytes=24))
    for _ in range(12):
        log.append_as_leader(batch(), 0, 0)
    assert len(log.segments) >= 2
    assert all(len(s.offset_index) <= 3 for s in log.segments)
    assert [b.base_offset for b in log.batches()] == list(range(12))


def test_roll_flushes_the_old_segment_and_moves_the_recovery_point(fio: MemoryFileIO) -> None:
    log = new_log(fio, small_config(segment_bytes=300))
    for _ in range(8):
        log.append_as_leader(batch(b"x" * 40), 0, 0)
    assert log.recovery_point == log.active_segment.base_offset > 0


def test_truncate_to_drops_everything_from_the_target(fio: MemoryFileIO) -> None:
    log = new_log(fio)
    for epoch in range(10):
        log.append_as_leader(batch(b"a" * 30, b"b"), epoch, 0)
    log.update_high_watermark(20)
    assert len(log.segments) > 1
    assert log.truncate_to(9)  # inside the batch 8..9: it goes whole
    assert log.log_end_offset == 8
    assert [b.base_offset for b in log.batches()] == [0, 2, 4, 6]
    assert log.high_watermark == 8
    assert log.leader_epoch_cache.entries == [(0, 0), (1, 2), (2, 4), (3, 6)]
    assert not log.truncate_to(8)
    assert not log.truncate_to(100)
    info = log.append_as_leader(batch(), 7, 0)
    assert info.first_offset == 8
    assert log.end_offset_for_epoch(3) == (3, 8)


def test_truncate_to_the_log_end_drops_an_epoch_assigned_there_with_nothing_written(
        fio: MemoryFileIO) -> None:
    # A leader of epoch 6 that appended nothing before it became a follower (sim seed 93):
    # as Kafka's truncateTo, the epoch cache is cut even when no batch goes, or the follower
    # keeps asking the new leader about epoch 6.
    log = new_log(fio)
    log.append_as_leader(batch(), 3, 0)
    log.assign_epoch_start_offset(6, log.log_end_offset)
    assert log.latest_epoch == 6
    assert not log.truncate_to(log.log_end_offset)
    assert log.leader_epoch_cache.entries == [(3, 0)]


def test_truncate_to_a_segment_boundary_keeps_an_empty_active_segment(fio: MemoryFileIO) -> None:
    log = new_log(fio, small_config(segment_bytes=300))
    for _ in range(10):
        log.append_as_leader(batch(b"x" * 40), 0, 0)
    boundary = log.segments[1].base_offset
    log.truncate_to(boundary)
    assert log.log_end_offset == boundary
    assert [b.last_offset for b in log.batches()][-1] == boundary - 1
    log.append_as_leader(batch(), 0, 0)
    assert log.log_end_offset == boundary + 1


def test_truncate_fully_and_start_at(fio: MemoryFileIO) -> None:
    log = new_log(fio)
    for _ in range(30):
        log.append_as_leader(batch(b"x" * 30), 2, 0)
    log.truncate_fully_and_start_at(500)
    assert (log.log_start_offset, log.log_end_offset, log.high_watermark) == (500, 500, 500)
    assert log.recovery_point == 500
    assert log.leader_epoch_cache.entries == []
    assert fio.listdir(DIR) == [
        "00000000000000000500.log", "leader-epoch-checkpoint",
    ]
    assert log.append_as_leader(batch(), 3, 0).first_offset == 500
    assert log.leader_epoch_cache.entries == [(3, 500)]


def test_truncate_below_the_log_start_restarts_the_log_there(fio: MemoryFileIO) -> None:
    log = new_log(fio)
    log.truncate_fully_and_start_at(50)
    log.append_as_leader(batch(), 0, 0)
    log.truncate_to(10)
    assert (log.log_start_offset, log.log_end_offset) == (10, 10)


def test_high_watermark_is_clamped_to_the_log(fio: MemoryFileIO) -> None:
    log = new_log(fio)
    log.append_as_leader(batch(b"a", b"b", b"c"), 0, 0)
    assert log.update_high_watermark(10) == 3
    assert log.update_high_watermark(-4) == 0
    assert log.update_high_watermark(2) == 2


def test_flush_messages_flushes_after_that_many_messages(fio: MemoryFileIO) -> None:
    log = new_log(fio, small_config(flush_messages=3))
    log.append_as_leader(batch(b"a", b"b"), 0, 0)
    assert log.recovery_point == 0 and fio.unflushed_bytes() > 0
    log.append_as_leader(batch(b"c"), 0, 0)
    assert log.recovery_point == 3
    assert fio.files[f"{DIR}/00000000000000000000.log"].unflushed_bytes == 0


def test_flush_ms_flushes_when_the_last_flush_is_that_old(fio: MemoryFileIO) -> None:
    log = new_log(fio, small_config(flush_ms=1000), now_ms=0)
    log.append_as_leader(batch(), 0, 10)
    assert not log.maybe_flush(999)
    assert log.maybe_flush(1000)
    assert log.recovery_point == 1
    assert not log.maybe_flush(5000)  # nothing new to flush


def test_offset_for_timestamp_finds_the_first_batch_at_or_after(fio: MemoryFileIO) -> None:
    log = new_log(fio)
    for i in range(30):
        log.append_as_leader(batch(timestamp=1000 + 10 * i), 0, 0)
    assert log.offset_for_timestamp(1000) == (0, 1000)
    assert log.offset_for_timestamp(1055) == (6, 1060)
    assert log.offset_for_timestamp(1290) == (29, 1290)
    assert log.offset_for_timestamp(5000) is None


def test_offset_for_timestamp_finds_the_record_inside_a_batch(fio: MemoryFileIO) -> None:
    from tidelog.protocol.records.builder import Record, build_batch

    log = new_log(fio, small_config(segment_bytes=1 << 20))
    stamps = [100, 300, 200, 400, 500]  # CreateTime records need not be ordered
    log.append_as_leader(build_batch([Record(b"v", timestamp=t) for t in stamps]), 0, 0)
    log.append_as_leader(build_batch([Record(b"w", timestamp=t) for t in (600, 700)]), 0, 0)
    assert log.offset_for_timestamp(250) == (1, 300)
    assert log.offset_for_timestamp(301) == (3, 400)
    assert log.offset_for_timestamp(650) == (6, 700)
    log.update_high_watermark(7)
    log.maybe_increment_log_start_offset(2)
    assert log.offset_for_timestamp(250) == (3, 400)  # never below the log start


def test_parse_topic_partition() -> None:
    assert parse_topic_partition("orders-3") == ("orders", 3)
    assert parse_topic_partition("my-topic-12") == ("my-topic", 12)
    for bad in ("orders", "orders-", "-1", "orders-x", "replication-offset-checkpoint"):
        assert parse_topic_partition(bad) is None


def test_an_empty_append_changes_nothing(fio: MemoryFileIO) -> None:
    log = new_log(fio)
    info = log.append_as_leader(b"", 0, 0)
    assert info.record_count == 0 and log.log_end_offset == 0
    assert log.latest_epoch is None


def test_compressed_batches_are_stored_without_decoding(fio: MemoryFileIO) -> None:
    from tidelog.protocol.records.decoder import decode_records

    log = new_log(fio, small_config(segment_bytes=1 << 20))
    for codec in (1, 2, 3, 4):
        log.append_as_leader(build_values([b"x" * 100] * 5, compression=codec), 1, 0)
    stored = list(log.batches())
    assert [b.compression_type for b in stored] == [1, 2, 3, 4]
    assert [r.offset for r in decode_records(stored[2])] == [10, 11, 12, 13, 14]


@pytest.mark.parametrize("timestamp_type", ["CreateTime", "LogAppendTime"])
def test_large_appends_take_the_writev_path_with_the_same_result(
    fio: MemoryFileIO, tmp_path: object, timestamp_type: str
) -> None:
    # >= 256 KiB: headers are stamped in a side buffer and written with the caller's bytes
    big = b"".join(bytes(batch(b"x" * 30_000, b"y" * 30_000, timestamp=7)) for _ in range(6))
    big += bytes(batch(b"z" * 100_000, timestamp=9))
    assert len(big) >= 256 * 1024
    config = small_config(segment_bytes=1 << 30, message_timestamp_type=timestamp_type)
    for file_io, d in ((fio, DIR), (OsFileIO(), f"{tmp_path}/w-0")):
        log = Log(d, config, file_io)
        log.append_as_leader(batch(b"first"), 0, 0)
        caller = bytes(big)
        info = log.append_as_leader(caller, 4, now_ms=555)
        assert caller == big  # untouched
        assert (info.first_offset, info.last_offset, info.batch_count) == (1, 13, 7)
        stored = list(log.batches(1))
        assert [(b.base_offset, b.last_offset) for b in stored] == [
            (1 + 2 * i, 2 + 2 * i) for i in range(6)
        ] + [(13, 13)]
        assert all(b.is_valid() and b.partition_leader_epoch == 4 for b in stored)
        expected_ts = 555 if timestamp_type == "LogAppendTime" else 9
        assert info.max_timestamp == expected_ts
        assert stored[-1].max_timestamp == expected_ts
        assert [bytes(b.records_data) for b in stored] == [
            bytes(b.records_data) for b in iter_batches(big)
        ]


def test_segment_jitter_rolls_earlier_by_a_per_segment_amount(fio: MemoryFileIO) -> None:
    config = small_config(segment_bytes=1 << 20, segment_ms=1000, segment_jitter_ms=500)
    jitters = {Log(f"/data/j{i}-0", config, fio).active_segment.roll_jitter_ms for i in range(8)}
    assert all(0 <= j < 500 for j in jitters) and len(jitters) > 1
    log = Log("/data/j0-0", config, fio)
    jitter = log.active_segment.roll_jitter_ms
    log.append_as_leader(batch(timestamp=0), 0, 0)
    log.append_as_leader(batch(timestamp=1000 - jitter), 0, 0)
    assert len(log.segments) == 1
    log.append_as_leader(batch(timestamp=1001 - jitter), 0, 0)
    assert len(log.segments) == 2


def test_truncating_the_batch_that_holds_the_log_start_restarts_the_log(fio: MemoryFileIO) -> None:
    log = new_log(fio)
    log.append_as_leader(batch(b"a", b"b", b"c", b"d"), 0, 0)  # offsets 0..3
    log.update_high_watermark(4)
    log.maybe_increment_log_start_offset(2)  # inside the batch
    assert log.truncate_to(3)  # the batch 0..3 goes whole
    assert (log.log_start_offset, log.log_end_offset, log.high_watermark) == (3, 3, 3)
