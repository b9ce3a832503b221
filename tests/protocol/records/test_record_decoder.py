"""Builder -> decoder round trips, cross-checked with kafka-python's independent implementation."""

from __future__ import annotations

import struct

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from tidelog.protocol.records import (
    GZIP,
    LZ4,
    NONE,
    SNAPPY,
    ZSTD,
    ControlRecordType,
    CorruptRecordError,
    Record,
    RecordBatch,
    UnsupportedCompressionTypeError,
    build_batch,
    build_end_transaction_marker,
    build_values,
    decode_columns,
    decode_records,
    iter_records,
    parse_control_record,
    parse_end_transaction_marker,
)
from tidelog.protocol.records.batch import ATTRIBUTES_OFFSET, CRC_OFFSET
from tidelog.protocol.records.builder import encode_record, write_varint
from tidelog.protocol.records.decoder import _varint_tail

CODECS = [NONE, GZIP, SNAPPY, LZ4, ZSTD]

headers_st = st.lists(
    st.tuples(st.text(max_size=12), st.none() | st.binary(max_size=40)), max_size=4
).map(tuple)
record_st = st.builds(
    Record,
    value=st.none() | st.binary(max_size=300),
    key=st.none() | st.binary(max_size=40),
    headers=headers_st,
    timestamp=st.none() | st.integers(min_value=0, max_value=2**45),
)


def _expected_timestamps(records: list[Record], now_ms: int) -> list[int]:
    base = next((r.timestamp for r in records if r.timestamp is not None), now_ms)
    return [base if r.timestamp is None else r.timestamp for r in records]


def _kafka_python_view(buf: bytes) -> list[tuple[object, ...]]:
    batch = DefaultRecordBatch(bytes(buf))
    assert batch.validate_crc()
    return [(r.offset, r.timestamp, r.key, r.value, tuple(r.headers)) for r in batch]


producer_st = st.none() | st.tuples(
    st.integers(min_value=0, max_value=2**63 - 1),
    st.integers(min_value=0, max_value=2**15 - 1),
    st.integers(min_value=0, max_value=2**31 - 1),
    st.booleans(),
)


@settings(max_examples=150, deadline=None)
@given(
    records=st.lists(record_st, min_size=1, max_size=25),
    codec=st.sampled_from(CODECS),
    base_offset=st.integers(min_value=0, max_value=2**62),
    now_ms=st.integers(min_value=0, max_value=2**45),
    producer=producer_st,
    log_append_time=st.booleans(),
)
def test_round_trip_with_every_codec(
    records: list[Record],
    codec: int,
    base_offset: int,
    now_ms: int,
    producer: tuple[int, int, int, bool] | None,
    log_append_time: bool,
) -> None:
    pid, epoch, sequence, transactional = producer or (-1, -1, -1, False)
    buf = build_batch(
        records,
        base_offset=base_offset,
        compression=codec,
        now_ms=now_ms,
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=sequence,
        transactional=transactional,
        log_append_time=log_append_time,
    )
    batch = RecordBatch(buf)
    batch.ensure_valid()
    assert batch.compression_type == codec
    assert batch.record_count == len(records)
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (pid, epoch, sequence)
    assert batch.is_transactional is transactional
    assert batch.timestamp_type == int(log_append_time)
    decoded = decode_records(batch)
    timestamps = _expected_timestamps(records, now_ms)
    assert [r.offset for r in decoded] == list(range(base_offset, base_offset + len(records)))
    if log_append_time:
        assert batch.max_timestamp == now_ms
        assert [r.timestamp for r in decoded] == [now_ms] * len(records)
    else:
        assert batch.max_timestamp == max(timestamps)
        assert [r.timestamp for r in decoded] == timestamps
    assert [r.key for r in decoded] == [r.key for r in records]
    assert [r.value for r in decoded] == [r.value for r in records]
    assert [r.headers for r in decoded] == [tuple(r.headers) for r in records]
    # An independent reader agrees with what was written and with our reading of it.
    assert _kafka_python_view(buf) == [tuple(r) for r in decoded]


@settings(max_examples=40, deadline=None)
@given(records=st.lists(record_st, min_size=1, max_size=15), codec=st.sampled_from(CODECS))
def test_decodes_what_kafka_python_builds(records: list[Record], codec: int) -> None:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=codec,
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 20,
    )
    timestamps = _expected_timestamps(records, 1_000)
    for i, (r, ts) in enumerate(zip(records, timestamps, strict=True)):
        builder.append(i, ts, r.key, r.value, list(r.headers))
    buf = builder.build()
    decoded = decode_records(RecordBatch(buf))
    assert [tuple(r) for r in decoded] == _kafka_python_view(buf)


