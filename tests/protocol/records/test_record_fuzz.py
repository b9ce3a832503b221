"""Garbage in, CorruptRecordError out: never IndexError, struct.error, a hang or a crash."""

from __future__ import annotations

import struct

import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.protocol.records import (
    CorruptRecordError,
    Record,
    RecordBatch,
    build_batch,
    decode_records,
    iter_batches,
    iter_records,
)
from tidelog.protocol.records.batch import ATTRIBUTES_OFFSET, CRC_OFFSET, RECORDS_OFFSET

CODECS = [0, 1, 2, 3, 4]


def _reseal(buf: bytearray) -> RecordBatch:
    """Fix the length and CRC fields so the garbage reaches the record decoder."""
    struct.pack_into(">i", buf, 8, len(buf) - 12)
    struct.pack_into(">I", buf, CRC_OFFSET, crc32c.crc32c(memoryview(buf)[ATTRIBUTES_OFFSET:]))
    return RecordBatch(buf)


def _decodes_or_is_corrupt(batch: RecordBatch) -> None:
    try:
        decode_records(batch)
    except CorruptRecordError:
        pass


SAMPLE = [
    Record(value=b"value-%d" % i * (i % 4), key=b"k%d" % i, headers=[("h", b"x")] * (i % 2))
    for i in range(12)
]


@settings(max_examples=150, deadline=None)
@given(
    section=st.binary(max_size=200),
    count=st.integers(min_value=-3, max_value=60),
    codec=st.sampled_from(CODECS),
)
def test_random_records_sections(section: bytes, count: int, codec: int) -> None:
    buf = build_batch([Record(value=b"x")], compression=0)
    del buf[RECORDS_OFFSET:]
    buf += section
    struct.pack_into(">h", buf, ATTRIBUTES_OFFSET, codec)
    struct.pack_into(">i", buf, 57, count)
    _decodes_or_is_corrupt(_reseal(buf))


@settings(max_examples=200, deadline=None)
@given(
    codec=st.sampled_from(CODECS),
    edits=st.lists(
        st.tuples(st.integers(min_value=0), st.integers(min_value=0, max_value=255)),
        min_size=1,
        max_size=4,
    ),
    cut=st.none() | st.integers(min_value=0),
)
def test_mutated_records_sections(
    codec: int, edits: list[tuple[int, int]], cut: int | None
) -> None:
    """Valid batches with bytes of the (possibly compressed) records section overwritten or
    cut short, then resealed with a correct CRC."""
    buf = build_batch(SAMPLE, compression=codec)
    section_size = len(buf) - RECORDS_OFFSET
    for where, byte in edits:
        buf[RECORDS_OFFSET + where % section_size] = byte
    if cut is not None:
        del buf[RECORDS_OFFSET + cut % section_size :]
    _decodes_or_is_corrupt(_reseal(buf))


@settings(max_examples=150, deadline=None)
@given(garbage=st.binary(min_size=0, max_size=400), prefix_valid=st.booleans())
def test_random_buffers_through_batch_iteration_and_decoding(
    garbage: bytes, prefix_valid: bool
) -> None:
    buf = (bytes(build_batch(SAMPLE[:3])) if prefix_valid else b"") + garbage
    try:
        for batch in iter_batches(buf):
            batch.is_valid()
            _decodes_or_is_corrupt(batch)
        list(iter_records(buf, verify_crc=False))
    except CorruptRecordError:
        pass


@settings(max_examples=100, deadline=None)
@given(garbage=st.binary(min_size=RECORDS_OFFSET, max_size=300))
def test_garbage_with_a_plausible_header_is_caught_by_the_crc(garbage: bytes) -> None:
    buf = bytearray(garbage)
    struct.pack_into(">i", buf, 8, len(buf) - 12)
    buf[16] = 2
    batch = RecordBatch(buf)
    if batch.compute_crc() != batch.crc:
        try:
            decode_records(batch)
        except CorruptRecordError as exc:
            assert "crc" in str(exc)
        else:
            raise AssertionError("a batch with a wrong CRC decoded")
