"""FrameReader: bytes in, complete frames out, bounded by socket.request.max.bytes."""

from __future__ import annotations

import struct
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.protocol import framing
from tidelog.protocol.framing import FrameError, FrameReader, frame_size_prefix


def framed(*payloads: bytes) -> bytes:
    return b"".join(struct.pack(">i", len(p)) + p for p in payloads)


def test_whole_frames_in_one_chunk_come_out_as_slices_of_it() -> None:
    reader = FrameReader()
    data = framed(b"abc", b"", b"defg")
    frames = reader.feed(data)
    assert [bytes(f) for f in frames] == [b"abc", b"", b"defg"]
    assert frames[0].obj is data  # zero-copy: a view of the caller's immutable chunk
    assert reader.buffered == 0


@settings(max_examples=60, deadline=None)
@given(
    payloads=st.lists(st.binary(max_size=40), max_size=6),
    cuts=st.lists(st.integers(0, 400), max_size=8),
)
def test_any_chunking_yields_the_same_frames(payloads: list[bytes], cuts: list[int]) -> None:
    data = framed(*payloads)
    points = sorted({min(c, len(data)) for c in cuts})
    chunks = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    reader = FrameReader()
    frames = [bytes(f) for chunk in chunks for f in reader.feed(chunk)]
    assert frames == payloads
    assert reader.buffered == 0


def test_frame_larger_than_the_limit_is_rejected_from_its_size_prefix_alone() -> None:
    reader = FrameReader(max_frame_bytes=1024)
    assert reader.feed(framed(b"x" * 1024))[0].nbytes == 1024
    with pytest.raises(FrameError, match="socket.request.max.bytes=1024"):
        reader.feed(frame_size_prefix(1025))
    with pytest.raises(FrameError):  # the stream position is lost: stays failed
        reader.feed(framed(b"ok"))


@pytest.mark.parametrize(
    "garbage",
    [
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
        b"\xff\xff\xff\xfe",
    ],
    ids=["http", "tls-client-hello", "negative-size"],
)
def test_garbage_is_rejected_without_buffering_it(garbage: bytes) -> None:
    reader = FrameReader()
    with pytest.raises(FrameError):
        reader.feed(garbage)
    assert reader.buffered == 0


def test_split_size_prefix_and_reused_caller_buffer() -> None:
    reader = FrameReader()
    data = bytearray(framed(b"hello", b"world"))
    assert reader.feed(data[:2]) == []
    first = reader.feed(data[2:9])
    second = reader.feed(data[9:])
    data[:] = b"\x00" * len(data)  # the caller reuses its buffer: frames must not change
    assert [bytes(f) for f in first + second] == [b"hello", b"world"]


def test_a_frame_announced_but_never_completed_holds_only_what_arrived() -> None:
    reader = FrameReader(max_frame_bytes=10_000_000)
    assert reader.feed(frame_size_prefix(9_000_000) + b"abc") == []
    assert reader.buffered == 3


def test_chunk_ending_exactly_after_a_size_prefix() -> None:
    reader = FrameReader()
    data = framed(b"abc", b"z")
    assert [bytes(f) for f in reader.feed(data[:11])] == [b"abc"]  # + the 4-byte prefix of "z"
    assert [bytes(f) for f in reader.feed(data[11:])] == [b"z"]


def test_a_frame_spanning_chunks_is_assembled_once_in_a_buffer_of_its_size() -> None:
    reader = FrameReader()
    data = framed(b"x" * 1000, b"tail")
    assert reader.feed(data[:300]) == []
    assert reader.buffered == 296
    frames = reader.feed(data[300:])
    assert [bytes(f) for f in frames] == [b"x" * 1000, b"tail"]
    # handed out as the assembly buffer itself (no copy of the whole frame), read-only
    assert isinstance(frames[0].obj, bytearray) and len(frames[0].obj) == 1000
    assert frames[0].readonly


def _read_through_buffers(reader: FrameReader, data: bytes, cuts: list[int]) -> list[bytes]:
    """What a BufferedProtocol's socket would do: read at most `cut` bytes into get_buffer()."""
    frames: list[bytes] = []
    pos = 0
    i = 0
    while pos < len(data):
        buf = reader.get_buffer()
        n = min(len(buf), len(data) - pos, max(1, cuts[i % len(cuts)] if cuts else len(data)))
        i += 1
        buf[:n] = data[pos : pos + n]
        pos += n
        frames += [bytes(f) for f in reader.buffer_updated(n)]
    return frames