def test_columns_are_the_records_transposed() -> None:
    records = [
        Record(value=b"v%d" % i, key=None if i % 2 else b"k", headers=[("h", b"%d" % i)] * (i % 3))
        for i in range(50)
    ]
    batch = RecordBatch(build_batch(records, base_offset=10, now_ms=99, compression=LZ4))
    columns = decode_columns(batch)
    assert len(columns) == 50
    assert columns.offsets == list(range(10, 60))
    assert columns.timestamps == [99] * 50
    assert columns.keys == [r.key for r in records]
    assert columns.values == [r.value for r in records]
    assert columns.headers == [tuple(r.headers) for r in records]
    assert columns.rows() == decode_records(batch)


def test_varints_of_every_width_round_trip() -> None:
    values = [0, -1, 1, 63, -64, 64, -65, 8191, 8192, 2**20, -(2**31), 2**31 - 1, 2**62, -(2**63)]
    for value in values:
        out = bytearray()
        write_varint(out, value)
        raw, position = (out[0], 1) if out[0] < 0x80 else _varint_tail(bytes(out), 1, out[0], 10)
        assert position == len(out)
        assert (raw >> 1) ^ -(raw & 1) == value


def test_large_values_and_timestamp_deltas_use_multi_byte_varints() -> None:
    records = [
        Record(value=b"x" * 70_000, key=b"k" * 300, timestamp=10),
        Record(value=b"y", timestamp=10 + 2**40),  # a varlong delta of six bytes
        Record(value=b"z", timestamp=0),  # negative delta
    ]
    decoded = decode_records(RecordBatch(build_batch(records)))
    assert [(len(r.value or b""), r.timestamp) for r in decoded] == [
        (70_000, 10),
        (1, 10 + 2**40),
        (1, 0),
    ]


def test_log_append_time_batches_give_every_record_the_batch_max_timestamp() -> None:
    records = [Record(value=b"a", timestamp=5), Record(value=b"b", timestamp=9)]
    buf = build_batch(records, log_append_time=True, now_ms=123_456)
    batch = RecordBatch(buf)
    assert batch.timestamp_type == 1
    assert batch.max_timestamp == 123_456
    assert [r.timestamp for r in decode_records(batch)] == [123_456, 123_456]
    assert [r[1] for r in _kafka_python_view(buf)] == [123_456, 123_456]


def test_producer_fields_survive_and_idempotent_batches_decode() -> None:
    buf = build_values(
        [b"a", b"b", b"c"],
        producer_id=4000,
        producer_epoch=2,
        base_sequence=41,
        transactional=True,
        compression=ZSTD,
    )
    batch = RecordBatch(buf)
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (4000, 2, 41)
    assert batch.last_sequence == 43
    assert batch.is_transactional
    kp = DefaultRecordBatch(bytes(buf))
    assert (kp.producer_id, kp.producer_epoch, kp.base_sequence, kp.is_transactional) == (
        4000,
        2,
        41,
        True,
    )
    assert [r.value for r in decode_records(batch)] == [b"a", b"b", b"c"]


@pytest.mark.parametrize("commit", [True, False])
def test_end_transaction_markers_are_control_batches(commit: bool) -> None:
    buf = build_end_transaction_marker(
        commit=commit, producer_id=77, producer_epoch=5, coordinator_epoch=9, timestamp=1_000
    )
    batch = RecordBatch(buf)
    batch.ensure_valid()
    assert batch.is_control_batch and batch.is_transactional
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (77, 5, -1)
    (record,) = decode_records(batch)
    marker = parse_end_transaction_marker(record)
    expected_type = ControlRecordType.COMMIT if commit else ControlRecordType.ABORT
    assert marker.control_type == expected_type
    assert marker.coordinator_epoch == 9
    assert parse_control_record(record.key) == (0, expected_type)
    # kafka-python reads it as a control record of the same type.
    (kp_record,) = list(DefaultRecordBatch(bytes(buf)))
    assert kp_record.commit is commit and kp_record.abort is not commit


def test_iter_records_skips_control_batches_unless_asked() -> None:
    buf = (
        build_values(
            [b"a", b"b"], base_offset=0, producer_id=1, producer_epoch=0, transactional=True
        )
        + build_end_transaction_marker(
            commit=True, producer_id=1, producer_epoch=0, coordinator_epoch=0, base_offset=2
        )
        + build_values([b"c"], base_offset=3)
    )
    assert [r.value for r in iter_records(buf)] == [b"a", b"b", b"c"]
    assert [r.offset for r in iter_records(buf, include_control=True)] == [0, 1, 2, 3]


