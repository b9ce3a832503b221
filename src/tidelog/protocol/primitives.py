"""Wire primitives shared by the generated codecs in ``tidelog.protocol.messages``.

The generated code inlines fixed-width fields into merged ``struct.Struct`` calls; what is left
here is the variable-length part (unsigned varints, compact strings/bytes, unknown tagged fields)
and the buffer coalescing used by the encoders. Every reader bounds lengths against ``n`` (the end
of the readable region) and raises :class:`DecodeError` instead of over-reading or allocating.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from struct import Struct
from uuid import UUID

from tidelog.protocol.errors import DecodeError

__all__ = [
    "DecodeError",
    "UV1",
    "ZERO_UUID",
    "coalesce",
    "read_compact_bytes",
    "read_compact_nullable_bytes",
    "read_compact_nullable_records",
    "read_compact_nullable_string",
    "read_compact_records",
    "read_compact_string",
    "read_string",
    "read_unknown_tags",
    "read_uvarint",
    "read_uvarint_tail",
    "records_size",
    "uuid_from_bytes",
    "uvarint",
    "write_tags",
]

ZERO_UUID = UUID(int=0)
_ZERO16 = bytes(16)
_H = Struct(">h")

# One-byte varints are by far the most common (array counts, short strings): a table lookup.
UV1: tuple[bytes, ...] = tuple(bytes((i,)) for i in range(128))


def uvarint(value: int) -> bytes:
    """Kafka's unsigned varint (LEB128) of a non-negative int < 2**32."""
    if value < 128:
        if value < 0:
            raise ValueError(f"negative unsigned varint: {value}")
        return UV1[value]
    if value < 16384:  # record data up to 16 KiB: the common multi-byte case, unrolled
        return bytes(((value & 0x7F) | 0x80, value >> 7))
    if value < 2097152:
        return bytes(((value & 0x7F) | 0x80, ((value >> 7) & 0x7F) | 0x80, value >> 14))
    if value >= 1 << 32:
        raise ValueError(f"unsigned varint out of range: {value}")
    out = bytearray()
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def read_uvarint_tail(buf: memoryview, pos: int, first: int) -> tuple[int, int]:
    """Continue an unsigned varint whose first byte (> 127) was already read at ``pos - 1``."""
    second = buf[pos]
    if second < 128:
        return (first & 0x7F) | (second << 7), pos + 1
    third = buf[pos + 1]
    if third < 128:
        return (first & 0x7F) | ((second & 0x7F) << 7) | (third << 14), pos + 2
    value = first & 0x7F
    shift = 7
    while True:
        if shift > 28:
            raise DecodeError("unsigned varint longer than 5 bytes")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 128:
            return value, pos
        shift += 7


def read_uvarint(buf: memoryview, pos: int) -> tuple[int, int]:
    byte = buf[pos]
    if byte < 128:
        return byte, pos + 1
    return read_uvarint_tail(buf, pos + 1, byte)


def uuid_from_bytes(raw: bytes) -> UUID:
    return ZERO_UUID if raw == _ZERO16 else UUID(bytes=raw)


def read_string(buf: memoryview, pos: int, n: int, nullable: bool) -> tuple[str | None, int]:
    """A legacy (int16-length) string, used for string arrays in non-flexible versions."""
    (length,) = _H.unpack_from(buf, pos)
    pos += 2
    if length < 0:
        if length == -1 and nullable:
            return None, pos
        raise DecodeError(f"invalid string length {length}")
    end = pos + length
    if end > n:
        raise DecodeError("string runs past the end of the buffer")
    return str(buf[pos:end], "utf-8"), end


def read_compact_string(buf: memoryview, pos: int, n: int) -> tuple[str, int]:
    length = buf[pos]
    pos += 1
    if length > 127:
        length, pos = read_uvarint_tail(buf, pos, length)
    if length == 0:
        raise DecodeError("null value in a non-nullable string")
    end = pos + length - 1
    if end > n:
        raise DecodeError("string runs past the end of the buffer")
    return str(buf[pos:end], "utf-8"), end


def read_compact_nullable_string(buf: memoryview, pos: int, n: int) -> tuple[str | None, int]:
    length = buf[pos]
    pos += 1
    if length > 127:
        length, pos = read_uvarint_tail(buf, pos, length)
    if length == 0:
        return None, pos
    end = pos + length - 1
    if end > n:
        raise DecodeError("string runs past the end of the buffer")
    return str(buf[pos:end], "utf-8"), end


