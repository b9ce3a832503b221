"""`__consumer_offsets` records in Kafka's formats, the group -> partition mapping, and loading
a partition back (last record of a key wins, tombstones delete, bad records skipped)."""

from __future__ import annotations

import struct

import pytest

from tidelog.coordinator.offsets import (
    GroupMetadataSnapshot,
    MemberSnapshot,
    OffsetAndMetadata,
    OffsetKey,
    decode_group_metadata_value,
    decode_key,
    decode_offset_commit_value,
    encode_group_metadata_key,
    encode_group_metadata_value,
    encode_offset_commit_key,
    encode_offset_commit_value,
    java_string_hash,
    load_partition,
    partition_for,
)
from tidelog.protocol.records.batch import RecordBatch
from tidelog.protocol.records.builder import Record, build_batch


def test_java_string_hash_and_partition_for_match_kafka() -> None:
    # Values of Java's String.hashCode.
    assert java_string_hash("") == 0
    assert java_string_hash("a") == 97
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("Hello World") == -862545276
    assert partition_for("hello", 50) == 99162322 % 50
    assert partition_for("Hello World", 50) == 862545276 % 50
    # Utils.abs(Integer.MIN_VALUE) is 0 in Kafka. "polygenelubricants" hashes to MIN_VALUE.
    assert java_string_hash("polygenelubricants") == -(1 << 31)
    assert partition_for("polygenelubricants", 50) == 0
    # Non-BMP characters count as two UTF-16 units, as in Java.
    assert java_string_hash("\U0001F600") == (0xD83D * 31 + 0xDE00)


def test_offset_commit_key_and_value_bytes() -> None:
    key = encode_offset_commit_key("g", "t", 3)
    assert key == b"\x00\x01" + b"\x00\x01g" + b"\x00\x01t" + b"\x00\x00\x00\x03"
    assert decode_key(key) == OffsetKey("g", "t", 3)
    om = OffsetAndMetadata(42, 5, "meta", 1_700_000_000_000)
    value = encode_offset_commit_value(om)
    # v3: offset, leader epoch, metadata, commit timestamp.
    assert value == (b"\x00\x03" + struct.pack(">qi", 42, 5) + b"\x00\x04meta"
                     + struct.pack(">q", 1_700_000_000_000))
    assert decode_offset_commit_value(value) == om
    # With an expire timestamp (OffsetCommit v2-4 retention): v1, no leader epoch.
    om1 = OffsetAndMetadata(7, -1, "", 100, 200)
    v1 = encode_offset_commit_value(om1)
    assert v1[:2] == b"\x00\x01" and decode_offset_commit_value(v1) == om1


def test_older_and_flexible_value_versions_are_read() -> None:
    v0 = b"\x00\x00" + struct.pack(">q", 9) + b"\x00\x02md" + struct.pack(">q", 55)
    assert decode_offset_commit_value(v0) == OffsetAndMetadata(9, -1, "md", 55)
    # v4 (flexible): compact string (length + 1) and an empty tagged-field section.
    v4 = b"\x00\x04" + struct.pack(">qi", 10, 2) + b"\x03md" + struct.pack(">q", 66) + b"\x00"
    assert decode_offset_commit_value(v4) == OffsetAndMetadata(10, 2, "md", 66)
    key_v0 = b"\x00\x00\x00\x01g\x00\x01t\x00\x00\x00\x00"
    assert decode_key(key_v0) == OffsetKey("g", "t", 0)


def test_group_metadata_round_trip_and_layout() -> None:
    snap = GroupMetadataSnapshot(
        protocol_type="consumer", generation_id=3, protocol_name="range", leader_id="m1",
        current_state_timestamp_ms=123,
        members=(MemberSnapshot("m1", None, "c1", "/127.0.0.1", 30000, 10000, b"sub", b"asg"),
                 MemberSnapshot("m2", "inst", "c2", "/127.0.0.1", 30000, 10000, b"", b"")),
    )
    key = encode_group_metadata_key("grp")
    assert key == b"\x00\x02\x00\x03grp" and decode_key(key) == "grp"
    value = encode_group_metadata_value(snap)
    assert value[:2] == b"\x00\x03"
    assert decode_group_metadata_value(value) == snap
    empty = GroupMetadataSnapshot("consumer", 4, None, None, -1, ())
    assert decode_group_metadata_value(encode_group_metadata_value(empty)) == empty


def test_group_metadata_v0_uses_the_session_timeout_as_rebalance_timeout() -> None:
    v0 = (b"\x00\x00" + b"\x00\x08consumer" + struct.pack(">i", 1) + b"\x00\x05range"
          + b"\x00\x02m1" + struct.pack(">i", 1) + b"\x00\x02m1" + b"\x00\x02c1" + b"\x00\x02/h"
          + struct.pack(">i", 6000) + struct.pack(">i", 1) + b"s" + struct.pack(">i", 1) + b"a")
    snap = decode_group_metadata_value(v0)
    assert snap.members == (MemberSnapshot("m1", None, "c1", "/h", 6000, 6000, b"s", b"a"),)
    assert snap.current_state_timestamp_ms == -1


