"""Offset and time indexes: lookups, truncation, Kafka's file format, sanity checks."""

from __future__ import annotations

import struct

import pytest

from tidelog.storage.errors import CorruptIndexError
from tidelog.storage.index import OffsetIndex, TimeIndex


def test_offset_index_lookup_is_the_floor_entry() -> None:
    idx = OffsetIndex(100, 1024)
    for offset, position in ((110, 400), (120, 800), (135, 1300)):
        idx.append(offset, position)
    assert idx.lookup(99) == (100, 0)
    assert idx.lookup(109) == (100, 0)
    assert idx.lookup(110) == (110, 400)
    assert idx.lookup(134) == (120, 800)
    assert idx.lookup(10**6) == (135, 1300)
    idx.append(130, 1400)  # not increasing: ignored
    assert len(idx) == 3


def test_offset_index_file_format_and_truncation() -> None:
    idx = OffsetIndex(100, 1024)
    idx.append(110, 400)
    idx.append(120, 800)
    assert idx.to_bytes() == struct.pack(">iiii", 10, 400, 20, 800)
    idx.truncate_to(120)
    assert idx.entries() == [(110, 400)]
    loaded = OffsetIndex(100, 1024)
    loaded.load_bytes(struct.pack(">iiii", 10, 400, 20, 800) + bytes(16), segment_size=1000)
    assert loaded.entries() == [(110, 400), (120, 800)]  # preallocated zeros ignored
    assert OffsetIndex(0, 16).max_entries == 2


@pytest.mark.parametrize(
    "data",
    [
        struct.pack(">iiii", 20, 400, 10, 800),  # offsets decrease
        struct.pack(">ii", 10, 5000),  # position past the segment
        struct.pack(">ii", -1, 10),
        b"\x00" * 7,  # not whole entries
    ],
)
def test_offset_index_sanity_check(data: bytes) -> None:
    with pytest.raises(CorruptIndexError):
        OffsetIndex(0, 1024).load_bytes(data, segment_size=1000)


def test_time_index_keeps_only_growing_timestamps() -> None:
    idx = TimeIndex(50, 1200)
    idx.maybe_append(1000, 55)
    idx.maybe_append(900, 60)  # older: ignored
    idx.maybe_append(1500, 70)
    assert idx.entries() == [(1000, 55), (1500, 70)]
    assert idx.lookup(1200) == (1000, 55)
    assert idx.lookup(10) == (-1, 50)
    assert idx.to_bytes() == struct.pack(">qiqi", 1000, 5, 1500, 20)
    again = TimeIndex(50, 1200)
    again.load_bytes(idx.to_bytes(), max_relative_offset=100)
    assert again.entries() == idx.entries()
    idx.truncate_to(70)
    assert idx.entries() == [(1000, 55)]
    with pytest.raises(CorruptIndexError):
        TimeIndex(0, 1200).load_bytes(struct.pack(">qiqi", 10, 1, 5, 2), 100)
