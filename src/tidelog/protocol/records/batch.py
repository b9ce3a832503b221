"""A zero-copy view over Kafka's RecordBatch v2 (magic 2) header.

Layout (big-endian), offsets in bytes:

    0  baseOffset int64          27 baseTimestamp int64
    8  batchLength int32         35 maxTimestamp int64
    12 partitionLeaderEpoch int32 43 producerId int64
    16 magic int8                51 producerEpoch int16
    17 crc uint32                53 baseSequence int32
    21 attributes int16          57 recordCount int32
    23 lastOffsetDelta int32     61 records...

batchLength counts the bytes after itself, so a batch is batchLength + 12 bytes long. The CRC32C
covers attributes..end, so baseOffset and partitionLeaderEpoch can be rewritten in place without
recomputing it: this is how the broker assigns offsets on its write path without decoding records.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

import crc32c

HEADER_STRUCT = struct.Struct(">qiibIhiqqqhii")
HEADER_SIZE = HEADER_STRUCT.size  # 61
LOG_OVERHEAD = 12  # baseOffset + batchLength: the part not counted by batchLength

BASE_OFFSET_OFFSET = 0
LENGTH_OFFSET = 8
PARTITION_LEADER_EPOCH_OFFSET = 12
MAGIC_OFFSET = 16
CRC_OFFSET = 17
ATTRIBUTES_OFFSET = 21
LAST_OFFSET_DELTA_OFFSET = 23
BASE_TIMESTAMP_OFFSET = 27
MAX_TIMESTAMP_OFFSET = 35
PRODUCER_ID_OFFSET = 43
PRODUCER_EPOCH_OFFSET = 51
BASE_SEQUENCE_OFFSET = 53
RECORD_COUNT_OFFSET = 57
RECORDS_OFFSET = 61

CURRENT_MAGIC = 2
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_PARTITION_LEADER_EPOCH = -1
NO_TIMESTAMP = -1

COMPRESSION_CODEC_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08
TRANSACTIONAL_FLAG_MASK = 0x10
CONTROL_FLAG_MASK = 0x20
DELETE_HORIZON_FLAG_MASK = 0x40

_I64 = struct.Struct(">q")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I16 = struct.Struct(">h")
_I8 = struct.Struct(">b")


class CorruptRecordError(ValueError):
    """A batch whose framing, magic, CRC or records are invalid (Kafka's CORRUPT_MESSAGE)."""

    error_code = 2

    def __init__(self, message: str, position: int = 0) -> None:
        super().__init__(message)
        self.position = position


class RecordBatch:
    """A view over one complete batch: `buf` is exactly the batch's bytes.

    Reading a field never copies the batch; writers (`set_base_offset`,
    `set_partition_leader_epoch`) need a writable buffer (bytearray or mmap-backed memoryview).
    """

    __slots__ = ("buf",)

    def __init__(self, buf: bytes | bytearray | memoryview) -> None:
        self.buf = buf if isinstance(buf, memoryview) else memoryview(buf)
        if len(self.buf) < HEADER_SIZE:
            raise CorruptRecordError(f"{len(self.buf)} bytes cannot hold a record batch header")

    # -- header fields -------------------------------------------------------------------
    @property
    def base_offset(self) -> int:
        return _I64.unpack_from(self.buf, BASE_OFFSET_OFFSET)[0]

    @property
    def batch_length(self) -> int:
        return _I32.unpack_from(self.buf, LENGTH_OFFSET)[0]

    @property
    def partition_leader_epoch(self) -> int:
        return _I32.unpack_from(self.buf, PARTITION_LEADER_EPOCH_OFFSET)[0]

    @property
    def magic(self) -> int:
        return _I8.unpack_from(self.buf, MAGIC_OFFSET)[0]

    @property
    def crc(self) -> int:
        return _U32.unpack_from(self.buf, CRC_OFFSET)[0]

    @property
    def attributes(self) -> int:
        return _I16.unpack_from(self.buf, ATTRIBUTES_OFFSET)[0]

    @property
    def last_offset_delta(self) -> int:
        return _I32.unpack_from(self.buf, LAST_OFFSET_DELTA_OFFSET)[0]

    @property
    def base_timestamp(self) -> int:
        return _I64.unpack_from(self.buf, BASE_TIMESTAMP_OFFSET)[0]

    @property
    def max_timestamp(self) -> int:
        return _I64.unpack_from(self.buf, MAX_TIMESTAMP_OFFSET)[0]

    @property
    def producer_id(self) -> int:
        return _I64.unpack_from(self.buf, PRODUCER_ID_OFFSET)[0]

    @property
    def producer_epoch(self) -> int:
        return _I16.unpack_from(self.buf, PRODUCER_EPOCH_OFFSET)[0]

    @property
    def base_sequence(self) -> int:
        return _I32.unpack_from(self.buf, BASE_SEQUENCE_OFFSET)[0]

    @property
    def record_count(self) -> int:
        return _I32.unpack_from(self.buf, RECORD_COUNT_OFFSET)[0]

    def header(self) -> tuple[int, ...]:
        """All 13 header fields at once (one unpack), in layout order."""
        return HEADER_STRUCT.unpack_from(self.buf, 0)

    # -- derived -------------------------------------------------------------------------
    @property
    def size_in_bytes(self) -> int:
        return len(self.buf)

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1

    @property
    def last_sequence(self) -> int:
        seq = self.base_sequence
        if seq == NO_SEQUENCE:
            return NO_SEQUENCE
        # Sequences wrap at int32 max, as in Kafka's DefaultRecordBatch.incrementSequence.
        return (seq + self.last_offset_delta) % 0x80000000

    @property
    def compression_type(self) -> int:
        return self.attributes & COMPRESSION_CODEC_MASK

    @property
    def timestamp_type(self) -> int:
        """0 = CreateTime, 1 = LogAppendTime."""
        return 1 if self.attributes & TIMESTAMP_TYPE_MASK else 0

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_FLAG_MASK)

    @property
    def is_control_batch(self) -> bool:
        return bool(self.attributes & CONTROL_FLAG_MASK)

    @property
    def has_delete_horizon(self) -> bool:
        return bool(self.attributes & DELETE_HORIZON_FLAG_MASK)

    @property
    def delete_horizon_ms(self) -> int | None:
        """Set by the log cleaner (KIP-534): the base timestamp field then holds the horizon."""
        return self.base_timestamp if self.has_delete_horizon else None

    @property
    def has_producer_id(self) -> bool:
        return self.producer_id != NO_PRODUCER_ID

    @property
    def has_sequence(self) -> bool:
        return self.base_sequence != NO_SEQUENCE

    @property
    def records_data(self) -> memoryview:
        """The (possibly compressed) records section, without copying."""
        return self.buf[RECORDS_OFFSET:]

    # -- integrity -----------------------------------------------------------------------
    def compute_crc(self) -> int:
        return crc32c.crc32c(self.buf[ATTRIBUTES_OFFSET:])

    def is_valid(self) -> bool:
        return (
            self.magic == CURRENT_MAGIC
            and self.batch_length + LOG_OVERHEAD == len(self.buf)
            and self.compute_crc() == self.crc
        )

    def ensure_valid(self) -> None:
        if self.magic != CURRENT_MAGIC:
            raise CorruptRecordError(f"unsupported magic {self.magic} (only v2 is supported)")
        if self.batch_length + LOG_OVERHEAD != len(self.buf):
            raise CorruptRecordError(
                f"record batch length field {self.batch_length} does not match its "
                f"{len(self.buf)} bytes"
            )
        stored, computed = self.crc, self.compute_crc()
        if stored != computed:
            raise CorruptRecordError(
                f"record batch at offset {self.base_offset} is corrupt: "
                f"stored crc {stored:#010x} != computed {computed:#010x}"
            )

    # -- in-place writers (outside the CRC) ------------------------------------------------
    def set_base_offset(self, offset: int) -> None:
        _I64.pack_into(self.buf, BASE_OFFSET_OFFSET, offset)

    def set_partition_leader_epoch(self, epoch: int) -> None:
        _I32.pack_into(self.buf, PARTITION_LEADER_EPOCH_OFFSET, epoch)

    # -- in-place writer inside the CRC --------------------------------------------------
    def set_max_timestamp(self, timestamp_type: int, max_timestamp: int) -> None:
        """Set the timestamp type bit and the max timestamp, then recompute the CRC: what the
        broker does for message.timestamp.type=LogAppendTime (Kafka's setMaxTimestamp). Records
        keep their deltas; readers of a LogAppendTime batch use max_timestamp for every record."""
        if self.timestamp_type == timestamp_type and self.max_timestamp == max_timestamp:
            return
        attributes = self.attributes & ~TIMESTAMP_TYPE_MASK
        if timestamp_type == 1:
            attributes |= TIMESTAMP_TYPE_MASK
        elif timestamp_type != 0:
            raise ValueError(f"timestamp type {timestamp_type} is neither 0 nor 1")
        _I16.pack_into(self.buf, ATTRIBUTES_OFFSET, attributes)
        _I64.pack_into(self.buf, MAX_TIMESTAMP_OFFSET, max_timestamp)
        _U32.pack_into(self.buf, CRC_OFFSET, self.compute_crc())

    def __repr__(self) -> str:
        return (
            f"RecordBatch(base_offset={self.base_offset}, last_offset={self.last_offset}, "
            f"epoch={self.partition_leader_epoch}, count={self.record_count}, "
            f"size={self.size_in_bytes}, compression={self.compression_type})"
        )


