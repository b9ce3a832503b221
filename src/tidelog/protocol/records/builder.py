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
    DELETE_HORIZON_FLAG_MASK,
    HEADER_STRUCT,
    LOG_OVERHEAD,
    NO_PARTITION_LEADER_EPOCH,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    TIMESTAMP_TYPE_MASK,
    TRANSACTIONAL_FLAG_MASK,
    RecordBatch,
)
from tidelog.protocol.records.compression import NONE, compress
from tidelog.protocol.records.decoder import DecodedRecord

Header = tuple[str, bytes | None]

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
# Precomputed single-byte zig-zag varints for -64..63: most lengths and deltas are small.
_SMALL_VARINTS = {v: bytes([((v << 1) ^ (v >> 63)) & 0xFF]) for v in range(-64, 64)}

END_TXN_MARKER_VERSION = 0
CONTROL_RECORD_KEY_VERSION = 0
CONTROL_TYPE_ABORT = 0
CONTROL_TYPE_COMMIT = 1


@dataclass(slots=True)
class Record:
    value: bytes | None
    key: bytes | None = None
    headers: Sequence[Header] = field(default_factory=tuple)
    timestamp: int | None = None  # ms; None = the batch's base timestamp


def write_varint(out: bytearray, value: int) -> None:
    """Zig-zag varint (Kafka's ByteUtils.writeVarlong; also used for 32-bit varints)."""
    small = _SMALL_VARINTS.get(value)
    if small is not None:
        out += small
        return
    v = ((value << 1) ^ (value >> 63)) & 0xFFFFFFFFFFFFFFFF
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)


def _write_bytes(out: bytearray, data: bytes | bytearray | memoryview | None) -> None:
    if data is None:
        out += b"\x01"  # zig-zag -1
    else:
        write_varint(out, len(data))
        out += data


def encode_record(out: bytearray, offset_delta: int, timestamp_delta: int, record: Record) -> None:
    """Append one record (length-prefixed) to `out`."""
    body = bytearray(b"\x00")  # record attributes: unused
    write_varint(body, timestamp_delta)
    write_varint(body, offset_delta)
    _write_bytes(body, record.key)
    _write_bytes(body, record.value)
    headers = record.headers
    if not headers:
        body += b"\x00"
    else:
        write_varint(body, len(headers))
        for hkey, hvalue in headers:
            if hkey is None:
                raise ValueError("a record header key cannot be null")
            _write_bytes(body, hkey.encode())
            _write_bytes(body, hvalue)
    write_varint(out, len(body))
    out += body


