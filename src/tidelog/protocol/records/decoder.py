"""Decodes the records inside v2 batches: for clients, tools and the Spark connector, never for
the broker's write path (which only reads the 61-byte header).

A record is (zig-zag varints, -1 length = null):
    length varint, attributes int8, timestampDelta varlong, offsetDelta varint,
    keyLength varint, key, valueLength varint, value,
    headerCount varint, (headerKeyLength varint, headerKey utf-8, headerValueLength varint,
    headerValue)*

Decoding is one pass over the (decompressed) records section: in C (`_columnar.c`, which builds
the same lists about 10x faster) when it was built, else in Python over the section held as
`bytes` (indexing bytes is the fastest byte access CPython has).
Every length is checked against its record's bounds and every varint against its maximum width,
so garbage raises CorruptRecordError (never IndexError, never a hang), as Kafka's
DefaultRecord.readFrom does with InvalidRecordException.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import IntEnum
from functools import partial
from typing import Any, NamedTuple

from tidelog.protocol.native import load_native
from tidelog.protocol.records.batch import (
    COMPRESSION_CODEC_MASK,
    CURRENT_MAGIC,
    TIMESTAMP_TYPE_MASK,
    CorruptRecordError,
    RecordBatch,
    iter_batches,
)
from tidelog.protocol.records.compression import NONE, decompress

Header = tuple[str, bytes | None]
Headers = tuple[Header, ...]

_NO_HEADERS: Headers = ()

# The smallest record: length, attributes, timestampDelta, offsetDelta, key, value, headerCount.
_MIN_RECORD_SIZE = 7


class DecodedRecord(NamedTuple):
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: Headers


@dataclass(slots=True)
class RecordColumns:
    """Parallel lists, one entry per record (the shape Arrow builds arrays from)."""

    offsets: list[int] = field(default_factory=list)
    timestamps: list[int] = field(default_factory=list)
    keys: list[bytes | None] = field(default_factory=list)
    values: list[bytes | None] = field(default_factory=list)
    headers: list[Headers] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.offsets)

    def rows(self) -> list[DecodedRecord]:
        rows = zip(self.offsets, self.timestamps, self.keys, self.values, self.headers, strict=True)
        return list(map(_make_decoded_record, rows))


# tuple.__new__ bound to the class: builds a DecodedRecord in C, skipping NamedTuple's __new__.
_make_decoded_record = partial(tuple.__new__, DecodedRecord)


# The same decoding in C (_columnar.c), unless it was not built or TIDELOG_PURE_PYTHON=1.
_columnar = load_native("tidelog.protocol.records._columnar")
_native_decode_columns: Callable[..., tuple[list[Any], ...]] | None = (
    None if _columnar is None else _columnar.decode_columns
)


class ControlRecordType(IntEnum):
    """The `type` field of a control record's key (Kafka's ControlRecordType)."""

    ABORT = 0
    COMMIT = 1
    LEADER_CHANGE = 2
    SNAPSHOT_HEADER = 3
    SNAPSHOT_FOOTER = 4
    KRAFT_VERSION = 5
    KRAFT_VOTERS = 6


class EndTransactionMarker(NamedTuple):
    """A transaction's COMMIT or ABORT marker, the one record of a control batch."""

    control_type: ControlRecordType
    coordinator_epoch: int
    version: int = 0


_CONTROL_KEY = struct.Struct(">hh")  # version, type
_END_TXN_VALUE = struct.Struct(">hi")  # version, coordinatorEpoch


class RecordsSection(NamedTuple):
    """What decoding a batch's records needs, read from its header (see `open_records`)."""

    data: bytes | memoryview  # decompressed
    count: int
    base_offset: int
    base_timestamp: int
    fixed_timestamp: int | None  # LogAppendTime: every record carries the batch's max timestamp
    timestamp_type: int


def open_records(
    batch: RecordBatch, *, verify_crc: bool = True, copy: bool = True
) -> RecordsSection:
    """Check `batch` (magic, CRC32C when `verify_crc`, as Kafka's consumer does with
    check.crcs=true; a record count that cannot fit) and decompress its records section. With
    `copy=False` an uncompressed section stays a view of the batch."""
    if batch.magic != CURRENT_MAGIC:
        raise CorruptRecordError(f"unsupported magic {batch.magic} (only v2 is supported)")
    if verify_crc:
        batch.ensure_valid()
    (
        base_offset,
        _length,
        _epoch,
        _magic,
        _crc,
        attributes,
        _last_offset_delta,
        base_timestamp,
        max_timestamp,
        _pid,
        _pepoch,
        _seq,
        count,
    ) = batch.header()
    codec = attributes & COMPRESSION_CODEC_MASK
    data = (
        batch.records_data if codec == NONE and not copy else decompress(codec, batch.records_data)
    )
    if count < 0 or count > len(data) // _MIN_RECORD_SIZE:
        raise CorruptRecordError(
            f"record count {count} does not fit a records section of {len(data)} bytes"
        )
    log_append_time = attributes & TIMESTAMP_TYPE_MASK
    return RecordsSection(
        data,
        count,
        base_offset,
        base_timestamp,
        max_timestamp if log_append_time else None,
        1 if log_append_time else 0,
    )