def test_control_record_parsing_rejects_bad_keys_and_values() -> None:
    with pytest.raises(CorruptRecordError):
        parse_control_record(None)
    with pytest.raises(CorruptRecordError):
        parse_control_record(b"\x00")
    assert parse_control_record(struct.pack(">hh", 0, 99)) == (0, 99)  # unknown: kept, not fatal
    leader_change = decode_records(
        RecordBatch(build_batch([Record(key=struct.pack(">hh", 0, 2), value=b"")], control=True))
    )[0]
    with pytest.raises(CorruptRecordError, match="not an end transaction marker"):
        parse_end_transaction_marker(leader_change)


def test_crc_is_checked_before_decoding_unless_disabled() -> None:
    buf = build_values([b"payload"])
    buf[buf.index(b"payload")] ^= 0x20
    with pytest.raises(CorruptRecordError, match="crc"):
        decode_records(RecordBatch(buf))
    assert decode_records(RecordBatch(buf), verify_crc=False)[0].value == b"Payload"


def _with_records_section(section: bytes, count: int, attributes: int = 0) -> RecordBatch:
    """A batch header (valid CRC) around an arbitrary records section."""
    buf = build_values([b"x"])
    del buf[61:]
    buf += section
    struct.pack_into(">i", buf, 8, len(buf) - 12)
    struct.pack_into(">h", buf, ATTRIBUTES_OFFSET, attributes)
    struct.pack_into(">i", buf, 57, count)
    struct.pack_into(">I", buf, CRC_OFFSET, crc32c.crc32c(memoryview(buf)[ATTRIBUTES_OFFSET:]))
    return RecordBatch(buf)


def _one_record_section(record: Record) -> bytes:
    out = bytearray()
    encode_record(out, 0, 0, record)
    return bytes(out)


def _framed(body: bytes) -> bytes:
    """A record: its length varint, then `body` (attributes, deltas, key, value, headers)."""
    out = bytearray()
    write_varint(out, len(body))
    return bytes(out + body)


# Bodies start with attributes 0, timestamp delta 0, offset delta 0; zig-zag bytes:
# 0x00 = 0, 0x01 = -1, 0x02 = 1, 0x03 = -2, 0x06 = 3, 0x50 = 40, 0x7f = -64.
@pytest.mark.parametrize(
    ("section", "count", "message"),
    [
        (_one_record_section(Record(value=b"v")), 2, "count"),
        (_one_record_section(Record(value=b"v")) + b"\x00", 1, "remain"),
        (b"\xff\xff\xff\xff\xff\xff\x01" + b"\x00" * 10, 1, "varint"),
        (b"\xff\xff\xff\xff\x7f" + b"\x00" * 10, 1, "32 bits"),
        (_framed(b"\x00\x00\x00\x03\x01\x00"), 1, "key length"),
        (_framed(b"\x00\x00\x00\x01\x03\x00"), 1, "value length"),
        (_framed(b"\x00\x00\x00\x01\x01\x02\x02\xff\x01"), 1, "utf-8"),
        (_framed(b"\x00\x00\x00\x01\x01\x02\x02a\x03"), 1, "header value"),
        (_framed(b"\x00\x00\x00\x01\x01\x02\x03a\x01"), 1, "header key length"),
        (_framed(b"\x00\x00\x00\x01\x01\x7f"), 1, "header count"),
        (_framed(b"\x00\x00\x00\x01\x01\x50"), 1, "header count"),
        (b"\x20\x00\x00\x00\x01\x01\x00", 1, "record length"),  # runs past the section
        (b"\x01\x00\x00\x00\x01\x01\x00", 1, "record length"),  # negative length
        (_framed(b"\x00\x00\x00\x06ab\x01\x00") + b"\x00" * 4, 1, "read to"),  # key overruns
        (_framed(b"\x00\x00\x00\x06ab\x01\x00"), 1, "truncated"),
    ],
)
def test_malformed_records_raise_corrupt_record_error(
    section: bytes, count: int, message: str
) -> None:
    with pytest.raises(CorruptRecordError, match=message):
        decode_records(_with_records_section(section, count))


def test_unknown_compression_in_a_batch_is_unsupported_not_a_crash() -> None:
    batch = _with_records_section(_one_record_section(Record(value=b"v")), 1, attributes=6)
    with pytest.raises(UnsupportedCompressionTypeError):
        decode_records(batch)


def test_an_empty_batch_decodes_to_nothing() -> None:
    assert decode_records(_with_records_section(b"", 0)) == []
