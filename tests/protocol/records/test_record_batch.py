"""The 61-byte RecordBatch v2 header view: CRC coverage, in-place stamping, batch framing."""

from __future__ import annotations

import struct

import pytest

from tidelog.protocol.records import (
    CorruptRecordError,
    Record,
    RecordBatch,
    batch_size_at,
    build_batch,
    build_values,
    complete_batches_size,
    decode_records,
    iter_batches,
)
from tidelog.protocol.records.batch import (
    ATTRIBUTES_OFFSET,
    CRC_OFFSET,
    HEADER_SIZE,
    LENGTH_OFFSET,
    MAGIC_OFFSET,
    is_transactional_at,
)


def _sample_batch(**kwargs: object) -> bytearray:
    records = [
        Record(value=b"alpha", key=b"k1", headers=[("h", b"v")], timestamp=1_000),
        Record(value=None, key=b"k2", timestamp=1_250),
        Record(value=b"gamma" * 5, key=None, timestamp=990),
    ]
    return build_batch(records, **kwargs)  # type: ignore[arg-type]


def test_header_fields_read_back_what_the_builder_wrote() -> None:
    buf = _sample_batch(
        base_offset=500,
        partition_leader_epoch=7,
        producer_id=99,
        producer_epoch=4,
        base_sequence=12,
        transactional=True,
    )
    batch = RecordBatch(buf)
    assert batch.base_offset == 500
    assert batch.partition_leader_epoch == 7
    assert batch.magic == 2
    assert batch.record_count == 3
    assert batch.last_offset_delta == 2
    assert (batch.last_offset, batch.next_offset) == (502, 503)
    assert batch.base_timestamp == 1_000  # the first record's, as Kafka's producer does
    assert batch.max_timestamp == 1_250
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (99, 4, 12)
    assert batch.last_sequence == 14
    assert batch.is_transactional and not batch.is_control_batch
    assert batch.has_producer_id and batch.has_sequence
    assert batch.timestamp_type == 0
    assert batch.size_in_bytes == len(buf) == batch.batch_length + 12
    assert batch.header()[0] == 500
    assert batch.is_valid()


def test_every_single_byte_change_in_attributes_to_end_fails_the_crc() -> None:
    buf = _sample_batch()
    assert RecordBatch(buf).is_valid()
    for position in range(ATTRIBUTES_OFFSET, len(buf)):
        for flip in (0x01, 0x80, 0xFF):
            corrupted = bytearray(buf)
            corrupted[position] ^= flip
            batch = RecordBatch(corrupted)
            assert not batch.is_valid(), (position, flip)
            with pytest.raises(CorruptRecordError, match="crc"):
                batch.ensure_valid()


def test_a_changed_crc_field_or_magic_is_detected() -> None:
    for position in range(CRC_OFFSET, CRC_OFFSET + 4):
        corrupted = _sample_batch()
        corrupted[position] ^= 0x10
        with pytest.raises(CorruptRecordError, match="crc"):
            RecordBatch(corrupted).ensure_valid()
    corrupted = _sample_batch()
    corrupted[MAGIC_OFFSET] = 1
    with pytest.raises(CorruptRecordError, match="magic"):
        RecordBatch(corrupted).ensure_valid()


def test_stamping_base_offset_and_leader_epoch_in_place_keeps_the_crc_valid() -> None:
    buf = _sample_batch(base_offset=0, partition_leader_epoch=-1)
    crc_before = RecordBatch(buf).crc
    view = RecordBatch(memoryview(buf))  # writes go through a view into the same bytearray
    view.set_base_offset(1_234_567_890_123)
    view.set_partition_leader_epoch(42)
    batch = RecordBatch(buf)
    assert (batch.base_offset, batch.partition_leader_epoch) == (1_234_567_890_123, 42)
    assert batch.crc == crc_before
    batch.ensure_valid()
    assert [r.offset for r in decode_records(batch)] == [
        1_234_567_890_123,
        1_234_567_890_124,
        1_234_567_890_125,
    ]


def test_stamping_a_read_only_buffer_is_refused() -> None:
    batch = RecordBatch(bytes(_sample_batch()))
    with pytest.raises(TypeError):
        batch.set_base_offset(5)


def test_log_append_time_rewrites_attributes_and_max_timestamp_and_recomputes_the_crc() -> None:
    buf = _sample_batch()
    batch = RecordBatch(buf)
    batch.set_max_timestamp(1, 77_777)
    assert batch.timestamp_type == 1
    assert batch.max_timestamp == 77_777
    batch.ensure_valid()
    assert [r.timestamp for r in decode_records(batch)] == [77_777] * 3
    batch.set_max_timestamp(0, 1_250)  # back to CreateTime: the records' own timestamps
    batch.ensure_valid()
    assert [r.timestamp for r in decode_records(batch)] == [1_000, 1_250, 990]
    with pytest.raises(ValueError):
        batch.set_max_timestamp(2, 0)