def decode_columns(batch: RecordBatch, *, verify_crc: bool = True) -> RecordColumns:
    """Decode every record of `batch` into parallel lists. Control batches decode like any
    other (their key and value are the control record's); `verify_crc` checks CRC32C first."""
    if _native_decode_columns is not None:
        section = open_records(batch, verify_crc=verify_crc, copy=False)
        return RecordColumns(
            *_native_decode_columns(
                section.data,
                section.count,
                section.base_offset,
                section.base_timestamp,
                section.fixed_timestamp,
            )
        )
    section = open_records(batch, verify_crc=verify_crc)
    columns = RecordColumns()
    _decode_into(
        columns,
        section.data,
        section.count,
        section.base_offset,
        section.base_timestamp,
        section.fixed_timestamp,
    )
    return columns


def decode_records(batch: RecordBatch, *, verify_crc: bool = True) -> list[DecodedRecord]:
    """Decode every record of `batch` (offset, timestamp, key, value, headers)."""
    return decode_columns(batch, verify_crc=verify_crc).rows()


def iter_records(
    buf: bytes | bytearray | memoryview,
    *,
    verify_crc: bool = True,
    include_control: bool = False,
) -> Iterator[DecodedRecord]:
    """Records of every complete batch in `buf` (a fetch response's records field, a segment);
    control batches are skipped unless `include_control`, as a consumer does."""
    for batch in iter_batches(buf):
        if batch.is_control_batch and not include_control:
            continue
        yield from decode_records(batch, verify_crc=verify_crc)


def parse_control_record(key: bytes | None) -> tuple[int, ControlRecordType | int]:
    """(version, type) from a control record's key."""
    if key is None or len(key) < _CONTROL_KEY.size:
        raise CorruptRecordError(f"control record key too short: {key!r}")
    version, ctype = _CONTROL_KEY.unpack_from(key)
    if version < 0:
        raise CorruptRecordError(f"invalid control record version {version}")
    try:
        return version, ControlRecordType(ctype)
    except ValueError:
        return version, ctype  # unknown types are ignored by consumers, not errors


def parse_end_transaction_marker(record: DecodedRecord) -> EndTransactionMarker:
    """The COMMIT/ABORT marker held by a transaction control record."""
    _version, ctype = parse_control_record(record.key)
    if ctype not in (ControlRecordType.ABORT, ControlRecordType.COMMIT):
        raise CorruptRecordError(f"control record type {ctype} is not an end transaction marker")
    value = record.value
    if value is None or len(value) < _END_TXN_VALUE.size:
        raise CorruptRecordError(f"end transaction marker value too short: {value!r}")
    version, coordinator_epoch = _END_TXN_VALUE.unpack_from(value)
    if version < 0:
        raise CorruptRecordError(f"invalid end transaction marker version {version}")
    return EndTransactionMarker(ControlRecordType(ctype), coordinator_epoch, version)


def _varint_tail(data: bytes, pos: int, first: int, max_bytes: int) -> tuple[int, int]:
    """The raw (still zig-zagged) value of a varint whose first byte `first` had its
    continuation bit set; `pos` is just past that byte."""
    result = first & 0x7F
    shift = 7
    for _ in range(max_bytes - 1):
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            if max_bytes == 5 and result > 0xFFFFFFFF:
                raise CorruptRecordError(f"varint overflows 32 bits before position {pos}")
            if result > 0xFFFFFFFFFFFFFFFF:  # Java drops these bits; refusing them is safer
                raise CorruptRecordError(f"varint overflows 64 bits before position {pos}")
            return result, pos
        shift += 7
    raise CorruptRecordError(f"varint longer than {max_bytes} bytes before position {pos}")


