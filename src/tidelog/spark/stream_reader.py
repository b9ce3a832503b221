"""The streaming reader: Spark streaming offsets over tidelog partitions.

An offset is ``{"topic": {"partition": next offset}}`` (Spark's Kafka format), written by Spark
to the checkpoint's offset log before a micro-batch runs and to the commit log after it. A query
restarted from its checkpoint re-plans the last uncommitted batch from the same two offsets, so
it reads exactly the same records: no duplicates, no gaps.

Semantics follow Spark's ``KafkaMicroBatchStream``: ``latestOffset(start, limit)`` returns the
high watermarks, capped by ``maxOffsetsPerTrigger`` split across partitions in proportion to
their backlog (every partition with data gets at least one offset), delayed by
``minOffsetsPerTrigger`` until enough records arrived or ``maxTriggerDelay`` passed. Partitions
that appear (new topics matching the pattern, added partitions) are read from their earliest
offset; partitions that vanish, offsets that went backwards (a recreated topic) and offsets
deleted by retention are data loss: the query fails when ``failOnDataLoss`` is true, else it
logs a warning and skips to what is available.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from tidelog.client.metadata import TopicPartition
from tidelog.spark.arrow import arrow_schema
from tidelog.spark.kafka_io import SyncKafka
from tidelog.spark.offsets import from_offset_dict, to_offset_dict
from tidelog.spark.options import SourceOptions
from tidelog.spark.reader import (
    OffsetRange,
    plan_offset_ranges,
    read_offset_range,
    report_data_loss,
    resolve_offsets,
)

__all__ = ["TidelogStreamReader", "rate_limit"]

Offsets = dict[TopicPartition, int]


def rate_limit(limit: int, start: Offsets, latest: Offsets) -> Offsets:
    """Spread ``limit`` offsets over the partitions in proportion to their backlog (Spark's
    KafkaMicroBatchStream.rateLimit): a share below one rounds up, so no partition with data
    starves; above one it rounds down; never past ``latest``."""
    sizes = {tp: end - start[tp] for tp, end in latest.items() if tp in start and end > start[tp]}
    total = float(sum(sizes.values()))
    if total < 1:
        return dict(latest)
    result: Offsets = {}
    for tp, end in latest.items():
        size = sizes.get(tp)
        if size is None:
            result[tp] = end
            continue
        share = limit * (size / total)
        step = int(share) if share >= 1 else (1 if share > 0 else 0)
        result[tp] = min(end, start[tp] + step)
    return result


class TidelogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("tidelog")``. Created cheaply (Spark builds more than one);
    the client opens on first use and is never pickled to executors."""

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema
        self._kafka: SyncKafka | None = None
        self._available_now: Offsets | None = None
        self._last_trigger_ms = time.monotonic() * 1000
        self._latest: Offsets | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_kafka"] = None
        return state

    @property
    def kafka(self) -> SyncKafka:
        if self._kafka is None:
            self._kafka = SyncKafka(
                self.options.bootstrap_servers, client_id=self.options.client_id,
                read_committed=self.options.read_committed,
            )
        return self._kafka

    def _retry(self) -> dict[str, int]:
        return {
            "retries": self.options.fetch_offset_num_retries,
            "retry_interval_ms": self.options.fetch_offset_retry_interval_ms,
        }

    # -- offsets --------------------------------------------------------------------------

    def initialOffset(self) -> dict:
        tps = self.kafka.topic_partitions(self.options.subscription)
        offsets = resolve_offsets(
            self.kafka, self.options.starting_offsets, tps, self.options, "startingOffsets"
        )
        return to_offset_dict(offsets)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.options.max_offsets_per_trigger)
        if self.options.min_offsets_per_trigger is not None:
            return ReadMinRows(self.options.min_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        tps = self.kafka.topic_partitions(self.options.subscription)
        self._available_now = self.kafka.latest_offsets(tps, **self._retry())

    def _current_latest(self) -> Offsets:
        if self._available_now is not None:
            return dict(self._available_now)
        tps = self.kafka.topic_partitions(self.options.subscription)
        return self.kafka.latest_offsets(tps, **self._retry())

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = from_offset_dict(start)
        latest = self._current_latest()
        self._latest = latest
        new = [tp for tp in latest if tp not in begin]
        if new:
            begin.update(self.kafka.earliest_offsets(new, **self._retry()))
        if isinstance(limit, ReadAllAvailable):
            return to_offset_dict(latest)
        min_rows = limit.min_rows if isinstance(limit, ReadMinRows) else None
        if min_rows is None:
            min_rows = self.options.min_offsets_per_trigger
        if self._available_now is not None:
            min_rows = None  # availableNow must reach its target and end, not wait for more
        if min_rows is not None and self._delay_batch(min_rows, begin, latest):
            return start
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        if max_rows is None:
            return to_offset_dict(latest)
        return to_offset_dict(rate_limit(max_rows, begin, latest))

    def _delay_batch(self, min_rows: int, begin: Offsets, latest: Offsets) -> bool:
        """minOffsetsPerTrigger: hold the batch back until enough records arrived, or until
        maxTriggerDelay passed since the last batch (Spark's delayBatch)."""
        now_ms = time.monotonic() * 1000
        if now_ms - self._last_trigger_ms >= self.options.max_trigger_delay_ms:
            self._last_trigger_ms = now_ms
            return False
        available = sum(max(0, end - begin.get(tp, end)) for tp, end in latest.items())
        if available < min_rows:
            return True
        self._last_trigger_ms = now_ms
        return False

    def reportLatestOffset(self) -> dict | None:
        return None if self._latest is None else to_offset_dict(self._latest)

    # -- planning and reading -------------------------------------------------------------

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        begin = from_offset_dict(start)
        until = from_offset_dict(end)
        fail = self.options.fail_on_data_loss
        gone = sorted(set(begin) - set(until))
        if gone:
            report_data_loss(fail, f"{', '.join(map(str, gone))} are gone")
        new = [tp for tp in until if tp not in begin]
        if new:
            earliest = self.kafka.earliest_offsets(new, **self._retry())
            for tp in new:
                # Spark: an added partition should start at 0; anything else was deleted.
                if earliest[tp] != 0:
                    report_data_loss(
                        fail, f"Added partition {tp} starts from {earliest[tp]} instead of 0"
                    )
            begin.update(earliest)
        for tp, end_offset in until.items():
            if end_offset < begin[tp]:
                report_data_loss(
                    fail,
                    f"Partition {tp}'s offset was changed from {begin[tp]} to {end_offset}, "
                    "some data may have been missed",
                )
                # Skip what is gone but not what the new log holds: read it from its start.
                begin[tp] = min(end_offset, self.kafka.earliest_offsets([tp])[tp])
        return plan_offset_ranges(begin, until, self.options.min_partitions)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, OffsetRange):
            return  # Spark plans InputPartition(None) when there is nothing to read
        yield from read_offset_range(self.options, arrow_schema(self.schema), partition)

    def commit(self, end: dict) -> None:
        # Offsets live in Spark's checkpoint; nothing is committed to the log (as Spark's
        # Kafka source, which uses no consumer group offsets).
        return None

    def stop(self) -> None:
        if self._kafka is not None:
            self._kafka.close()
            self._kafka = None