def read_compact_bytes(buf: memoryview, pos: int, n: int) -> tuple[bytes, int]:
    length = buf[pos]
    pos += 1
    if length > 127:
        length, pos = read_uvarint_tail(buf, pos, length)
    if length == 0:
        raise DecodeError("null value in a non-nullable bytes field")
    end = pos + length - 1
    if end > n:
        raise DecodeError("bytes run past the end of the buffer")
    return bytes(buf[pos:end]), end


def read_compact_nullable_bytes(buf: memoryview, pos: int, n: int) -> tuple[bytes | None, int]:
    length = buf[pos]
    pos += 1
    if length > 127:
        length, pos = read_uvarint_tail(buf, pos, length)
    if length == 0:
        return None, pos
    end = pos + length - 1
    if end > n:
        raise DecodeError("bytes run past the end of the buffer")
    return bytes(buf[pos:end]), end


def read_compact_records(buf: memoryview, pos: int, n: int) -> tuple[memoryview, int]:
    length = buf[pos]
    pos += 1
    if length > 127:
        length, pos = read_uvarint_tail(buf, pos, length)
    if length == 0:
        raise DecodeError("null value in a non-nullable records field")
    end = pos + length - 1
    if end > n:
        raise DecodeError("records run past the end of the buffer")
    return buf[pos:end], end


def read_compact_nullable_records(
    buf: memoryview, pos: int, n: int
) -> tuple[memoryview | None, int]:
    length = buf[pos]
    pos += 1
    if length > 127:
        length, pos = read_uvarint_tail(buf, pos, length)
    if length == 0:
        return None, pos
    end = pos + length - 1
    if end > n:
        raise DecodeError("records run past the end of the buffer")
    return buf[pos:end], end


def read_unknown_tags(
    buf: memoryview, pos: int, n: int
) -> tuple[list[tuple[int, bytes]] | None, int]:
    """Read a tagged-field section none of whose tags this version knows; keep them raw."""
    count, pos = read_uvarint(buf, pos)
    if count > n - pos:
        raise DecodeError("tagged field count larger than the buffer")
    tags: list[tuple[int, bytes]] = []
    last = -1
    for _ in range(count):
        tag, pos = read_uvarint(buf, pos)
        size, pos = read_uvarint(buf, pos)
        end = pos + size
        if end > n:
            raise DecodeError("tagged field runs past the end of the buffer")
        if tag <= last:
            raise DecodeError("tagged fields out of order")
        last = tag
        tags.append((tag, bytes(buf[pos:end])))
        pos = end
    return (tags or None), pos


def write_tags(append: Callable[[bytes], object], tags: Sequence[tuple[int, bytes]]) -> None:
    """Write a tagged-field section: count, then (tag, size, data) in ascending tag order."""
    append(uvarint(len(tags)))
    for tag, data in sorted(tags, key=lambda t: t[0]):
        append(uvarint(tag))
        append(uvarint(len(data)))
        append(data)


def records_size(records: object) -> int:
    """Byte size of a records value: one buffer, a list/tuple of buffers (kept uncopied), or
    a file slice the broker sends with sendfile (anything with `fileno` and a length)."""
    if type(records) is memoryview:
        return records.nbytes
    if type(records) in (list, tuple):
        return sum(records_size(part) for part in records)  # type: ignore[union-attr]
    if hasattr(records, "fileno"):
        return len(records)  # type: ignore[arg-type]
    return memoryview(records).nbytes  # type: ignore[arg-type]


# Parts at least this large are passed through as their own buffer (record data), smaller
# neighbours are joined so that a socket write sees few, reasonably sized buffers.
COALESCE_THRESHOLD = 4096


def coalesce(parts: Iterable[bytes | memoryview]) -> list[bytes | memoryview]:
    out: list[bytes | memoryview] = []
    run: list[bytes | memoryview] = []
    for part in parts:
        if len(part) >= COALESCE_THRESHOLD or hasattr(part, "fileno"):  # a file slice: its own
            if run:
                out.append(b"".join(run) if len(run) > 1 else run[0])
                run = []
            out.append(part)
        else:
            run.append(part)
    if run:
        out.append(b"".join(run) if len(run) > 1 else run[0])
    return out
