"""Storage errors, each carrying the Kafka error code a broker answers with."""

from __future__ import annotations

from tidelog.protocol.records.batch import CorruptRecordError

__all__ = [
    "CorruptIndexError",
    "CorruptRecordError",
    "InvalidOffsetError",
    "KafkaStorageError",
    "OffsetOutOfRangeError",
    "RecordTooLargeError",
    "StorageError",
]


class StorageError(Exception):
    """Base class; `error_code` is Kafka's wire error code for the condition."""

    error_code: int = -1  # UNKNOWN_SERVER_ERROR


class OffsetOutOfRangeError(StorageError):
    """A read outside [log_start_offset, log_end_offset] (Kafka's OFFSET_OUT_OF_RANGE)."""

    error_code = 1

    def __init__(self, offset: int, log_start_offset: int, log_end_offset: int) -> None:
        super().__init__(
            f"offset {offset} is out of range: the log holds "
            f"[{log_start_offset}, {log_end_offset})"
        )
        self.offset = offset
        self.log_start_offset = log_start_offset
        self.log_end_offset = log_end_offset


class RecordTooLargeError(StorageError):
    """A batch larger than max.message.bytes (Kafka's MESSAGE_TOO_LARGE)."""

    error_code = 10

    def __init__(self, size: int, max_size: int) -> None:
        super().__init__(f"record batch of {size} bytes exceeds max.message.bytes {max_size}")
        self.size = size
        self.max_size = max_size


class InvalidOffsetError(StorageError):
    """A follower append whose offsets do not continue the log monotonically
    (Kafka's UnexpectedAppendOffsetException / OffsetsOutOfOrderException)."""

    error_code = 1  # Kafka answers these as OFFSET_OUT_OF_RANGE to a fetcher

    def __init__(self, message: str, first_offset: int = -1, log_end_offset: int = -1) -> None:
        super().__init__(message)
        self.first_offset = first_offset
        self.log_end_offset = log_end_offset


class KafkaStorageError(StorageError):
    """An I/O failure of the log dir (Kafka's KAFKA_STORAGE_ERROR): the log goes offline."""

    error_code = 56


class CorruptIndexError(StorageError):
    """An index file that fails its sanity check; the log rebuilds it from the segment."""

    error_code = 2  # CORRUPT_MESSAGE
