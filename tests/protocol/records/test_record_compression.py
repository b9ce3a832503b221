"""Compression codecs with Kafka's framing, checked against independent implementations."""

from __future__ import annotations

import gzip
import os
import struct

import cramjam
import lz4.block
import lz4.frame
import pytest
import snappy
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka import codec as kafka_python_codec

from tidelog.protocol.records import (
    GZIP,
    LZ4,
    NONE,
    SNAPPY,
    ZSTD,
    CorruptRecordError,
    UnsupportedCompressionTypeError,
    compress,
    decompress,
)
from tidelog.protocol.records.compression import (
    LZ4_BLOCK_SIZE,
    XERIAL_BLOCK_SIZE,
    XERIAL_HEADER,
)

CODECS = [NONE, GZIP, SNAPPY, LZ4, ZSTD]
TEXT = b"".join(
    b"record %d: the quick brown fox jumps over the lazy dog\n" % i for i in range(4000)
)
PAYLOADS = {
    "empty": b"",
    "one-byte": b"x",
    "text": TEXT,
    "random": os.urandom(3 * LZ4_BLOCK_SIZE + 17),
    "lz4-block-edge": TEXT[:LZ4_BLOCK_SIZE],
    "xerial-block-edge": TEXT[: XERIAL_BLOCK_SIZE + 1],
}


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("name", PAYLOADS)
def test_round_trip(codec: int, name: str) -> None:
    data = PAYLOADS[name]
    assert decompress(codec, compress(codec, data)) == data
    assert decompress(codec, memoryview(bytearray(compress(codec, data)))) == data


@settings(max_examples=60, deadline=None)
@given(codec=st.sampled_from(CODECS), data=st.binary(max_size=5000), level=st.none() | st.just(3))
def test_round_trip_property(codec: int, data: bytes, level: int | None) -> None:
    assert decompress(codec, compress(codec, data, level)) == data


def test_gzip_is_a_plain_gzip_stream_and_several_members_are_read() -> None:
    assert gzip.decompress(compress(GZIP, TEXT)) == TEXT
    assert decompress(GZIP, gzip.compress(b"one ") + gzip.compress(b"two")) == b"one two"


def test_snappy_is_written_with_xerial_framing_in_32k_blocks() -> None:
    out = compress(SNAPPY, TEXT)
    assert out.startswith(XERIAL_HEADER)  # \x82SNAPPY\x00, version 1, compatible version 1
    position, blocks, restored = len(XERIAL_HEADER), 0, b""
    while position < len(out):
        (size,) = struct.unpack_from(">i", out, position)
        restored += snappy.decompress(out[position + 4 : position + 4 + size])
        position += 4 + size
        blocks += 1
    assert restored == TEXT
    assert blocks == -(-len(TEXT) // XERIAL_BLOCK_SIZE)
    assert kafka_python_codec.snappy_decode(out) == TEXT


def test_snappy_reads_raw_blocks_as_librdkafka_writes_them() -> None:
    assert decompress(SNAPPY, snappy.compress(TEXT)) == TEXT
    assert decompress(SNAPPY, bytes(cramjam.snappy.compress_raw(b"abc"))) == b"abc"
    xerial_by_kafka_python = kafka_python_codec.snappy_encode(TEXT, xerial_compatible=True)
    assert decompress(SNAPPY, xerial_by_kafka_python) == TEXT


def _lz4_blocks(frame: bytes) -> list[tuple[bool, bytes]]:
    position, blocks = 7, []
    while True:
        (word,) = struct.unpack_from("<I", frame, position)
        position += 4
        if word == 0:
            assert position == len(frame)  # no content checksum follows
            return blocks
        size = word & 0x7FFFFFFF
        blocks.append((not word & 0x80000000, frame[position : position + size]))
        position += size


def test_lz4_is_a_kafka_lz4_frame_of_independent_64k_blocks() -> None:
    out = compress(LZ4, TEXT)
    assert out[:4] == b"\x04\x22\x4d\x18"  # LZ4 frame magic
    assert out[4] == 0x60  # version 01, independent blocks, no checksums, no content size
    assert out[5] == 0x40  # 64 KiB maximum block size
    assert lz4.frame.decompress(out) == TEXT  # the reference decoder checks the HC byte
    blocks = _lz4_blocks(out)
    assert len(blocks) == -(-len(TEXT) // LZ4_BLOCK_SIZE)
    # Kafka's Lz4BlockInputStream decodes each block alone: so must these.
    restored = b"".join(
        lz4.block.decompress(block, uncompressed_size=LZ4_BLOCK_SIZE) if packed else block
        for packed, block in blocks
    )
    assert restored == TEXT


def test_lz4_stores_incompressible_blocks_raw() -> None:
    data = PAYLOADS["random"]
    blocks = _lz4_blocks(compress(LZ4, data))
    assert not any(packed for packed, _ in blocks)
    assert b"".join(block for _, block in blocks) == data


def test_lz4_reads_frames_with_other_options() -> None:
    for options in (
        {"block_linked": True, "content_checksum": True, "store_size": True},
        {"block_size": lz4.frame.BLOCKSIZE_MAX4MB, "block_checksum": True},
    ):
        assert decompress(LZ4, lz4.frame.compress(TEXT, **options)) == TEXT


def test_zstd_reads_frames_without_a_content_size() -> None:
    no_size = zstandard.ZstdCompressor(write_content_size=False).compress(TEXT)
    assert decompress(ZSTD, no_size) == TEXT
    streamer = zstandard.ZstdCompressor().compressobj()
    streamed = streamer.compress(TEXT) + streamer.flush()
    assert decompress(ZSTD, streamed) == TEXT
    assert zstandard.ZstdDecompressor().decompress(compress(ZSTD, TEXT)) == TEXT


@pytest.mark.parametrize("codec", [5, 6, 7, -1])
def test_unknown_codecs_are_unsupported_compression_type(codec: int) -> None:
    with pytest.raises(UnsupportedCompressionTypeError) as info:
        decompress(codec, b"payload")
    assert info.value.error_code == 76
    with pytest.raises(UnsupportedCompressionTypeError):
        compress(codec, b"payload")


@pytest.mark.parametrize("codec", [GZIP, SNAPPY, LZ4, ZSTD])
def test_garbage_and_truncation_are_corrupt_records(codec: int) -> None:
    for garbage in (b"", b"not compressed at all", os.urandom(200)):
        with pytest.raises(CorruptRecordError):
            decompress(codec, garbage)
    packed = compress(codec, TEXT)
    with pytest.raises(CorruptRecordError):
        decompress(codec, packed[: len(packed) // 2])


def test_xerial_framing_errors_are_corrupt_records() -> None:
    with pytest.raises(CorruptRecordError, match="header"):
        decompress(SNAPPY, XERIAL_HEADER[:10])
    with pytest.raises(CorruptRecordError, match="length"):
        decompress(SNAPPY, XERIAL_HEADER + b"\x00\x00")
    with pytest.raises(CorruptRecordError, match="overruns"):
        decompress(SNAPPY, XERIAL_HEADER + struct.pack(">i", 1000) + b"abc")
    with pytest.raises(CorruptRecordError, match="overruns"):
        decompress(SNAPPY, XERIAL_HEADER + struct.pack(">i", -5))
