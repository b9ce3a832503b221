"""The topic configs a leader applies to a produced batch before it is appended (Kafka's
LogValidator), for the two that need more than the 61-byte header:

- ``message.timestamp.before.max.ms`` / ``message.timestamp.after.max.ms`` (KIP-937; each falls
  back to the deprecated ``message.timestamp.difference.max.ms``), CreateTime topics: every
  record's timestamp must be at most that many ms before / after the broker's clock, else the
  whole append is refused with INVALID_TIMESTAMP (32).
- ``compression.type`` other than ``producer``: a batch whose codec differs from the topic's is
  recompressed with the topic's codec (``uncompressed`` = none). The records themselves are kept
  byte for byte (v2 offset and timestamp deltas are relative to the batch, so they do not
  change); the header keeps its producer id, epoch, sequence, flags and timestamps, gets the new
  codec bits, length and CRC32C.

- ``cleanup.policy`` with ``compact``: every record must have a key, else the append is
  refused with INVALID_RECORD (87), Kafka's "Compacted topic cannot accept message without key".

Each runs only when the topic sets it (the defaults leave the batch bytes alone, so the
broker's write path stays zero-copy).
"""

from __future__ import annotations

import crc32c

from tidelog.protocol.records.batch import (
    ATTRIBUTES_OFFSET,
    COMPRESSION_CODEC_MASK,
    CRC_OFFSET,
    HEADER_SIZE,
    HEADER_STRUCT,
    LOG_OVERHEAD,
    NO_TIMESTAMP,
    TIMESTAMP_TYPE_MASK,
    CorruptRecordError,
    RecordBatch,
    iter_batches,
)
from tidelog.protocol.records.compression import CODECS_BY_NAME, GZIP, NONE, ZSTD, compress
from tidelog.protocol.records.decoder import decode_columns, open_records
from tidelog.storage.errors import StorageError
from tidelog.storage.log_config import LONG_MAX, LogConfig

__all__ = [
    "InvalidRecordError",
    "InvalidTimestampError",
    "needs_validation",
    "target_codec",
    "validate_and_convert",
]


class InvalidTimestampError(StorageError):
    """A record's CreateTime is too far from the broker's clock (Kafka's INVALID_TIMESTAMP)."""

    error_code = 32


class InvalidRecordError(StorageError):
    """A record the topic cannot take (Kafka's INVALID_RECORD): a null key in a compacted topic."""

    error_code = 87


def target_codec(compression_type: str) -> int | None:
    """The codec a topic's compression.type asks for; None for ``producer`` (keep the batch's)."""
    if compression_type == "producer":
        return None
    if compression_type == "uncompressed":
        return NONE
    return CODECS_BY_NAME[compression_type]


def needs_validation(config: LogConfig) -> bool:
    """Whether `validate_and_convert` has anything to do for this topic."""
    return config.compression_type != "producer" or _compacted(config) or (
        config.message_timestamp_type == "CreateTime"
        and min(config.timestamp_bounds_ms) < LONG_MAX
    )


def _compacted(config: LogConfig) -> bool:
    return "compact" in config.cleanup_policy.split(",")


def validate_and_convert(records: bytes | bytearray | memoryview, config: LogConfig,
                         now_ms: int) -> bytes | bytearray | memoryview:
    """Check timestamps and recompress as `config` says; returns `records` itself when no batch
    changed. Raises CorruptRecordError for a batch that fails its CRC (never "repaired" by
    recompression) and InvalidTimestampError. Incomplete trailing bytes are left for the log's
    own validation to refuse."""
    codec = target_codec(config.compression_type)
    before, after = (config.timestamp_bounds_ms
                     if config.message_timestamp_type == "CreateTime" else (LONG_MAX, LONG_MAX))
    compacted = _compacted(config)
    parts: list[bytes | memoryview] = []
    changed = False
    view = memoryview(records)
    end = 0
    for batch in iter_batches(view):
        raw = view[end : end + batch.size_in_bytes]
        end += batch.size_in_bytes
        if min(before, after) < LONG_MAX and not batch.attributes & TIMESTAMP_TYPE_MASK:
            _check_timestamps(batch, now_ms, before, after)
        if compacted and not batch.is_control_batch and None in decode_columns(batch).keys:
            raise InvalidRecordError(
                "Compacted topic cannot accept message without key in topic partition")
        if codec is None or batch.compression_type == codec:
            parts.append(raw)
            continue
        parts.append(_recompress(batch, codec, _level(config, codec)))
        changed = True
    if not changed:
        return records
    parts.append(view[end:])
    return b"".join(parts)


def _check_timestamps(batch: RecordBatch, now_ms: int, before: int, after: int) -> None:
    for ts in decode_columns(batch).timestamps:
        if ts != NO_TIMESTAMP and not now_ms - before <= ts <= now_ms + after:
            # Kafka's LogValidator.validateTimestamp message.
            raise InvalidTimestampError(
                f"Timestamp {ts} of message is out of range. The timestamp should be within "
                f"[{now_ms - before}, {now_ms + after}]")


def _level(config: LogConfig, codec: int) -> int | None:
    """The topic's level for `codec` (KIP-390); None: the codec's default (gzip -1 is zlib's;
    lz4 takes only 9, Kafka's fast compressor: log_config.UNSUPPORTED)."""
    if codec == GZIP:
        return None if config.compression_gzip_level == -1 else config.compression_gzip_level
    if codec == ZSTD:
        return config.compression_zstd_level
    return None


def _recompress(batch: RecordBatch, codec: int, level: int | None) -> bytes:
    if batch.is_control_batch:
        raise CorruptRecordError("a producer may not send control batches")
    section = open_records(batch)  # checks the CRC first
    body = compress(codec, section.data, level)
    (base_offset, _length, epoch, magic, _crc, attributes, last_delta, base_ts, max_ts, pid,
     pepoch, seq, count) = batch.header()
    attributes = (attributes & ~COMPRESSION_CODEC_MASK) | codec
    length = HEADER_SIZE - LOG_OVERHEAD + len(body)
    header = bytearray(HEADER_STRUCT.pack(base_offset, length, epoch, magic, 0, attributes,
                                          last_delta, base_ts, max_ts, pid, pepoch, seq, count))
    crc = crc32c.crc32c(body, crc32c.crc32c(bytes(header[ATTRIBUTES_OFFSET:])))
    header[CRC_OFFSET : CRC_OFFSET + 4] = crc.to_bytes(4, "big")
    return bytes(header) + body