@pytest.mark.parametrize("bad", [
    b"", b"\x00", b"\x00\x09", b"\x00\x01\x00\x05ab", b"\x00\x01\xff\xfe",
])
def test_malformed_keys_are_value_errors(bad: bytes) -> None:
    with pytest.raises(ValueError):
        decode_key(bad)


def test_malformed_values_are_value_errors() -> None:
    for bad in (b"\x00\x07" + b"\x00" * 20, b"\x00\x03\x00", b"\x00\x03" + b"\x00" * 12 + b"\x7f\xff"):
        with pytest.raises(ValueError):
            decode_offset_commit_value(bad)
    with pytest.raises(ValueError):
        decode_group_metadata_value(b"\x00\x03\x00\x08consumer\x00\x00\x00\x01\xff\xff\xff\xff"
                                    b"\x00\x00\x00\x00\x00\x00\x00\x00\x7f\xff\xff\xff")


def _batch(records: list[Record], base: int) -> RecordBatch:
    return RecordBatch(build_batch(records, base_offset=base, now_ms=1))


def test_load_partition_replays_in_order() -> None:
    c = encode_offset_commit_key
    v = encode_offset_commit_value
    group = GroupMetadataSnapshot("consumer", 1, "range", "m", 5, ())
    batches = [
        _batch([Record(v(OffsetAndMetadata(1)), c("g1", "t", 0)),
                Record(v(OffsetAndMetadata(5)), c("g1", "t", 1)),
                Record(encode_group_metadata_value(group), encode_group_metadata_key("g1"))], 0),
        _batch([Record(v(OffsetAndMetadata(2)), c("g1", "t", 0)),  # newer commit wins
                Record(None, c("g1", "t", 1)),  # tombstone
                Record(v(OffsetAndMetadata(9)), c("g2", "u", 0)),
                Record(b"\x00\x09junk", c("g2", "u", 1)),  # unreadable: skipped
                Record(v(OffsetAndMetadata(3)), None)], 3),  # no key: skipped
        _batch([Record(None, encode_group_metadata_key("g1")),
                Record(v(OffsetAndMetadata(100)), c("g2", "u", 0))], 8),
    ]
    loaded = load_partition(batches)
    assert loaded.offsets == {"g1": {("t", 0): OffsetAndMetadata(2)},
                              "g2": {("u", 0): OffsetAndMetadata(100)}}
    assert loaded.groups == {} and loaded.skipped == 2
    # Up to an end offset: the group is still there and g2's last commit not yet made.
    upto = load_partition(batches, end_offset=8)
    assert upto.groups == {"g1": group}
    assert upto.offsets["g2"] == {("u", 0): OffsetAndMetadata(9)}


def test_load_partition_skips_a_corrupt_batch() -> None:
    good = build_batch([Record(encode_offset_commit_value(OffsetAndMetadata(4)),
                               encode_offset_commit_key("g", "t", 0))], now_ms=1)
    bad = bytearray(good)
    bad[-1] ^= 0xFF  # the CRC no longer matches
    loaded = load_partition([RecordBatch(bad), RecordBatch(good)])
    assert loaded.skipped == 1 and loaded.offsets == {"g": {("t", 0): OffsetAndMetadata(4)}}


def test_expired_offsets_follow_kafka_retention_rules() -> None:
    from tidelog.coordinator.offsets import expired_offsets

    offsets = {
        ("t", 0): OffsetAndMetadata(1, commit_timestamp_ms=100),
        ("t", 1): OffsetAndMetadata(2, commit_timestamp_ms=900),
        ("t", 2): OffsetAndMetadata(3, commit_timestamp_ms=100, expire_timestamp_ms=5000),
    }

    def expired(**kw: object) -> list[tuple[str, int]]:
        args = {"group_is_empty": True, "has_protocol_type": True, "empty_since_ms": 1000,
                "retention_ms": 1000, "now_ms": 1500}
        args.update(kw)
        return sorted(expired_offsets(offsets, **args))  # type: ignore[arg-type]

    # A group with members keeps its offsets; only an explicit expire timestamp counts.
    assert expired(group_is_empty=False, now_ms=4999) == []
    assert expired(group_is_empty=False, now_ms=5000) == [("t", 2)]
    # An Empty consumer group: counted from when it became Empty.
    assert expired(now_ms=1999) == []
    assert expired(now_ms=2000) == [("t", 0), ("t", 1)]
    # Standalone commits (no protocol type): counted from each commit.
    assert expired(has_protocol_type=False, now_ms=1100) == [("t", 0)]
