"""Builds RecordBatch v2 bytes: for tests, tools and tidelog's client (never the broker's
write path, which only stamps headers).

A record inside a batch is:
    length varint, attributes int8, timestampDelta varlong, offsetDelta varint,
    keyLength varint, key, valueLength varint, value, headerCount varint,
    (headerKeyLength varint, headerKey, headerValueLength varint, headerValue)*
with zig-zag varints and -1 lengths for null key / value.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import crc32c

from tidelog.protocol.records.batch import (
    ATTRIBUTES_OFFSET,
    COMPRESSION_CODEC_MASK,
    CONTROL_FLAG_MASK,
    CRC_OFFSET,
    CURRENT_MAGIC,
    HEADER_STRUCT,
    LOG_OVERHEAD,
    NO_PARTITION_LEADER_EPOCH,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    TIMESTAMP_TYPE_MASK,
    TRANSACTIONAL_FLAG_MASK,
)

Header = tuple[str, bytes | None]


@dataclass(slots=True)
class Record:
    value: bytes | None
    key: bytes | None = None
    headers: Sequence[Header] = field(default_factory=tuple)
    timestamp: int | None = None  # ms; None = the batch's base timestamp


def write_varint(out: bytearray, value: int) -> None:
    """Zig-zag varint (Kafka's ByteUtils.writeVarlong; also used for 32-bit varints)."""
    v = (value << 1) ^ (value >> 63)
    v &= 0xFFFFFFFFFFFFFFFF
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)


def _write_bytes(out: bytearray, data: bytes | None) -> None:
    if data is None:
        write_varint(out, -1)
    else:
        write_varint(out, len(data))
        out += data


def encode_record(out: bytearray, offset_delta: int, timestamp_delta: int, record: Record) -> None:
    body = bytearray()
    body.append(0)  # record attributes: unused
    write_varint(body, timestamp_delta)
    write_varint(body, offset_delta)
    _write_bytes(body, record.key)
    _write_bytes(body, record.value)
    write_varint(body, len(record.headers))
    for hkey, hvalue in record.headers:
        _write_bytes(body, hkey.encode())
        _write_bytes(body, hvalue)
    write_varint(out, len(body))
    out += body


def build_batch(
    records: Iterable[Record],
    *,
    base_offset: int = 0,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
    compression: int = 0,
    base_timestamp: int | None = None,
    log_append_time: bool = False,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    transactional: bool = False,
    control: bool = False,
    now_ms: int = 0,
) -> bytearray:
    """Encode `records` as one v2 batch. Returns a bytearray (writable, so that a broker-side
    test can stamp offsets in place)."""
    recs = list(records)
    if not recs:
        raise ValueError("a record batch needs at least one record")
    if base_timestamp is None:
        stamps = [r.timestamp for r in recs if r.timestamp is not None]
        base_timestamp = min(stamps) if stamps else now_ms
    body = bytearray()
    max_timestamp = base_timestamp
    for i, rec in enumerate(recs):
        ts = base_timestamp if rec.timestamp is None else rec.timestamp
        max_timestamp = max(max_timestamp, ts)
        encode_record(body, i, ts - base_timestamp, rec)
    if compression:
        from tidelog.protocol.records.compression import compress

        body = bytearray(compress(compression, bytes(body)))
    attributes = compression & COMPRESSION_CODEC_MASK
    if log_append_time:
        attributes |= TIMESTAMP_TYPE_MASK
    if transactional:
        attributes |= TRANSACTIONAL_FLAG_MASK
    if control:
        attributes |= CONTROL_FLAG_MASK
    out = bytearray(HEADER_STRUCT.size)
    HEADER_STRUCT.pack_into(
        out,
        0,
        base_offset,
        HEADER_STRUCT.size - LOG_OVERHEAD + len(body),
        partition_leader_epoch,
        CURRENT_MAGIC,
        0,  # crc, filled below
        attributes,
        len(recs) - 1,
        base_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        len(recs),
    )
    out += body
    struct.pack_into(">I", out, CRC_OFFSET, crc32c.crc32c(memoryview(out)[ATTRIBUTES_OFFSET:]))
    return out


def build_values(values: Iterable[bytes], **kwargs: object) -> bytearray:
    """Shorthand: one batch holding these values with no keys."""
    return build_batch((Record(value=v) for v in values), **kwargs)  # type: ignore[arg-type]
