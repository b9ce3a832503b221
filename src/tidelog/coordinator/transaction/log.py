"""`__transaction_state` records in Kafka's format (`TransactionLogKey` / `TransactionLogValue`,
version-prefixed as `MessageUtil.toVersionPrefixedBytes` writes them).

Key v0: int16 version, string transactional_id. Value v0: int16 version, int64 producer id,
int16 producer epoch, int32 timeout, int8 state, nullable array of (string topic, array of
int32 partition) — null for Empty, as Kafka writes it — int64 last update, int64 start. Value v1
(Kafka 4's flexible version) is read too: compact strings and arrays and tagged fields. A
tombstone (null value) is a transactional id removed after `transactional.id.expiration.ms`.
"""

from __future__ import annotations

import struct
from collections import defaultdict

from tidelog.coordinator.offsets import _Reader
from tidelog.coordinator.transaction.metadata import (
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    TransactionState,
    TxnTransitMetadata,
)
from tidelog.replication.types import TopicPartition

__all__ = [
    "TRANSACTION_STATE_TOPIC_NAME",
    "decode_key",
    "decode_value",
    "encode_key",
    "encode_value",
]

TRANSACTION_STATE_TOPIC_NAME = "__transaction_state"
KEY_VERSION = 0
VALUE_VERSION = 0

_H = struct.Struct(">h")
_I = struct.Struct(">i")
_VALUE_HEAD = struct.Struct(">hqhib")
_VALUE_TAIL = struct.Struct(">qq")


def _string(out: bytearray, s: str) -> None:
    data = s.encode()
    out += _H.pack(len(data))
    out += data


def encode_key(transactional_id: str) -> bytes:
    out = bytearray(_H.pack(KEY_VERSION))
    _string(out, transactional_id)
    return bytes(out)


def decode_key(data: bytes) -> str:
    r = _Reader(data)
    version = r.int16()
    if version != KEY_VERSION:
        raise ValueError(f"unknown transaction log key version {version}")
    return r.string()


def encode_value(t: TxnTransitMetadata) -> bytes:
    if t.txn_state == TransactionState.PREPARE_EPOCH_FENCE:
        raise ValueError("PrepareEpochFence is never written")
    if t.txn_state == TransactionState.EMPTY and t.topic_partitions:
        raise ValueError("an Empty transaction holds no partitions")
    out = bytearray(_VALUE_HEAD.pack(VALUE_VERSION, t.producer_id, t.producer_epoch,
                                     t.txn_timeout_ms, int(t.txn_state)))
    if t.txn_state == TransactionState.EMPTY:
        out += _I.pack(-1)
    else:
        by_topic: dict[str, list[int]] = defaultdict(list)
        for tp in t.topic_partitions:
            by_topic[tp.topic].append(tp.partition)
        out += _I.pack(len(by_topic))
        for topic in sorted(by_topic):
            _string(out, topic)
            parts = sorted(by_topic[topic])
            out += _I.pack(len(parts))
            for p in parts:
                out += _I.pack(p)
    out += _VALUE_TAIL.pack(t.txn_last_update_timestamp, t.txn_start_timestamp)
    return bytes(out)


def decode_value(data: bytes | None) -> TxnTransitMetadata | None:
    """The transit a value describes (last producer id/epoch unknown, as Kafka 3.x loads them);
    None for a tombstone."""
    if data is None:
        return None
    version = _H.unpack_from(data, 0)[0]
    if version not in (0, 1):
        raise ValueError(f"unknown transaction log value version {version}")
    r = _Reader(data[2:], flexible=version >= 1)
    producer_id = r.int64()
    producer_epoch = r.int16()
    timeout_ms = r.int32()
    state = TransactionState(r._take(1)[0])
    n = r.uvarint() - 1 if version >= 1 else r.int32()  # a nullable array: -1 is null
    partitions: set[TopicPartition] = set()
    for _ in range(max(n, 0)):
        topic = r.string()
        for _ in range(r.array_length()):
            partitions.add(TopicPartition(topic, r.int32()))
        if version >= 1:
            r.tagged_fields()
    last_update = r.int64()
    start = r.int64()
    r.tagged_fields()
    return TxnTransitMetadata(producer_id, NO_PRODUCER_ID, producer_epoch, NO_PRODUCER_EPOCH,
                              timeout_ms, state, frozenset(partitions), start, last_update)
