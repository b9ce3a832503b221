"""read_offset_range against a scripted partition: what a task returns for what the leader says.

The broker boundary is scripted (a partition log of real v2 batches, answered as a leader would:
records up to the end of the log, and the high watermark) so that states a single-node test
broker cannot reach are covered: records above the HW, leader changes, an unclean truncation,
retention. No Spark here; the Arrow batches are what ``read()`` hands Spark.
"""

from __future__ import annotations

import logging

import pyarrow as pa
import pytest

from tidelog.client.cluster import FetchResult
from tidelog.client.metadata import TopicPartition
from tidelog.protocol.errors import ErrorCode
from tidelog.protocol.records import GZIP, Record, build_batch, build_end_transaction_marker
from tidelog.spark.arrow import arrow_schema, source_schema
from tidelog.spark.options import parse_source_options
from tidelog.spark.reader import DataLossError, OffsetRange, plan_offset_ranges, read_offset_range

TP = TopicPartition("t", 0)


class ScriptedPartition:
    """One partition's log (batches with offsets) and a script of fetch answers."""

    def __init__(self, batches: list[bytes], high_watermark: int, log_start: int = 0) -> None:
        self.batches = batches
        self.high_watermark = high_watermark
        self.log_start = log_start
        self.errors: list[ErrorCode] = []  # answered first, one per fetch
        self.fetches: list[int] = []
        self.on_fetch = None  # called before each answer (to move the HW, say)

    def _log_end(self) -> int:
        from tidelog.protocol.records import RecordBatch

        return max((RecordBatch(b).next_offset for b in self.batches), default=0)

    def fetch(self, tp: TopicPartition, offset: int, *, max_bytes: int) -> FetchResult:
        self.fetches.append(offset)
        if self.on_fetch is not None:
            self.on_fetch(self)
        if self.errors:
            return FetchResult(self.errors.pop(0))
        if offset < self.log_start or offset > self._log_end():
            return FetchResult(ErrorCode.OFFSET_OUT_OF_RANGE, log_start_offset=self.log_start)
        from tidelog.protocol.records import RecordBatch

        data = b"".join(b for b in self.batches if RecordBatch(b).next_offset > offset)[:max_bytes]
        return FetchResult(
            ErrorCode.NONE,
            high_watermark=self.high_watermark,
            log_start_offset=self.log_start,
            records=data,
        )

    def earliest_offsets(self, tps, **_: int) -> dict[TopicPartition, int]:
        return {tp: self.log_start for tp in tps}

    def latest_offsets(self, tps, **_: int) -> dict[TopicPartition, int]:
        return {tp: self.high_watermark for tp in tps}


def _batch(base: int, values: list[bytes], **kwargs) -> bytes:
    return bytes(
        build_batch([Record(v, timestamp=1000 + base) for v in values], base_offset=base, **kwargs)
    )


