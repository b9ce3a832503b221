"""compression.type and message.timestamp.difference.max.ms, applied by the leader's append."""

from __future__ import annotations

import pytest

from tidelog.protocol.records.batch import CorruptRecordError
from tidelog.protocol.records.builder import Record, build_batch
from tidelog.protocol.records.compression import GZIP, LZ4, NONE, SNAPPY, ZSTD
from tidelog.protocol.records.decoder import decode_records
from tidelog.sim.disk import MemoryFileIO
from tidelog.storage.log import Log
from tidelog.storage.log_config import LogConfig
from tidelog.storage.log_validator import InvalidTimestampError

NOW = 1_700_000_000_000


def new_log(**config: object) -> Log:
    props = {k.replace("_", "."): v for k, v in config.items()}
    return Log("/d/t-0", LogConfig.from_dict(props), MemoryFileIO())


def rows(log: Log) -> list[tuple[int, int, bytes | None, bytes | None]]:
    return [(r.offset, r.timestamp, r.key, r.value) for b in log.batches() for r in decode_records(b)]


def produced(codec: int = NONE, **kw: object) -> bytes:
    recs = [Record(b"v%d" % i, key=b"k%d" % i, timestamp=NOW + i) for i in range(20)]
    return bytes(build_batch(recs, compression=codec, now_ms=NOW, **kw))  # type: ignore[arg-type]


@pytest.mark.parametrize(("topic", "source", "stored"), [
    ("gzip", NONE, GZIP), ("snappy", GZIP, SNAPPY), ("lz4", ZSTD, LZ4), ("zstd", SNAPPY, ZSTD),
    ("uncompressed", LZ4, NONE), ("producer", LZ4, LZ4), ("producer", NONE, NONE),
    ("gzip", GZIP, GZIP),
])
def test_the_leader_stores_the_topics_codec(topic: str, source: int, stored: int) -> None:
    plain = new_log()
    plain.append_as_leader(produced(NONE), 0, NOW)
    log = new_log(compression_type=topic)
    log.append_as_leader(produced(source), 0, NOW)
    [batch] = list(log.batches())
    batch.ensure_valid()  # a fresh CRC32C over the new header and body
    assert batch.compression_type == stored
    assert rows(log) == rows(plain)  # the same records, offsets and timestamps


def test_recompression_keeps_the_producer_id_sequence_and_flags() -> None:
    log = new_log(compression_type="zstd")
    log.append_as_leader(produced(NONE, producer_id=7, producer_epoch=2, base_sequence=40), 3, NOW)
    [batch] = list(log.batches())
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (7, 2, 40)
    assert (batch.partition_leader_epoch, batch.compression_type) == (3, ZSTD)


def test_a_corrupt_batch_is_refused_not_repaired_by_recompression() -> None:
    data = bytearray(produced(NONE))
    data[-1] ^= 0xFF
    log = new_log(compression_type="gzip")
    with pytest.raises(CorruptRecordError):
        log.append_as_leader(bytes(data), 0, NOW)
    assert log.log_end_offset == 0


def test_create_time_too_far_from_the_broker_clock_is_invalid_timestamp() -> None:
    log = new_log(message_timestamp_difference_max_ms=1000)
    late = bytes(build_batch([Record(b"ok", timestamp=NOW), Record(b"old", timestamp=NOW - 5000)]))
    with pytest.raises(InvalidTimestampError) as e:
        log.append_as_leader(late, 0, NOW)
    assert e.value.error_code == 32
    assert log.log_end_offset == 0  # the whole batch is refused
    future = bytes(build_batch([Record(b"f", timestamp=NOW + 1001)]))
    with pytest.raises(InvalidTimestampError):
        log.append_as_leader(future, 0, NOW)
    log.append_as_leader(bytes(build_batch([Record(b"near", timestamp=NOW - 1000)])), 0, NOW)
    assert log.log_end_offset == 1


def test_the_timestamp_bound_does_not_apply_to_log_append_time_or_by_default() -> None:
    old = bytes(build_batch([Record(b"old", timestamp=NOW - 10**9)]))
    new_log().append_as_leader(old, 0, NOW)
    log = new_log(message_timestamp_difference_max_ms=1000, message_timestamp_type="LogAppendTime")
    log.append_as_leader(old, 0, NOW)
    assert rows(log)[0][1] == NOW  # the broker's append time replaces it
