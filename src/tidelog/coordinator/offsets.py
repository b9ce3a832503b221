"""Committed offsets and group metadata as records of `__consumer_offsets`, in Kafka's formats
(apache/kafka `GroupMetadataManager`; the group-coordinator JSON schemas `OffsetCommitKey`,
`OffsetCommitValue`, `GroupMetadataKey`, `GroupMetadataValue`), so that Kafka's tools could read
tidelog's offsets topic and the other way round.

Key: int16 version, then the fields. Versions 0 and 1 are an offset commit (group, topic,
partition); version 2 is a group's metadata (group). A record with a null value is a tombstone.

Value versions written (as Kafka 2.x): OffsetCommitValue v3 (offset, leader epoch, metadata,
commit timestamp), or v1 when the commit carried a retention time (expire timestamp);
GroupMetadataValue v3 (members with instance id and rebalance timeout). Every version 0-4 is
read (v4 is the flexible encoding Kafka 3.x+ writes).

`load_partition` replays a partition's records in order, the last record of a key winning, as
a coordinator does when it becomes leader of that partition.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from tidelog.protocol.records.batch import RecordBatch
from tidelog.protocol.records.decoder import (
    ControlRecordType,
    decode_records,
    parse_end_transaction_marker,
)
from tidelog.utils import java_string_hash

__all__ = [
    "GROUP_METADATA_TOPIC_NAME",
    "GroupMetadataSnapshot",
    "LoadedPartition",
    "MemberSnapshot",
    "OffsetAndMetadata",
    "OffsetKey",
    "decode_group_metadata_value",
    "decode_key",
    "decode_offset_commit_value",
    "encode_group_metadata_key",
    "encode_group_metadata_value",
    "encode_offset_commit_key",
    "encode_offset_commit_value",
    "expired_offsets",
    "java_string_hash",
    "load_partition",
    "partition_for",
]

GROUP_METADATA_TOPIC_NAME = "__consumer_offsets"

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")

OFFSET_COMMIT_KEY_VERSION = 1
GROUP_METADATA_KEY_VERSION = 2
GROUP_METADATA_VALUE_VERSION = 3


def partition_for(group_id: str, num_partitions: int) -> int:
    """The offsets partition of a group: Kafka's `Utils.abs(groupId.hashCode) % n`
    (`Utils.abs(Integer.MIN_VALUE)` is 0)."""
    h = java_string_hash(group_id)
    return (0 if h == -(1 << 31) else abs(h)) % num_partitions


@dataclass(frozen=True, slots=True)
class OffsetAndMetadata:
    offset: int
    leader_epoch: int = -1
    metadata: str = ""
    commit_timestamp_ms: int = -1
    expire_timestamp_ms: int | None = None


@dataclass(frozen=True, slots=True)
class OffsetKey:
    group: str
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class MemberSnapshot:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    subscription: bytes
    assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupMetadataSnapshot:
    protocol_type: str
    generation_id: int
    protocol_name: str | None
    leader_id: str | None
    current_state_timestamp_ms: int
    members: tuple[MemberSnapshot, ...]


# ---------------------------------------------------------------------- writing
def _string(out: bytearray, s: str | None) -> None:
    if s is None:
        out += _I16.pack(-1)
        return
    data = s.encode()
    if len(data) > 0x7FFF:
        raise ValueError(f"string of {len(data)} bytes is too long for an int16 length")
    out += _I16.pack(len(data))
    out += data


def _bytes(out: bytearray, b: bytes) -> None:
    out += _I32.pack(len(b))
    out += b


def encode_offset_commit_key(group: str, topic: str, partition: int) -> bytes:
    out = bytearray(_I16.pack(OFFSET_COMMIT_KEY_VERSION))
    _string(out, group)
    _string(out, topic)
    out += _I32.pack(partition)
    return bytes(out)


def encode_offset_commit_value(om: OffsetAndMetadata) -> bytes:
    if om.expire_timestamp_ms is not None:
        out = bytearray(_I16.pack(1))
        out += _I64.pack(om.offset)
        _string(out, om.metadata)
        out += _I64.pack(om.commit_timestamp_ms)
        out += _I64.pack(om.expire_timestamp_ms)
        return bytes(out)
    out = bytearray(_I16.pack(3))
    out += _I64.pack(om.offset)
    out += _I32.pack(om.leader_epoch)
    _string(out, om.metadata)
    out += _I64.pack(om.commit_timestamp_ms)
    return bytes(out)


def encode_group_metadata_key(group: str) -> bytes:
    out = bytearray(_I16.pack(GROUP_METADATA_KEY_VERSION))
    _string(out, group)
    return bytes(out)


def encode_group_metadata_value(g: GroupMetadataSnapshot) -> bytes:
    out = bytearray(_I16.pack(GROUP_METADATA_VALUE_VERSION))
    _string(out, g.protocol_type)
    out += _I32.pack(g.generation_id)
    _string(out, g.protocol_name)
    _string(out, g.leader_id)
    out += _I64.pack(g.current_state_timestamp_ms)
    out += _I32.pack(len(g.members))
    for m in g.members:
        _string(out, m.member_id)
        _string(out, m.group_instance_id)
        _string(out, m.client_id)
        _string(out, m.client_host)
        out += _I32.pack(m.rebalance_timeout_ms)
        out += _I32.pack(m.session_timeout_ms)
        _bytes(out, m.subscription)
        _bytes(out, m.assignment)
    return bytes(out)


# ---------------------------------------------------------------------- reading
class _Reader:
    """Reads the classic (v0-3) or the flexible (v4) encoding; every error is a ValueError."""

    def __init__(self, data: bytes, flexible: bool = False) -> None:
        self.data = data
        self.pos = 0
        self.flexible = flexible

    def _take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise ValueError(f"record truncated at byte {self.pos} (needs {n} more)")
        b = self.data[self.pos:self.pos + n]
        self.pos += n
        return b

    def int16(self) -> int:
        return int(_I16.unpack(self._take(2))[0])

    def int32(self) -> int:
        return int(_I32.unpack(self._take(4))[0])

    def int64(self) -> int:
        return int(_I64.unpack(self._take(8))[0])

    def uvarint(self) -> int:
        value = shift = 0
        for _ in range(5):
            b = self._take(1)[0]
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7
        raise ValueError("unsigned varint longer than 5 bytes")

    def _length(self, classic: int) -> int:
        return self.uvarint() - 1 if self.flexible else classic

    def nullable_string(self) -> str | None:
        n = self._length(self.int16() if not self.flexible else 0)
        if n < 0:
            return None
        try:
            return self._take(n).decode()
        except UnicodeDecodeError as e:
            raise ValueError(f"invalid UTF-8 string: {e}") from None

    def string(self) -> str:
        s = self.nullable_string()
        if s is None:
            raise ValueError("null where a string is required")
        return s

    def bytes_(self) -> bytes:
        n = self._length(self.int32() if not self.flexible else 0)
        if n < 0:
            raise ValueError("null where bytes are required")
        return self._take(n)

    def array_length(self) -> int:
        n = self._length(self.int32() if not self.flexible else 0)
        if n < 0 or n > len(self.data):
            raise ValueError(f"invalid array length {n}")
        return n

    def tagged_fields(self) -> None:
        if self.flexible:
            for _ in range(self.uvarint()):
                self.uvarint()  # tag
                self._take(self.uvarint())


def decode_key(key: bytes) -> OffsetKey | str:
    """An offsets-topic key: an `OffsetKey`, or the group id of a group metadata record."""
    r = _Reader(key)
    version = r.int16()
    if version in (0, 1):
        return OffsetKey(r.string(), r.string(), r.int32())
    if version == 2:
        return r.string()
    raise ValueError(f"unknown offsets topic key version {version}")


def decode_offset_commit_value(value: bytes) -> OffsetAndMetadata:
    r = _Reader(value)
    version = r.int16()
    if not 0 <= version <= 4:
        raise ValueError(f"unknown OffsetCommitValue version {version}")
    r.flexible = version >= 4
    offset = r.int64()
    leader_epoch = r.int32() if version >= 3 else -1
    metadata = r.string()
    commit_ts = r.int64()
    expire_ts = r.int64() if version == 1 else None
    r.tagged_fields()
    return OffsetAndMetadata(offset, leader_epoch, metadata, commit_ts, expire_ts)


def decode_group_metadata_value(value: bytes) -> GroupMetadataSnapshot:
    r = _Reader(value)
    version = r.int16()
    if not 0 <= version <= 4:
        raise ValueError(f"unknown GroupMetadataValue version {version}")
    r.flexible = version >= 4
    protocol_type = r.string()
    generation = r.int32()
    protocol = r.nullable_string()
    leader = r.nullable_string()
    state_ts = r.int64() if version >= 2 else -1
    members = []
    for _ in range(r.array_length()):
        member_id = r.string()
        instance_id = r.nullable_string() if version >= 3 else None
        client_id = r.string()
        client_host = r.string()
        rebalance_timeout = r.int32() if version >= 1 else -1
        session_timeout = r.int32()
        if rebalance_timeout < 0:
            rebalance_timeout = session_timeout  # v0: the session timeout was both
        subscription = r.bytes_()
        assignment = r.bytes_()
        r.tagged_fields()
        members.append(MemberSnapshot(member_id, instance_id, client_id, client_host,
                                      rebalance_timeout, session_timeout, subscription, assignment))
    r.tagged_fields()
    return GroupMetadataSnapshot(protocol_type, generation, protocol, leader, state_ts,
                                 tuple(members))


def expired_offsets(
    offsets: dict[tuple[str, int], OffsetAndMetadata],
    *,
    group_is_empty: bool,
    has_protocol_type: bool,
    empty_since_ms: int,
    retention_ms: int,
    now_ms: int,
) -> list[tuple[str, int]]:
    """The committed offsets of one group that `offsets.retention.minutes` expires now
    (Kafka 2.1+, KIP-211): one with an explicit expire timestamp (OffsetCommit v2-4 retention
    time) when that passed; otherwise only while the group is Empty, counted from when it
    became Empty, or from each commit for a group that never had members (standalone commits)."""
    out = []
    for tp, om in offsets.items():
        if om.expire_timestamp_ms is not None:
            expired = now_ms >= om.expire_timestamp_ms
        elif not group_is_empty:
            expired = False
        elif has_protocol_type:
            expired = now_ms >= empty_since_ms + retention_ms
        else:
            expired = now_ms >= om.commit_timestamp_ms + retention_ms
        if expired:
            out.append(tp)
    return out


@dataclass(slots=True)
class LoadedPartition:
    """What one offsets partition holds: committed offsets and group metadata by group."""

    offsets: dict[str, dict[tuple[str, int], OffsetAndMetadata]]
    groups: dict[str, GroupMetadataSnapshot]
    skipped: int = 0  # records that could not be read (logged, never fatal)
    # TxnOffsetCommit records of transactions whose marker is not (yet) read, by producer id:
    # applied at its COMMIT, dropped at its ABORT (Kafka's loadGroupsAndOffsets).
    pending_txn: dict[int, dict[OffsetKey, OffsetAndMetadata]] = field(default_factory=dict)

    def add_batch(self, batch: RecordBatch, end_offset: int | None = None) -> bool:
        """Apply one batch; False once `end_offset` is reached (nothing more to read)."""
        if end_offset is not None and batch.base_offset >= end_offset:
            return False
        try:
            records = decode_records(batch)
        except ValueError:  # a corrupt batch (CorruptRecordError is a ValueError)
            self.skipped += 1
            return True
        if batch.is_control_batch:
            self._complete_txn(batch.producer_id, records)
            return True
        txn = self.pending_txn.setdefault(batch.producer_id, {}) if batch.is_transactional \
            else None
        for rec in records:
            if end_offset is not None and rec.offset >= end_offset:
                return False
            if rec.key is None:
                self.skipped += 1
                continue
            try:
                key = decode_key(bytes(rec.key))
                if txn is not None and isinstance(key, OffsetKey) and rec.value is not None:
                    txn[key] = decode_offset_commit_value(bytes(rec.value))
                else:
                    self._apply(key, rec.value)
            except ValueError:
                self.skipped += 1
        return True

    def _complete_txn(self, producer_id: int, records: Iterable[Any]) -> None:
        for rec in records:
            try:
                marker = parse_end_transaction_marker(rec)
            except ValueError:
                continue  # not an end-transaction marker
            offsets = self.pending_txn.pop(producer_id, {})
            if marker.control_type == ControlRecordType.COMMIT:
                for key, om in offsets.items():
                    self.offsets.setdefault(key.group, {})[(key.topic, key.partition)] = om

    def _apply(self, key: OffsetKey | str, value: bytes | None) -> None:
        if isinstance(key, OffsetKey):
            group_offsets = self.offsets.setdefault(key.group, {})
            if value is None:
                group_offsets.pop((key.topic, key.partition), None)
            else:
                group_offsets[(key.topic, key.partition)] = decode_offset_commit_value(bytes(value))
            if not group_offsets:
                del self.offsets[key.group]
        elif value is None:
            self.groups.pop(key, None)
        else:
            self.groups[key] = decode_group_metadata_value(bytes(value))


def load_partition(batches: Iterable[RecordBatch], end_offset: int | None = None) -> LoadedPartition:
    """Replay a partition's batches (up to `end_offset`, exclusive) in order. A record that
    cannot be decoded is counted in `skipped` and ignored, as one bad record must not keep the
    coordinator from loading the rest."""
    out = LoadedPartition({}, {})
    for batch in batches:
        if not out.add_batch(batch, end_offset):
            break
    return out