def test_a_view_shorter_than_a_header_or_with_a_wrong_length_field_is_corrupt() -> None:
    with pytest.raises(CorruptRecordError):
        RecordBatch(b"\x00" * (HEADER_SIZE - 1))
    buf = _sample_batch()
    with pytest.raises(CorruptRecordError, match="length"):
        RecordBatch(buf + b"\x00").ensure_valid()
    assert not RecordBatch(buf[:-1]).is_valid()


def _three_batches() -> tuple[bytes, list[int]]:
    batches = [
        build_values([b"a", b"b"], base_offset=0),
        build_values([b"c" * 100], base_offset=2),
        build_values([b"d", b"e", b"f"], base_offset=3, compression=1),
    ]
    return b"".join(batches), [len(b) for b in batches]


def test_iteration_yields_every_complete_batch_and_stops_at_a_partial_trailing_one() -> None:
    buf, sizes = _three_batches()
    boundaries = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
    for cut in range(len(buf) + 1):
        batches = list(iter_batches(buf[:cut]))
        expected = max(i for i, b in enumerate(boundaries) if b <= cut)
        assert len(batches) == expected, cut
        assert complete_batches_size(buf[:cut]) == boundaries[expected]
        for batch in batches:
            batch.ensure_valid()
    assert [b.base_offset for b in iter_batches(buf)] == [0, 2, 3]


def test_iteration_from_a_start_position() -> None:
    buf, sizes = _three_batches()
    assert [b.base_offset for b in iter_batches(buf, start=sizes[0])] == [2, 3]


def test_bad_framing_raises_with_the_position_of_the_bad_batch() -> None:
    buf, sizes = _three_batches()
    bad_at = sizes[0]
    too_small = bytearray(buf)
    struct.pack_into(">i", too_small, bad_at + LENGTH_OFFSET, 10)
    negative = bytearray(buf)
    struct.pack_into(">i", negative, bad_at + LENGTH_OFFSET, -1)
    old_magic = bytearray(buf)
    old_magic[bad_at + MAGIC_OFFSET] = 1
    for corrupted in (too_small, negative, old_magic):
        it = iter_batches(corrupted)
        assert next(it).base_offset == 0  # batches before the bad one are still served
        with pytest.raises(CorruptRecordError) as info:
            next(it)
        assert info.value.position == bad_at
        assert info.value.error_code == 2  # CORRUPT_MESSAGE


def test_a_length_beyond_the_maximum_batch_size_is_corrupt_not_partial() -> None:
    buf, sizes = _three_batches()
    garbage_length = bytearray(buf)
    struct.pack_into(">i", garbage_length, sizes[0] + LENGTH_OFFSET, 2**31 - 1)
    assert len(list(iter_batches(garbage_length))) == 1  # without a bound: looks partial
    it = iter_batches(garbage_length, max_batch_size=1 << 20)
    next(it)
    with pytest.raises(CorruptRecordError, match="exceeds") as info:
        next(it)
    assert info.value.position == sizes[0]
    assert complete_batches_size(buf, max_batch_size=max(sizes)) == len(buf)


def test_batch_size_at_needs_the_length_and_magic_before_answering() -> None:
    buf, sizes = _three_batches()
    view = memoryview(buf)
    assert batch_size_at(view, 0) == sizes[0]
    assert batch_size_at(view[:16], 0) is None  # magic not in yet
    assert batch_size_at(view[:17], 0) == sizes[0]


def test_last_sequence_wraps_at_int32_max_like_kafka() -> None:
    buf = build_values(
        [b"x"] * 5, producer_id=1, producer_epoch=0, base_sequence=2**31 - 2, now_ms=5
    )
    assert RecordBatch(buf).last_sequence == 2


def test_builder_refuses_inconsistent_producer_state() -> None:
    with pytest.raises(ValueError, match="producer id"):
        build_values([b"x"], transactional=True)
    with pytest.raises(ValueError, match="epoch"):
        build_values([b"x"], producer_id=3)
    with pytest.raises(ValueError, match="at least one"):
        build_values([])
    with pytest.raises(ValueError, match="out of range"):
        build_values([b"x"], partition_leader_epoch=2**31)


def test_the_transactional_flag_is_read_from_the_header_at_a_position() -> None:
    plain = build_values([b"x"], producer_id=1, producer_epoch=0)
    txn = build_values([b"x"], producer_id=1, producer_epoch=0, transactional=True)
    both = bytes(plain) + bytes(txn)
    assert not is_transactional_at(both) and is_transactional_at(both, len(plain))
    assert RecordBatch(txn).is_transactional
    v1 = bytearray(txn)
    v1[MAGIC_OFFSET] = 1  # the flag is a v2 attribute only
    assert not is_transactional_at(v1)
