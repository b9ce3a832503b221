"""Unsigned varints and the other variable-length wire primitives."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.protocol.errors import DecodeError
from tidelog.protocol.primitives import (
    coalesce,
    read_compact_nullable_string,
    read_compact_string,
    read_uvarint,
    uvarint,
)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**32 - 1) | st.sampled_from([127, 128, 16383, 16384, 2097151, 2097152]))
def test_uvarint_round_trip(value: int) -> None:
    encoded = uvarint(value)
    assert read_uvarint(memoryview(encoded + b"\xff"), 0) == (value, len(encoded))
    assert len(encoded) == max(1, (value.bit_length() + 6) // 7)


def test_uvarint_known_bytes_and_limits() -> None:
    assert uvarint(0) == b"\x00" and uvarint(300) == b"\xac\x02"
    with pytest.raises(ValueError):
        uvarint(-1)
    with pytest.raises(ValueError):
        uvarint(2**32)
    with pytest.raises(DecodeError, match="longer than 5 bytes"):
        read_uvarint(memoryview(b"\xff\xff\xff\xff\xff\x01"), 0)


def test_compact_strings_are_bounded_by_the_buffer() -> None:
    assert read_compact_string(memoryview(b"\x04abc"), 0, 4) == ("abc", 4)
    assert read_compact_nullable_string(memoryview(b"\x00"), 0, 1) == (None, 1)
    with pytest.raises(DecodeError):
        read_compact_string(memoryview(b"\x00"), 0, 1)  # null in a non-nullable string
    with pytest.raises(DecodeError):
        read_compact_string(memoryview(b"\x7fabc"), 0, 4)  # claims 126 bytes


def test_coalesce_joins_small_parts_and_passes_large_ones_through() -> None:
    big = b"x" * 5000
    parts = coalesce([b"a", b"b", big, b"c", memoryview(b"d")])
    assert parts[0] == b"ab" and parts[1] is big and bytes(parts[2]) == b"cd"