def _decode_headers(data: bytes, pos: int, count: int, record_end: int) -> tuple[Headers, int]:
    if count < 0 or count > (record_end - pos) // 2:
        raise CorruptRecordError(f"invalid header count {count} in record ending at {record_end}")
    headers = []
    for _ in range(count):
        v = data[pos]
        pos += 1
        if v & 0x80:
            v, pos = _varint_tail(data, pos, v, 5)
        n = (v >> 1) ^ -(v & 1)
        if n < 0 or pos + n > record_end:
            raise CorruptRecordError(f"invalid header key length {n} at position {pos}")
        try:
            hkey = data[pos : pos + n].decode()
        except UnicodeDecodeError as exc:
            raise CorruptRecordError(f"header key is not utf-8 at position {pos}") from exc
        pos += n
        v = data[pos]
        pos += 1
        if v & 0x80:
            v, pos = _varint_tail(data, pos, v, 5)
        n = (v >> 1) ^ -(v & 1)
        if n < 0:
            if n != -1:
                raise CorruptRecordError(f"invalid header value length {n} at position {pos}")
            headers.append((hkey, None))
        else:
            if pos + n > record_end:
                raise CorruptRecordError(f"header value overruns its record at position {pos}")
            headers.append((hkey, data[pos : pos + n]))
            pos += n
    return tuple(headers), pos


def _decode_into(
    columns: RecordColumns,
    data: bytes,
    count: int,
    base_offset: int,
    base_timestamp: int,
    fixed_timestamp: int | None,
) -> None:
    # One loop with the single-byte varint case inlined: it is most fields of most records.
    # Reads past `data` raise IndexError (turned into CorruptRecordError below); reads past a
    # record's end are caught by the `pos != record_end` check, so no length is trusted.
    add_offset = columns.offsets.append
    add_timestamp = columns.timestamps.append
    add_key = columns.keys.append
    add_value = columns.values.append
    add_headers = columns.headers.append
    tail = _varint_tail
    end = len(data)
    pos = 0
    record_end = 0
    try:
        for _ in range(count):
            v = data[pos]
            pos += 1
            if v & 0x80:
                b = data[pos]
                if b & 0x80:
                    v, pos = tail(data, pos, v, 5)
                else:
                    v = (v & 0x7F) | (b << 7)
                    pos += 1
            length = (v >> 1) ^ -(v & 1)
            record_end = pos + length
            if length < _MIN_RECORD_SIZE - 1 or record_end > end:
                raise CorruptRecordError(f"invalid record length {length} at position {pos}")
            pos += 1  # record attributes: unused
            v = data[pos]
            pos += 1
            if v & 0x80:
                b = data[pos]
                if b & 0x80:
                    v, pos = tail(data, pos, v, 10)
                else:
                    v = (v & 0x7F) | (b << 7)
                    pos += 1
            timestamp_delta = (v >> 1) ^ -(v & 1)
            v = data[pos]
            pos += 1
            if v & 0x80:
                b = data[pos]
                if b & 0x80:
                    v, pos = tail(data, pos, v, 5)
                else:
                    v = (v & 0x7F) | (b << 7)
                    pos += 1
            add_offset(base_offset + ((v >> 1) ^ -(v & 1)))
            # As Kafka's DefaultRecord.readFrom: base + delta even when base is NO_TIMESTAMP.
            add_timestamp(
                base_timestamp + timestamp_delta if fixed_timestamp is None else fixed_timestamp
            )
            v = data[pos]
            pos += 1
            if v & 0x80:
                b = data[pos]
                if b & 0x80:
                    v, pos = tail(data, pos, v, 5)
                else:
                    v = (v & 0x7F) | (b << 7)
                    pos += 1
            n = (v >> 1) ^ -(v & 1)
            if n >= 0:
                add_key(data[pos : pos + n])
                pos += n
            elif n == -1:
                add_key(None)
            else:
                raise CorruptRecordError(f"invalid key length {n} at position {pos}")
            v = data[pos]
            pos += 1
            if v & 0x80:
                b = data[pos]
                if b & 0x80:
                    v, pos = tail(data, pos, v, 5)
                else:
                    v = (v & 0x7F) | (b << 7)
                    pos += 1
            n = (v >> 1) ^ -(v & 1)
            if n >= 0:
                add_value(data[pos : pos + n])
                pos += n
            elif n == -1:
                add_value(None)
            else:
                raise CorruptRecordError(f"invalid value length {n} at position {pos}")
            v = data[pos]
            pos += 1
            if v == 0:
                add_headers(_NO_HEADERS)
            else:
                if v & 0x80:
                    v, pos = tail(data, pos, v, 5)
                headers, pos = _decode_headers(data, pos, (v >> 1) ^ -(v & 1), record_end)
                add_headers(headers)
            if pos != record_end:
                raise CorruptRecordError(
                    f"record ending at {record_end} was read to {pos}: its length is wrong"
                )
    except IndexError:
        raise CorruptRecordError(
            f"records section truncated: record ending at {record_end} runs past {end}"
        ) from None
    if pos != end:
        raise CorruptRecordError(f"{end - pos} bytes remain after the batch's {count} records")