@settings(max_examples=60, deadline=None)
@given(
    payloads=st.lists(st.binary(max_size=300_000), max_size=4),
    cuts=st.lists(st.integers(1, 400_000), max_size=6),
)
def test_buffered_protocol_reads_yield_the_same_frames(payloads: list[bytes],
                                                       cuts: list[int]) -> None:
    reader = FrameReader()
    assert _read_through_buffers(reader, framed(*payloads), cuts) == payloads
    assert reader.buffered == 0


def test_buffered_reads_go_straight_into_the_frame_being_assembled() -> None:
    reader = FrameReader()
    data = framed(b"y" * 1_000_000)
    first = reader.get_buffer()
    first[:1000] = data[:1000]
    assert reader.buffer_updated(1000) == []
    rest = reader.get_buffer()
    assert len(rest) == 1_000_000 - 996  # exactly what the frame still needs
    rest[:] = data[1000:]
    (frame,) = reader.buffer_updated(len(rest))
    assert frame.obj is rest.obj and bytes(frame) == b"y" * 1_000_000


def test_a_bad_size_prefix_fails_buffered_reads_too() -> None:
    reader = FrameReader(max_frame_bytes=10)
    buf = reader.get_buffer()
    buf[:4] = frame_size_prefix(11)
    with pytest.raises(FrameError):
        reader.buffer_updated(4)
    with pytest.raises(FrameError):
        reader.get_buffer()


# -- reuse_buffers: a large frame assembled in the buffer of an earlier, released one ----------


def test_a_released_large_frame_buffer_is_reused_for_the_next() -> None:
    reader = FrameReader(reuse_buffers=True)
    first = _read_one_buffered(reader, b"a" * 300_000)
    buffer = id(first.obj)  # (the id: a reference would keep the buffer from reuse)
    del first  # the consumer is done with it
    second = _read_one_buffered(reader, b"b" * 280_000)
    assert id(second.obj) == buffer  # no new zero-filled allocation
    assert bytes(second) == b"b" * 280_000 and second.readonly


def test_a_frame_still_referenced_is_never_overwritten() -> None:
    reader = FrameReader(reuse_buffers=True)
    first = _read_one_buffered(reader, b"a" * 300_000)
    records = first[100:200]  # e.g. a records field decoded from it, still held
    del first
    second = _read_one_buffered(reader, b"b" * 300_000)
    assert second.obj is not records.obj
    assert bytes(records) == b"a" * 100
    del records, second
    third = _read_one_buffered(reader, b"c" * 300_000)
    assert bytes(third) == b"c" * 300_000


