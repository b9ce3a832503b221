"""Kafka error codes used by the replication core, and the exception that carries one.

The numeric values are Kafka's (``org.apache.kafka.common.protocol.Errors``) so the wire layer
maps them 1:1. Only the subset the core produces or consumes is listed.
"""

from __future__ import annotations

from enum import IntEnum


class Errors(IntEnum):
    UNKNOWN_SERVER_ERROR = -1
    NONE = 0
    OFFSET_OUT_OF_RANGE = 1
    CORRUPT_MESSAGE = 2
    UNKNOWN_TOPIC_OR_PARTITION = 3
    LEADER_NOT_AVAILABLE = 5
    NOT_LEADER_OR_FOLLOWER = 6
    REQUEST_TIMED_OUT = 7
    REPLICA_NOT_AVAILABLE = 9
    MESSAGE_TOO_LARGE = 10
    STALE_CONTROLLER_EPOCH = 11
    RECORD_LIST_TOO_LARGE = 18
    NOT_ENOUGH_REPLICAS = 19
    NOT_ENOUGH_REPLICAS_AFTER_APPEND = 20
    INVALID_REQUIRED_ACKS = 21
    INVALID_TIMESTAMP = 32
    INVALID_REQUEST = 42
    OUT_OF_ORDER_SEQUENCE_NUMBER = 45
    INVALID_PRODUCER_EPOCH = 47
    INVALID_TXN_STATE = 48
    TRANSACTION_COORDINATOR_FENCED = 52
    KAFKA_STORAGE_ERROR = 56
    FETCH_SESSION_ID_NOT_FOUND = 70
    INVALID_FETCH_SESSION_EPOCH = 71
    FENCED_LEADER_EPOCH = 74
    UNKNOWN_LEADER_EPOCH = 75
    UNSUPPORTED_COMPRESSION_TYPE = 76
    STALE_BROKER_EPOCH = 77
    OFFSET_NOT_AVAILABLE = 78
    INVALID_RECORD = 87
    INELIGIBLE_REPLICA = 107
    NEW_LEADER_ELECTED = 108


class ReplicationError(Exception):
    """Raised by Partition methods; ``error`` is the code the request handler returns."""

    def __init__(self, error: Errors, message: str = "") -> None:
        super().__init__(f"{error.name}: {message}" if message else error.name)
        self.error = error