def _options(**extra: str):
    return parse_source_options(
        {"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "t", **extra}, streaming=False
    )


def _read(log: ScriptedPartition, start: int, end: int, **extra: str) -> pa.Table:
    schema = arrow_schema(source_schema(include_headers=False))
    batches = list(
        read_offset_range(_options(**extra), schema, OffsetRange("t", 0, start, end), kafka=log)
    )
    assert all(b.schema.equals(schema) for b in batches)
    return pa.Table.from_batches(batches, schema=schema)


def test_only_records_below_the_high_watermark_are_returned() -> None:
    log = ScriptedPartition([_batch(0, [b"a", b"b"]), _batch(2, [b"c", b"d"])], high_watermark=2)

    def replicate(p: ScriptedPartition) -> None:
        if len(p.fetches) == 3:
            p.high_watermark = 4  # the followers caught up after two fetches

    log.on_fetch = replicate
    table = _read(log, 0, 4, **{"kafkaConsumer.pollTimeoutMs": "5000"})
    assert table.column("value").to_pylist() == [b"a", b"b", b"c", b"d"]
    assert table.column("offset").to_pylist() == [0, 1, 2, 3]
    # The fetch that saw HW=2 returned the first batch only; the next waited for the HW.
    assert log.fetches[:2] == [0, 2]


def test_leader_changes_are_retried_inside_the_task() -> None:
    log = ScriptedPartition([_batch(0, [b"x", b"y"])], high_watermark=2)
    log.errors = [
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.LEADER_NOT_AVAILABLE,
        ErrorCode.NETWORK_EXCEPTION,
    ]
    table = _read(log, 0, 2)
    assert table.column("value").to_pylist() == [b"x", b"y"]
    assert len(log.fetches) == 4


def test_a_non_retriable_error_fails_the_task() -> None:
    log = ScriptedPartition([_batch(0, [b"x"])], high_watermark=1)
    log.errors = [ErrorCode.TOPIC_AUTHORIZATION_FAILED]
    with pytest.raises(RuntimeError, match="TOPIC_AUTHORIZATION_FAILED"):
        _read(log, 0, 1)


def test_compressed_batch_is_cut_to_the_range_and_markers_are_skipped() -> None:
    log = ScriptedPartition(
        [
            _batch(0, [b"v%d" % i for i in range(10)], compression=GZIP),
            bytes(
                build_end_transaction_marker(
                    commit=True,
                    producer_id=7,
                    producer_epoch=0,
                    coordinator_epoch=0,
                    base_offset=10,
                )
            ),
            _batch(11, [b"w"]),
        ],
        high_watermark=12,
    )
    table = _read(log, 4, 12)
    assert table.column("offset").to_pylist() == [4, 5, 6, 7, 8, 9, 11]
    assert table.column("value").to_pylist()[-1] == b"w"
    assert table.column("timestamp").to_pylist()[0].timestamp() == pytest.approx(1.0)


def test_retention_below_the_range_is_data_loss(caplog: pytest.LogCaptureFixture) -> None:
    log = ScriptedPartition([_batch(5, [b"e", b"f", b"g"])], high_watermark=8, log_start=5)
    with pytest.raises(DataLossError, match=r"offsets \[2, 5\) are lost"):
        _read(log, 2, 8)
    with caplog.at_level(logging.WARNING, logger="tidelog.spark"):
        table = _read(log, 2, 8, failOnDataLoss="false")
    assert table.column("offset").to_pylist() == [5, 6, 7]
    assert "are lost" in caplog.text


def test_planned_offsets_that_never_commit_are_data_loss() -> None:
    # An unclean election truncated the log to 1 after the driver planned [0, 3).
    log = ScriptedPartition([_batch(0, [b"kept"])], high_watermark=1)
    options = {"kafkaConsumer.pollTimeoutMs": "200"}
    with pytest.raises(DataLossError, match="high watermark is 1"):
        _read(log, 0, 3, **options)
    table = _read(log, 0, 3, failOnDataLoss="false", **options)
    assert table.column("value").to_pylist() == [b"kept"]


def test_min_partitions_splits_in_proportion() -> None:
    a, b = TopicPartition("t", 0), TopicPartition("t", 1)
    ranges = plan_offset_ranges({a: 0, b: 10}, {a: 100, b: 20}, min_partitions=4)
    assert sum(r.size for r in ranges if r.partition == 0) == 100
    assert sum(r.size for r in ranges if r.partition == 1) == 10
    assert len(ranges) >= 4
    assert [r for r in plan_offset_ranges({a: 5}, {a: 5})] == []


def test_a_batch_larger_than_the_fetch_size_grows_the_fetch() -> None:
    big = _batch(0, [b"x" * 300, b"y" * 300])
    log = ScriptedPartition([big], high_watermark=2)
    table = _read(log, 0, 2, **{"kafka.max.partition.fetch.bytes": "64"})
    assert table.column("value").to_pylist() == [b"x" * 300, b"y" * 300]
    assert len(log.fetches) == 1 + (len(big) - 1).bit_length() - 6  # 64, 128, ... >= len(big)