def is_transactional_at(buf: bytes | bytearray | memoryview, position: int = 0) -> bool:
    """Whether the batch header at `position` is a v2 one with the transactional flag (Kafka's
    RecordBatch.isTransactional), read from the header alone."""
    return (buf[position + MAGIC_OFFSET] == CURRENT_MAGIC
            and bool(buf[position + ATTRIBUTES_OFFSET + 1] & TRANSACTIONAL_FLAG_MASK))


def batch_size_at(buf: memoryview, position: int, max_batch_size: int | None = None) -> int | None:
    """The total size of the batch starting at `position`, or None when the header is incomplete.

    Raises CorruptRecordError when the length field cannot describe a v2 batch, or describes one
    larger than `max_batch_size` (Kafka's reader takes its max message size the same way, so that
    a garbage length is not mistaken for a batch still arriving).
    """
    if len(buf) - position < LOG_OVERHEAD + 5:
        return None
    length = _I32.unpack_from(buf, position + LENGTH_OFFSET)[0]
    if length < HEADER_SIZE - LOG_OVERHEAD:
        raise CorruptRecordError(f"record batch size {length} is smaller than a header", position)
    if max_batch_size is not None and length + LOG_OVERHEAD > max_batch_size:
        raise CorruptRecordError(
            f"record batch size {length + LOG_OVERHEAD} exceeds the maximum {max_batch_size}",
            position,
        )
    magic = _I8.unpack_from(buf, position + MAGIC_OFFSET)[0]
    if magic != CURRENT_MAGIC:
        raise CorruptRecordError(f"unsupported magic {magic} (only v2 is supported)", position)
    return length + LOG_OVERHEAD


def iter_batches(
    buf: bytes | bytearray | memoryview, start: int = 0, max_batch_size: int | None = None
) -> Iterator[RecordBatch]:
    """Yield every complete batch in `buf`; a partial trailing batch ends the iteration cleanly
    (Kafka fetch responses may cut the last batch). Bad framing raises CorruptRecordError with
    the position of the bad batch."""
    view = buf if isinstance(buf, memoryview) else memoryview(buf)
    position = start
    end = len(view)
    while position < end:
        size = batch_size_at(view, position, max_batch_size)
        if size is None or position + size > end:
            return
        yield RecordBatch(view[position : position + size])
        position += size


def complete_batches_size(
    buf: bytes | bytearray | memoryview, max_batch_size: int | None = None
) -> int:
    """Bytes of `buf` covered by complete batches (the valid prefix; framing errors raise)."""
    total = 0
    for batch in iter_batches(buf, max_batch_size=max_batch_size):
        total += batch.size_in_bytes
    return total