def build_batch(
    records: Iterable[Record],
    *,
    base_offset: int = 0,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
    compression: int = NONE,
    compression_level: int | None = None,
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
    test can stamp offsets in place).

    Timestamps: a record's own, else the batch base timestamp, which is `base_timestamp`, else
    the first record timestamp given (as Kafka's producer does), else `now_ms`. With
    `log_append_time` the batch is marked LogAppendTime and its max timestamp is `now_ms` (the
    broker's append time), which readers use for every record.
    """
    recs = list(records)
    if not recs:
        raise ValueError("a record batch needs at least one record")
    if transactional and producer_id == NO_PRODUCER_ID:
        raise ValueError("a transactional batch needs a producer id")
    if producer_id != NO_PRODUCER_ID and producer_epoch == NO_PRODUCER_EPOCH:
        raise ValueError("a batch with a producer id needs a producer epoch")
    if not _INT32_MIN <= base_sequence <= _INT32_MAX:
        raise ValueError(f"base sequence {base_sequence} is not an int32")
    if base_timestamp is None:
        base_timestamp = next((r.timestamp for r in recs if r.timestamp is not None), now_ms)
    body = bytearray()
    max_timestamp = -1
    for i, rec in enumerate(recs):
        ts = base_timestamp if rec.timestamp is None else rec.timestamp
        if ts > max_timestamp:
            max_timestamp = ts
        encode_record(body, i, ts - base_timestamp, rec)
    if log_append_time:
        max_timestamp = now_ms
    if compression != NONE:
        body = bytearray(compress(compression, body, compression_level))
    attributes = compression & COMPRESSION_CODEC_MASK
    if log_append_time:
        attributes |= TIMESTAMP_TYPE_MASK
    if transactional:
        attributes |= TRANSACTIONAL_FLAG_MASK
    if control:
        attributes |= CONTROL_FLAG_MASK
    out = bytearray(HEADER_STRUCT.size)
    try:
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
    except struct.error as exc:
        raise ValueError(f"a batch header field is out of range: {exc}") from exc
    out += body
    struct.pack_into(">I", out, CRC_OFFSET, crc32c.crc32c(memoryview(out)[ATTRIBUTES_OFFSET:]))
    return out


def build_values(values: Iterable[bytes], **kwargs: object) -> bytearray:
    """Shorthand: one batch holding these values with no keys."""
    return build_batch((Record(value=v) for v in values), **kwargs)  # type: ignore[arg-type]


def build_end_transaction_marker(
    *,
    commit: bool,
    producer_id: int,
    producer_epoch: int,
    coordinator_epoch: int,
    base_offset: int = 0,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
    timestamp: int = 0,
) -> bytearray:
    """A control batch holding one COMMIT or ABORT marker, as the transaction coordinator has
    the partition leaders write it (Kafka's EndTransactionMarker: key = version int16, type
    int16; value = version int16, coordinatorEpoch int32)."""
    key = struct.pack(
        ">hh", CONTROL_RECORD_KEY_VERSION, CONTROL_TYPE_COMMIT if commit else CONTROL_TYPE_ABORT
    )
    value = struct.pack(">hi", END_TXN_MARKER_VERSION, coordinator_epoch)
    return build_batch(
        [Record(value=value, key=key, timestamp=timestamp)],
        base_offset=base_offset,
        partition_leader_epoch=partition_leader_epoch,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        transactional=True,
        control=True,
    )


def build_empty_batch_header(original: RecordBatch) -> bytearray:
    """A batch of no records in place of `original` (Kafka's DefaultRecordBatch.writeEmptyHeader):
    the log cleaner keeps it when it removed every record of an active producer's last batch,
    so that the producer's last sequence and offset survive. Uncompressed; both timestamps are
    the original's max timestamp."""
    attributes = original.attributes & (TIMESTAMP_TYPE_MASK | TRANSACTIONAL_FLAG_MASK
                                        | CONTROL_FLAG_MASK)
    out = bytearray(HEADER_STRUCT.size)
    HEADER_STRUCT.pack_into(
        out, 0, original.base_offset, HEADER_STRUCT.size - LOG_OVERHEAD,
        original.partition_leader_epoch, CURRENT_MAGIC, 0, attributes,
        original.last_offset_delta, original.max_timestamp, original.max_timestamp,
        original.producer_id, original.producer_epoch, original.base_sequence, 0,
    )
    struct.pack_into(">I", out, CRC_OFFSET, crc32c.crc32c(memoryview(out)[ATTRIBUTES_OFFSET:]))
    return out


def build_retained_batch(
    original: RecordBatch,
    retained: Sequence[DecodedRecord],
    *,
    delete_horizon_ms: int | None = None,
) -> bytearray:
    """The log cleaner's rewrite of `original` holding only `retained` (Kafka's
    MemoryRecords.buildRetainedRecordsInto): the base offset, the last offset delta (so that the
    producer's last sequence survives), the producer id/epoch/base sequence, the partition leader
    epoch, the codec and the timestamp type are the original's; each record keeps its offset and
    timestamp. With `delete_horizon_ms` the batch carries the KIP-534 delete horizon in its base
    timestamp field (record timestamp deltas are relative to it)."""
    if not retained:
        raise ValueError("a retained batch needs at least one record")
    base_offset = original.base_offset
    log_append_time = original.timestamp_type == 1
    if delete_horizon_ms is not None:
        base_timestamp = delete_horizon_ms
    elif original.has_delete_horizon:
        base_timestamp = original.base_timestamp  # the horizon stays with the batch
    else:
        base_timestamp = retained[0].timestamp
    body = bytearray()
    max_timestamp = -1
    for rec in retained:
        max_timestamp = max(max_timestamp, rec.timestamp)
        encode_record(
            body, rec.offset - base_offset, rec.timestamp - base_timestamp,
            Record(rec.value, rec.key, rec.headers),
        )
    if log_append_time:
        max_timestamp = original.max_timestamp
    compression = original.compression_type
    if compression != NONE:
        body = bytearray(compress(compression, body))
    attributes = original.attributes & ~DELETE_HORIZON_FLAG_MASK
    if delete_horizon_ms is not None or original.has_delete_horizon:
        attributes |= DELETE_HORIZON_FLAG_MASK
    out = bytearray(HEADER_STRUCT.size)
    HEADER_STRUCT.pack_into(
        out, 0, base_offset, HEADER_STRUCT.size - LOG_OVERHEAD + len(body),
        original.partition_leader_epoch, CURRENT_MAGIC, 0, attributes,
        original.last_offset_delta, base_timestamp, max_timestamp, original.producer_id,
        original.producer_epoch, original.base_sequence, len(retained),
    )
    out += body
    struct.pack_into(">I", out, CRC_OFFSET, crc32c.crc32c(memoryview(out)[ATTRIBUTES_OFFSET:]))
    return out