def test_a_held_frame_is_kept_whatever_getrefcount_counts_of_the_callers_references(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Python 3.14 loads locals as borrowed references: getrefcount then reports one less for
    the same objects (simulated here). A held records view must still keep its buffer."""
    real = framing.sys.getrefcount
    # (- 2: the lambda's own argument is one more reference)
    monkeypatch.setattr(framing, "sys", SimpleNamespace(getrefcount=lambda o: real(o) - 2))
    reader = FrameReader(reuse_buffers=True)
    first = _read_one_buffered(reader, b"a" * 300_000)
    records = first[100:200]
    del first
    second = _read_one_buffered(reader, b"b" * 300_000)
    assert bytes(records) == b"a" * 100
    assert second.obj is not records.obj
    buffer = id(second.obj)
    del records, second
    assert id(_read_one_buffered(reader, b"c" * 300_000).obj) == buffer  # released: reused


def test_a_reused_larger_buffer_takes_no_byte_of_the_next_frame() -> None:
    reader = FrameReader(reuse_buffers=True)
    del reader.feed(framed(b"a" * 400_000))[0]
    # one read holding a smaller frame and the next one: the first must stop at its own end
    data = framed(b"b" * 100_000, b"tail")
    assert reader.feed(data[:1000]) == []
    assert len(reader.get_buffer()) == 100_000 - 996
    frames = reader.feed(data[1000:])
    assert [bytes(f) for f in frames] == [b"b" * 100_000, b"tail"]
    assert len(frames[0]) == 100_000


def _read_whole_into_scratch(reader: FrameReader, *payloads: bytes) -> list[memoryview]:
    """One socket read holding whole frames, into get_buffer's scratch buffer."""
    data = framed(*payloads)
    buf = reader.get_buffer()
    assert len(buf) >= len(data)  # between frames: the scratch buffer
    buf[: len(data)] = data
    return reader.buffer_updated(len(data))


def test_whole_frames_read_into_the_scratch_buffer_are_copied_into_a_released_one() -> None:
    reader = FrameReader(reuse_buffers=True)
    first, small = _read_whole_into_scratch(reader, b"a" * 100_000, b"s")
    held = first[10:20]  # a records field still held: its buffer must not be written
    del first, small
    second = _read_whole_into_scratch(reader, b"b" * 90_000)[0]
    assert second.obj is not held.obj and bytes(held) == b"a" * 10
    del held
    third = _read_whole_into_scratch(reader, b"c" * 80_000)[0]
    assert third.obj is not second.obj  # second's buffer is the spare now, and still held
    del second
    assert bytes(third) == b"c" * 80_000 and third.readonly
    third_buffer = id(third.obj)
    del third
    fourth, tail = _read_whole_into_scratch(reader, b"d" * 70_000, b"tail")
    assert id(fourth.obj) == third_buffer  # released: reused, no new allocation
    assert (bytes(fourth), bytes(tail)) == (b"d" * 70_000, b"tail")


def test_a_frame_read_whole_reuses_the_buffer_of_the_same_size_frame_read_in_parts() -> None:
    """Whether a request arrives in one socket read or several is the kernel's timing: a
    frame of the same size must reuse the released buffer either way (read whole into the
    scratch buffer, it is copied with its size prefix: 4 bytes more than the frame)."""
    reader = FrameReader(reuse_buffers=True)
    data = framed(b"a" * 100_000)
    buf = reader.get_buffer()
    buf[:1000] = data[:1000]
    assert reader.buffer_updated(1000) == []  # the rest goes straight into the frame's buffer
    buf = reader.get_buffer()
    buf[: len(data) - 1000] = data[1000:]
    first = reader.buffer_updated(len(data) - 1000)[0]
    buffer = id(first.obj)
    del first, buf
    second = _read_whole_into_scratch(reader, b"b" * 100_000)[0]
    assert id(second.obj) == buffer  # no new allocation
    assert bytes(second) == b"b" * 100_000 and second.readonly


@settings(max_examples=60, deadline=None)
@given(
    payloads=st.lists(st.binary(max_size=3_000), max_size=6),
    cuts=st.lists(st.integers(1, 4_000), max_size=6),
    keep=st.lists(st.booleans(), max_size=6),
)
def test_reused_buffers_yield_the_same_frames_and_keep_held_ones_intact(
        payloads: list[bytes], cuts: list[int], keep: list[bool]) -> None:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(framing, "REUSE_MIN_BYTES", 100)
        _check_reuse(payloads, cuts, keep)


def _check_reuse(payloads: list[bytes], cuts: list[int], keep: list[bool]) -> None:
    reader = FrameReader(reuse_buffers=True)
    data = framed(*payloads)
    held: list[tuple[memoryview, bytes]] = []
    got: list[bytes] = []
    pos = i = 0
    while pos < len(data):
        buf = reader.get_buffer()
        n = min(len(buf), len(data) - pos, cuts[i % len(cuts)] if cuts else len(data))
        buf[:n] = data[pos : pos + n]
        pos += n
        for f in reader.buffer_updated(n):
            got.append(bytes(f))
            if keep and keep[i % len(keep)]:
                held.append((f, bytes(f)))
        i += 1
    assert got == payloads
    assert all(bytes(view) == content for view, content in held)


def _read_one_buffered(reader: FrameReader, payload: bytes) -> memoryview:
    data = framed(payload)
    frames: list[memoryview] = []
    pos = 0
    while not frames:
        buf = reader.get_buffer()
        n = min(len(buf), len(data) - pos)
        buf[:n] = data[pos : pos + n]
        pos += n
        frames = reader.buffer_updated(n)
    assert pos == len(data) and len(frames) == 1
    return frames[0]
