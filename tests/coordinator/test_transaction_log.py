"""`__transaction_state` records byte for byte as Kafka 3.9.1 writes them. The expected bytes
were produced by Kafka's own generated `TransactionLogKey` / `TransactionLogValue` classes
(kafka-transaction-coordinator-3.9.1.jar) through `MessageUtil.toVersionPrefixedBytes`."""

from __future__ import annotations

import pytest

from tidelog.coordinator.transaction.log import decode_key, decode_value, encode_key, encode_value
from tidelog.coordinator.transaction.metadata import (
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    TransactionState,
    TxnTransitMetadata,
)
from tidelog.replication.types import TopicPartition

KAFKA_KEY = bytes.fromhex("000000066d792d74786e")
KAFKA_EMPTY_V0 = bytes.fromhex(
    "000000000000000003e800030000ea6000ffffffff0000018bcfe56800ffffffffffffffff")
KAFKA_PREPARE_COMMIT_V0 = bytes.fromhex(
    "000000000000000003e800030000ea60020000000200125f5f636f6e73756d65725f6f66667365747300000001"
    "0000000700066f72646572730000000200000000000000020000018bcfe57b880000018bcfe56be8")
KAFKA_PREPARE_COMMIT_V1 = bytes.fromhex(
    "000100000000000003e800030000ea600203135f5f636f6e73756d65725f6f666673657473020000000700076f"
    "7264657273030000000000000002000000018bcfe57b880000018bcfe56be800")
KAFKA_COMPLETE_COMMIT_V0 = bytes.fromhex(
    "000000000000000003e800030000ea6004000000000000018bcfe57f700000018bcfe56be8")

PARTITIONS = frozenset({TopicPartition("__consumer_offsets", 7), TopicPartition("orders", 0),
                        TopicPartition("orders", 2)})


def transit(state: TransactionState, partitions: frozenset[TopicPartition], start: int,
            update: int) -> TxnTransitMetadata:
    return TxnTransitMetadata(1000, NO_PRODUCER_ID, 3, NO_PRODUCER_EPOCH, 60000, state,
                              partitions, start, update)


EMPTY = transit(TransactionState.EMPTY, frozenset(), -1, 1700000000000)
PREPARE_COMMIT = transit(TransactionState.PREPARE_COMMIT, PARTITIONS, 1700000001000,
                         1700000005000)
COMPLETE_COMMIT = transit(TransactionState.COMPLETE_COMMIT, frozenset(), 1700000001000,
                          1700000006000)


def test_the_key_is_kafkas() -> None:
    assert encode_key("my-txn") == KAFKA_KEY
    assert decode_key(KAFKA_KEY) == "my-txn"


@pytest.mark.parametrize(("t", "kafka"), [
    (EMPTY, KAFKA_EMPTY_V0),  # Empty: a null partition list
    (PREPARE_COMMIT, KAFKA_PREPARE_COMMIT_V0),
    (COMPLETE_COMMIT, KAFKA_COMPLETE_COMMIT_V0),  # Complete: an empty (not null) list
])
def test_values_are_written_as_kafka_writes_them_and_read_back(
        t: TxnTransitMetadata, kafka: bytes) -> None:
    assert encode_value(t) == kafka
    assert decode_value(kafka) == t


def test_kafkas_flexible_version_1_is_read() -> None:
    assert decode_value(KAFKA_PREPARE_COMMIT_V1) == PREPARE_COMMIT


def test_a_tombstone_is_a_removed_transactional_id() -> None:
    assert decode_value(None) is None


def test_states_that_are_never_written_are_refused() -> None:
    fence = transit(TransactionState.PREPARE_EPOCH_FENCE, PARTITIONS, 1, 2)
    with pytest.raises(ValueError):
        encode_value(fence)
    with pytest.raises(ValueError):
        encode_value(transit(TransactionState.EMPTY, PARTITIONS, -1, 2))


def test_unknown_versions_are_refused() -> None:
    with pytest.raises(ValueError):
        decode_key(b"\x00\x01" + KAFKA_KEY[2:])
    with pytest.raises(ValueError):
        decode_value(b"\x00\x02" + KAFKA_EMPTY_V0[2:])
