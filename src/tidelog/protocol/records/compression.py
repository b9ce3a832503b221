"""Record-batch compression with Kafka's framing for each codec (attributes bits 0-2).

    1 gzip    RFC 1952 gzip stream (Java's GZIPOutputStream); several members are accepted.
    2 snappy  Written as the Java client writes it: xerial SnappyOutputStream framing
              (magic ``\\x82SNAPPY\\x00``, version 1, compatible version 1, then
              [int32 length, raw snappy block] per 32 KiB of input). Read: xerial-framed or a
              bare raw snappy block (librdkafka writes the latter).
    3 lz4     LZ4 frame format as Kafka's Lz4BlockOutputStream writes it: independent 64 KiB
              blocks, no block or content checksum, no content size. Kafka's reader decodes every
              block on its own, so linked blocks (the lz4 library default) would not interoperate.
    4 zstd    A zstd frame; frames without a content size (streaming writers) are accepted.

Unknown codecs raise UnsupportedCompressionTypeError (Kafka's UNSUPPORTED_COMPRESSION_TYPE);
undecodable payloads raise CorruptRecordError (CORRUPT_MESSAGE). cramjam does the codec work.
"""

from __future__ import annotations

import struct

import cramjam

from tidelog.protocol.records.batch import CorruptRecordError

NONE = 0
GZIP = 1
SNAPPY = 2
LZ4 = 3
ZSTD = 4

CODEC_NAMES: dict[int, str] = {
    NONE: "none",
    GZIP: "gzip",
    SNAPPY: "snappy",
    LZ4: "lz4",
    ZSTD: "zstd",
}
CODECS_BY_NAME: dict[str, int] = {name: codec for codec, name in CODEC_NAMES.items()}

XERIAL_MAGIC = b"\x82SNAPPY\x00"
XERIAL_HEADER = XERIAL_MAGIC + struct.pack(">ii", 1, 1)
XERIAL_BLOCK_SIZE = 32 * 1024  # snappy-java's default, which Kafka's Java client uses

LZ4_BLOCK_SIZE = 64 * 1024
# Magic 0x184D2204 (little-endian), FLG 0x60 (version 01, independent blocks, nothing else),
# BD 0x40 (64 KiB maximum block), HC = (xxh32(FLG BD, seed 0) >> 8) & 0xFF = 0x82.
LZ4_FRAME_HEADER = b"\x04\x22\x4d\x18\x60\x40\x82"
LZ4_UNCOMPRESSED_BLOCK_FLAG = 0x80000000
LZ4_END_MARK = b"\x00\x00\x00\x00"

_U32_LE = struct.Struct("<I")
_I32_BE = struct.Struct(">i")


class UnsupportedCompressionTypeError(CorruptRecordError):
    """A batch names a codec this build cannot read (Kafka's UNSUPPORTED_COMPRESSION_TYPE)."""

    error_code = 76


def codec_name(codec: int) -> str:
    return CODEC_NAMES.get(codec, f"unknown({codec})")


def compress(codec: int, data: bytes | bytearray | memoryview, level: int | None = None) -> bytes:
    """Compress a records section with `codec`'s Kafka framing. `level` is gzip's or zstd's own
    level (Kafka's compression.gzip.level / compression.zstd.level); lz4 is always written with
    LZ4's fast compressor, Kafka's level 9, the only compression.lz4.level tidelog accepts."""
    if codec == NONE:
        return bytes(data)
    if codec == GZIP:
        return bytes(cramjam.gzip.compress(data, level=level))
    if codec == SNAPPY:
        return _xerial_snappy_compress(data)
    if codec == LZ4:
        return _lz4_frame_compress(data)
    if codec == ZSTD:
        return bytes(cramjam.zstd.compress(data, level=level))
    raise UnsupportedCompressionTypeError(f"unsupported compression type {codec}")


def decompress(codec: int, data: bytes | bytearray | memoryview) -> bytes:
    """Inverse of `compress`; also reads what other Kafka clients write (see module doc)."""
    if codec == NONE:
        return bytes(data)
    try:
        if codec == GZIP:
            return bytes(cramjam.gzip.decompress(data))
        if codec == SNAPPY:
            if bytes(data[:8]) == XERIAL_MAGIC:
                return _xerial_snappy_decompress(data)
            return bytes(cramjam.snappy.decompress_raw(data))
        if codec == LZ4:
            return bytes(cramjam.lz4.decompress(data))
        if codec == ZSTD:
            return bytes(cramjam.zstd.decompress(data))
    except cramjam.DecompressionError as exc:
        raise CorruptRecordError(f"cannot decompress {codec_name(codec)} records: {exc}") from exc
    raise UnsupportedCompressionTypeError(f"unsupported compression type {codec}")


def _xerial_snappy_compress(data: bytes | bytearray | memoryview) -> bytes:
    view = memoryview(data)
    out = bytearray(XERIAL_HEADER)
    for start in range(0, len(view), XERIAL_BLOCK_SIZE):
        block = cramjam.snappy.compress_raw(view[start : start + XERIAL_BLOCK_SIZE])
        out += _I32_BE.pack(len(block))
        out += block
    return bytes(out)


def _xerial_snappy_decompress(data: bytes | bytearray | memoryview) -> bytes:
    view = memoryview(data)
    if len(view) < len(XERIAL_HEADER):
        raise CorruptRecordError("truncated xerial snappy header")
    out = bytearray()
    position = len(XERIAL_HEADER)  # version and compatible version are not checked, as in Java
    end = len(view)
    while position < end:
        if end - position < 4:
            raise CorruptRecordError(f"truncated xerial snappy block length at {position}")
        size = _I32_BE.unpack_from(view, position)[0]
        position += 4
        if size < 0 or position + size > end:
            raise CorruptRecordError(f"xerial snappy block of {size} bytes overruns the payload")
        out += cramjam.snappy.decompress_raw(view[position : position + size])
        position += size
    return bytes(out)


def _lz4_frame_compress(data: bytes | bytearray | memoryview) -> bytes:
    view = memoryview(data)
    out = bytearray(LZ4_FRAME_HEADER)
    for start in range(0, len(view), LZ4_BLOCK_SIZE):
        chunk = view[start : start + LZ4_BLOCK_SIZE]
        block = cramjam.lz4.compress_block(chunk, store_size=False)
        if len(block) >= len(chunk):  # incompressible: store it raw, as LZ4 frames allow
            out += _U32_LE.pack(len(chunk) | LZ4_UNCOMPRESSED_BLOCK_FLAG)
            out += chunk
        else:
            out += _U32_LE.pack(len(block))
            out += block
    out += LZ4_END_MARK
    return bytes(out)
