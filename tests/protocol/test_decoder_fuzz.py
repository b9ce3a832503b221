"""Fuzzing the request decoder: random and mutated frames give a DecodeError (or a message),
never another exception, a hang or memory out of proportion to the frame."""

from __future__ import annotations

import struct
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidelog.protocol import codec
from tidelog.protocol.api_keys import all_specs, api_spec
from tidelog.protocol.api_versions import advertised
from tidelog.protocol.errors import DecodeError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "protocol"


def _seed_frames() -> list[bytes]:
    """Valid request frames: every advertised API and version, plus captured client traffic."""
    seeds = []
    for key, (lo, hi) in advertised().items():
        spec = api_spec(key)
        for version in range(lo, hi + 1):
            parts = codec.encode_request(spec.request_class(), version, 1, "fuzz")
            seeds.append(b"".join(parts)[4:])
    for path in sorted(FIXTURES.glob("*.requests.bin")):
        data = path.read_bytes()
        pos = 0
        while pos + 4 <= len(data):
            (size,) = struct.unpack_from(">i", data, pos)
            seeds.append(data[pos + 4 : pos + 4 + size])
            pos += 4 + size
    return seeds


SEEDS = _seed_frames()
KEYS_VERSIONS = [
    (s.api_key, v) for s in all_specs() for v in range(s.min_version, s.max_version + 1)
]


def decode_or_reject(frame: bytes) -> None:
    try:
        codec.decode_request(frame)
    except DecodeError:
        pass


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_mutated_valid_frames(data: st.DataObject) -> None:
    frame = bytearray(data.draw(st.sampled_from(SEEDS), label="seed"))
    for _ in range(data.draw(st.integers(1, 4), label="mutations")):
        kind = data.draw(st.sampled_from(["flip", "truncate", "insert", "big"]))
        pos = data.draw(st.integers(0, max(len(frame) - 1, 0)))
        if kind == "flip" and frame:
            frame[pos] = data.draw(st.integers(0, 255))
        elif kind == "truncate":
            del frame[pos:]
        elif kind == "insert":
            frame[pos:pos] = data.draw(st.binary(min_size=1, max_size=8))
        else:  # a length or count that claims far more than the frame holds
            frame[pos : pos + 4] = data.draw(
                st.sampled_from([b"\x7f\xff\xff\xff", b"\xff\xff\xff\xfe", b"\xff\xff\xff\x0f"])
            )
    decode_or_reject(bytes(frame))


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(key_version=st.sampled_from(KEYS_VERSIONS), body=st.binary(max_size=200))
def test_random_bodies_behind_a_valid_header(key_version: tuple[int, int], body: bytes) -> None:
    key, version = key_version
    decode_or_reject(struct.pack(">hhih", key, version, 1, -1) + body)
    decode_or_reject(struct.pack(">hhih", key, version, 1, -1) + b"\x00" + body)


@settings(max_examples=200, deadline=None)
@given(frame=st.binary(max_size=300))
def test_random_frames(frame: bytes) -> None:
    decode_or_reject(frame)


def test_huge_claimed_lengths_do_not_allocate() -> None:
    # Metadata v1 with a topic array claiming 2**31-1 entries, Produce v3 with a 2 GiB records
    # field, and a flexible Fetch claiming a 2**28-entry compact array.
    frames = [
        struct.pack(">hhih", 3, 1, 1, -1) + b"\x7f\xff\xff\xff",
        struct.pack(">hhih", 0, 3, 1, -1)
        + struct.pack(">hhii", -1, 1, 1000, 1)
        + b"\x00\x01t"
        + struct.pack(">ii", 1, 0)
        + b"\x7f\xff\xff\xff",
        struct.pack(">hhih", 1, 12, 1, -1) + b"\x00" + bytes(21) + b"\xff\xff\xff\x7f",
    ]
    tracemalloc.start()
    try:
        for frame in frames:
            decode_or_reject(frame)
            decode_or_reject(frame + bytes(64))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_memory_stays_proportional_to_the_frame() -> None:
    # OffsetFetch v1: 10,000 topics of the smallest possible shape (empty name, no partitions,
    # 6 bytes each) is the densest object count a frame can ask for here.
    body = (
        struct.pack(">h", 1)
        + b"g"
        + struct.pack(">i", 10_000)
        + b"\x00\x00\x00\x00\x00\x00" * 10_000
    )
    frame = struct.pack(">hhih", 9, 1, 1, -1) + body
    tracemalloc.start()
    try:
        _, request = codec.decode_request(frame)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(request.topics) == 10_000
    assert peak < 64 * len(frame)
    # one topic fewer than claimed: rejected before any element is built
    with pytest.raises(DecodeError, match="array length"):
        codec.decode_request(frame[:-6])
