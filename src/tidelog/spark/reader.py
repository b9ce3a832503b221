"""The batch reader, and reading one offset range of one partition (shared with streaming).

Planning (on the driver) turns startingOffsets/endingOffsets into one :class:`OffsetRange` per
topic-partition (split further when ``minPartitions`` asks for more tasks, as Spark's
``KafkaOffsetRangeCalculator``). :func:`read_offset_range` runs on an executor: it opens its own
client, fetches from the partition's leader (following leader changes: the client refreshes
metadata and retries, and this loop keeps trying for up to ``kafkaConsumer.pollTimeoutMs``),
returns only records below the high watermark (committed), and yields pyarrow RecordBatches
built from the decoded record batches.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from tidelog.client.metadata import TopicPartition
from tidelog.client.read_committed import AbortedTransactions
from tidelog.protocol.errors import ErrorCode
from tidelog.protocol.records import iter_batches
from tidelog.spark.arrow import RowBuffer, arrow_schema
from tidelog.spark.kafka_io import SyncKafka
from tidelog.spark.offsets import EARLIEST, LATEST
from tidelog.spark.options import OffsetLimit, SourceOptions, TidelogOptionError

__all__ = [
    "DataLossError",
    "OffsetRange",
    "TidelogBatchReader",
    "plan_offset_ranges",
    "read_offset_range",
    "report_data_loss",
    "resolve_offsets",
]

log = logging.getLogger("tidelog.spark")

# Rows per Arrow batch handed to Spark: large enough to amortise the per-batch cost.
ARROW_BATCH_ROWS = 65536
# Arrow's binary arrays address at most 2 GiB; stay far below it (and below Spark's row memory).
ARROW_BATCH_BYTES = 256 * 1024 * 1024
# The largest fetch a task grows to for one oversized batch (Kafka's message.max.bytes is 1 MiB
# by default; this leaves room for brokers configured far above it).
MAX_FETCH_BYTES = 256 * 1024 * 1024

INSTRUCTION_FOR_FAIL_ON_DATA_LOSS_FALSE = (
    "Some data may have been lost because they are not available in tidelog any more; either "
    "the data was aged out by retention or the topic may have been deleted before all the data "
    "in the topic was processed. If you don't want your streaming query to fail on such cases, "
    'set the source option "failOnDataLoss" to "false".'
)
INSTRUCTION_FOR_FAIL_ON_DATA_LOSS_TRUE = (
    "Some data may have been lost because they are not available in tidelog any more; either "
    "the data was aged out by retention or the topic may have been deleted before all the data "
    "in the topic was processed. If you want your streaming query to fail on such cases, set "
    'the source option "failOnDataLoss" to "true".'
)


class DataLossError(RuntimeError):
    """Offsets a query still had to read are gone (retention, deletion, truncation)."""


def report_data_loss(fail_on_data_loss: bool, message: str) -> None:
    """Raise when failOnDataLoss, else log a warning (the caller then skips ahead)."""
    if fail_on_data_loss:
        raise DataLossError(f"{message}. {INSTRUCTION_FOR_FAIL_ON_DATA_LOSS_FALSE}")
    log.warning("%s. %s", message, INSTRUCTION_FOR_FAIL_ON_DATA_LOSS_TRUE)


@dataclass(frozen=True)
class OffsetRange(InputPartition):
    """Offsets [from_offset, until_offset) of one topic-partition: one Spark task."""

    topic: str
    partition: int
    from_offset: int
    until_offset: int

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)

    @property
    def size(self) -> int:
        return max(0, self.until_offset - self.from_offset)


def plan_offset_ranges(
    start: Mapping[TopicPartition, int],
    end: Mapping[TopicPartition, int],
    min_partitions: int | None = None,
) -> list[OffsetRange]:
    """One range per partition with data; with ``min_partitions`` larger than that, big
    ranges are split in proportion to their size (Spark's KafkaOffsetRangeCalculator)."""
    ranges = [
        OffsetRange(tp.topic, tp.partition, start[tp], end[tp])
        for tp in sorted(end)
        if tp in start and end[tp] > start[tp]
    ]
    if min_partitions is None or len(ranges) >= min_partitions or not ranges:
        return ranges
    total = sum(r.size for r in ranges)
    split: list[OffsetRange] = []
    for r in ranges:
        parts = max(1, min(r.size, round(r.size / total * min_partitions)))
        for i in range(parts):
            lo = r.from_offset + r.size * i // parts
            hi = r.from_offset + r.size * (i + 1) // parts
            split.append(OffsetRange(r.topic, r.partition, lo, hi))
    return split


def resolve_offsets(
    kafka: SyncKafka,
    limit: OffsetLimit,
    tps: Sequence[TopicPartition],
    options: SourceOptions,
    option_name: str,
) -> dict[TopicPartition, int]:
    """earliest / latest / specific (with -2 and -1 in it) -> real offsets for ``tps``."""
    retry = {
        "retries": options.fetch_offset_num_retries,
        "retry_interval_ms": options.fetch_offset_retry_interval_ms,
    }
    if limit.kind == "earliest":
        return kafka.earliest_offsets(tps, **retry)
    if limit.kind == "latest":
        return kafka.latest_offsets(tps, **retry)
    if limit.kind == "timestamp" and limit.timestamp is not None:
        return _offsets_for_times(kafka, {tp: limit.timestamp for tp in tps}, limit, options)
    missing = set(tps) - set(limit.offsets)
    unknown = set(limit.offsets) - set(tps)
    if missing or unknown:
        detail = []
        if missing:
            detail.append("missing " + ", ".join(map(str, sorted(missing))))
        if unknown:
            detail.append("not in the subscription " + ", ".join(map(str, sorted(unknown))))
        raise TidelogOptionError(
            option_name, "must specify every subscribed topic-partition: " + "; ".join(detail)
        )
    if limit.kind == "timestamp":
        return _offsets_for_times(kafka, dict(limit.offsets), limit, options)
    resolved = dict(limit.offsets)
    earliest = [tp for tp, off in resolved.items() if off == EARLIEST]
    latest = [tp for tp, off in resolved.items() if off == LATEST]
    resolved.update(kafka.earliest_offsets(earliest, **retry))
    resolved.update(kafka.latest_offsets(latest, **retry))
    return resolved


def _offsets_for_times(
    kafka: SyncKafka,
    timestamps: dict[TopicPartition, int],
    limit: OffsetLimit,
    options: SourceOptions,
) -> dict[TopicPartition, int]:
    """The first offset at or after each timestamp. No such record: the latest offset for an
    ending limit (Spark), and for a starting one an error unless
    startingOffsetsByTimestampStrategy is ``latest``."""
    retry = {
        "retries": options.fetch_offset_num_retries,
        "retry_interval_ms": options.fetch_offset_retry_interval_ms,
    }
    found = kafka.offsets_for_times(timestamps, **retry)
    unmatched = sorted(tp for tp, off in found.items() if off < 0)
    if unmatched:
        starting = limit.option.startswith("starting")
        if starting and options.timestamp_no_match == "error":
            names = ", ".join(f"{tp} (timestamp {timestamps[tp]})" for tp in unmatched)
            raise TidelogOptionError(
                limit.option,
                f"no record at or after the timestamp in {names}; set "
                "startingOffsetsByTimestampStrategy to latest to start at the end instead",
            )
        found.update(kafka.latest_offsets(unmatched, **retry))
    return found


def _retriable(code: int) -> bool:
    try:
        return ErrorCode(code).retriable
    except ValueError:
        return False


def read_offset_range(
    options: SourceOptions,
    schema: pa.Schema,
    rng: OffsetRange,
    *,
    kafka: SyncKafka | None = None,
) -> Iterator[pa.RecordBatch]:
    """Yield the committed records with offsets in ``rng`` as Arrow batches of ``schema``.

    Offsets missing inside the range (compaction, transaction markers) are simply absent.
    Offsets that are gone (below the log start) or never came (the HW stays below the range's
    end for pollTimeoutMs) are data loss: an error with failOnDataLoss, else a warning.
    """
    if rng.until_offset <= rng.from_offset:
        return
    own = kafka is None
    if kafka is None:
        kafka = SyncKafka(options.bootstrap_servers, client_id=options.client_id,
                          read_committed=options.read_committed)
    try:
        yield from _read(kafka, options, schema, rng)
    finally:
        if own:
            kafka.close()


def _read(
    kafka: SyncKafka, options: SourceOptions, schema: pa.Schema, rng: OffsetRange
) -> Iterator[pa.RecordBatch]:
    tp = rng.tp
    until = rng.until_offset
    offset = rng.from_offset
    buffer = RowBuffer(rng.topic, rng.partition, schema)
    max_bytes = options.fetch_max_bytes
    deadline = time.monotonic() + options.poll_timeout_ms / 1000
    idle_sleep = 0.01
    while offset < until:
        result = kafka.fetch(tp, offset, max_bytes=max_bytes)
        if result.error == ErrorCode.OFFSET_OUT_OF_RANGE:
            start = kafka.earliest_offsets([tp]).get(tp, offset)
            if start > offset:
                report_data_loss(
                    options.fail_on_data_loss,
                    f"Cannot fetch offset {offset} of {tp}: the earliest available offset is "
                    f"{start} (offsets [{offset}, {min(start, until)}) are lost)",
                )
                offset = start
                continue
            latest = kafka.latest_offsets([tp]).get(tp, offset)
            report_data_loss(
                options.fail_on_data_loss,
                f"Cannot fetch offset {offset} of {tp}: the latest offset is {latest}, so "
                f"offsets [{offset}, {until}) will never arrive (topic deleted or recreated?)",
            )
            break
        if result.error != ErrorCode.NONE:
            if not _retriable(result.error) or time.monotonic() > deadline:
                raise RuntimeError(
                    f"fetching {tp} at offset {offset} failed: "
                    f"{getattr(result.error, 'name', result.error)}"
                )
            time.sleep(idle_sleep)
            idle_sleep = min(1.0, idle_sleep * 2)
            continue
        # Only committed records: nothing at or past the high watermark (the last stable
        # offset when reading committed, skipping aborted transactions and markers).
        end = result.last_stable_offset if options.read_committed else result.high_watermark
        limit = min(until, end) if end >= 0 else until
        advanced = False
        aborted = AbortedTransactions(result.aborted_transactions)
        for batch in iter_batches(result.records):
            if batch.next_offset <= offset:
                aborted.skip(batch)  # keeps the filter's state in step
                continue  # wholly before the range (a fetch returns whole batches)
            if batch.base_offset >= limit:
                break
            if not aborted.skip(batch):
                buffer.add(batch, offset, limit)
            # Past the HW the rest of the batch is not committed yet: fetched again later.
            offset = min(batch.next_offset, limit)
            advanced = True
            if len(buffer) >= ARROW_BATCH_ROWS or buffer.data_bytes >= ARROW_BATCH_BYTES:
                yield buffer.to_arrow()
            if offset >= limit:
                break
        if advanced:
            deadline = time.monotonic() + options.poll_timeout_ms / 1000
            idle_sleep = 0.01
            continue
        if len(result.records) >= max_bytes and end > offset:
            if max_bytes >= MAX_FETCH_BYTES:
                raise RuntimeError(
                    f"{tp} at offset {offset}: no complete record batch in {max_bytes} bytes"
                )
            max_bytes = min(MAX_FETCH_BYTES, max_bytes * 2)  # a batch larger than the fetch
            continue
        if time.monotonic() > deadline:
            latest = kafka.latest_offsets([tp]).get(tp, result.high_watermark)
            report_data_loss(
                options.fail_on_data_loss,
                f"Offsets [{offset}, {until}) of {tp} were planned but the high watermark is "
                f"{latest} after waiting {options.poll_timeout_ms} ms",
            )
            break
        time.sleep(idle_sleep)  # the HW is behind the plan (leader change): wait for it
        idle_sleep = min(1.0, idle_sleep * 2)
    if len(buffer):
        yield buffer.to_arrow()


class TidelogBatchReader(DataSourceReader):
    """``spark.read.format("tidelog")``: offsets resolved once, at planning."""

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema

    def partitions(self) -> Sequence[InputPartition]:
        options = self.options
        with SyncKafka(options.bootstrap_servers, client_id=options.client_id,
                       read_committed=options.read_committed) as kafka:
            tps = kafka.topic_partitions(options.subscription)
            start = resolve_offsets(
                kafka, options.starting_offsets, tps, options, "startingOffsets"
            )
            assert options.ending_offsets is not None
            end = resolve_offsets(kafka, options.ending_offsets, tps, options, "endingOffsets")
        for tp in tps:
            if start[tp] > end[tp]:
                raise TidelogOptionError(
                    "startingOffsets",
                    f"{tp}: the starting offset {start[tp]} is after the ending offset {end[tp]}",
                )
        return plan_offset_ranges(start, end, options.min_partitions)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, OffsetRange):
            return  # Spark plans InputPartition(None) when there is nothing to read
        yield from read_offset_range(self.options, arrow_schema(self.schema), partition)
