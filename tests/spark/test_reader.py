"""Batch reads through Spark: exact rows, offset ranges, headers, compression, committed only."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime

import pytest
from pyspark.errors import AnalysisException

pytestmark = pytest.mark.spark


def _read(spark, broker, **options: str):
    reader = spark.read.format("tidelog").option("kafka.bootstrap.servers", broker.bootstrap)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def _position(row: tuple) -> tuple[int, int]:
    return row[3], row[4]


def test_batch_read_returns_every_committed_record_exactly(spark, broker) -> None:
    topic = broker.new_topic(partitions=3)
    expected = []
    for p in range(3):
        values = [f"p{p}-v{i}".encode() for i in range(7 + p)]
        keys = [f"k{i}".encode() if i % 2 else None for i in range(len(values))]
        acks = broker.produce(topic, values, partition=p, keys=keys, batch_size=64)
        expected += [
            (key, value, topic, p, offset)
            for (tp, offset), key, value in zip(acks, keys, values, strict=True)
        ]
    df = _read(spark, broker, subscribe=topic)
    assert df.columns == [
        "key",
        "value",
        "topic",
        "partition",
        "offset",
        "timestamp",
        "timestampType",
    ]
    rows = df.collect()
    got = sorted(((r.key, r.value, r.topic, r.partition, r.offset) for r in rows), key=_position)
    assert got == sorted(expected, key=_position)
    assert {r.timestampType for r in rows} == {0}
    now = datetime.now(UTC).replace(tzinfo=None)
    assert all(abs((now - r.timestamp).total_seconds()) < 600 for r in rows)


def test_starting_and_ending_offsets_select_a_range(spark, broker) -> None:
    topic = broker.new_topic(partitions=2)
    broker.produce(topic, [b"a%d" % i for i in range(10)], partition=0, batch_size=40)
    broker.produce(topic, [b"b%d" % i for i in range(5)], partition=1)
    df = _read(
        spark,
        broker,
        assign=json.dumps({topic: [0, 1]}),
        startingOffsets=json.dumps({topic: {"0": 3, "1": -2}}),
        endingOffsets=json.dumps({topic: {"0": 7, "1": -1}}),
    )
    got = sorted((r.partition, r.offset, r.value) for r in df.collect())
    assert got == [(0, i, b"a%d" % i) for i in range(3, 7)] + [(1, i, b"b%d" % i) for i in range(5)]


def test_headers_and_compressed_batches(spark, broker) -> None:
    topic = broker.new_topic()
    headers = [[("h", b"x%d" % i), ("empty", None)] if i % 2 else [] for i in range(20)]
    broker.produce(
        topic, [b"v%d" % i for i in range(20)], headers=headers, compression="gzip", batch_size=200
    )
    df = _read(spark, broker, subscribe=topic, includeHeaders="true")
    rows = sorted(df.collect(), key=lambda r: r.offset)
    assert [r.value for r in rows] == [b"v%d" % i for i in range(20)]
    assert [[(h.key, h.value) for h in r.headers] for r in rows] == [
        [tuple(h) for h in hs] for hs in headers
    ]
    # A compressed batch fetched from its middle: records before the start are cut off.
    mid = _read(
        spark,
        broker,
        subscribe=topic,
        startingOffsets=json.dumps({topic: {"0": 13}}),
    )
    assert sorted(r.offset for r in mid.collect()) == list(range(13, 20))


def test_subscribe_pattern_and_min_partitions(spark, broker) -> None:
    prefix = broker.new_topic(prefix="pat")  # an existing topic the pattern must also match
    other = prefix + "-b"
    broker.create_topic(other, 2)
    broker.produce(prefix, [b"x"] * 3)
    broker.produce(other, [b"y"] * 40, partition=1)
    df = _read(spark, broker, subscribePattern=prefix + ".*", minPartitions="4")
    assert df.rdd.getNumPartitions() >= 4
    counts: dict[tuple[str, int], int] = {}
    for row in df.select("topic", "partition").collect():
        counts[(row.topic, row.partition)] = counts.get((row.topic, row.partition), 0) + 1
    assert counts == {(prefix, 0): 3, (other, 1): 40}


def test_starting_and_ending_timestamps(spark, broker) -> None:
    topic = broker.new_topic()
    broker.produce(topic, [b"early0", b"early1"])
    time.sleep(0.05)
    middle = int(time.time() * 1000)
    time.sleep(0.05)
    broker.produce(topic, [b"late0", b"late1"])

    def values(**options: str) -> list[bytes]:
        return sorted(r.value for r in _read(spark, broker, subscribe=topic, **options).collect())

    assert values(startingTimestamp=str(middle)) == [b"late0", b"late1"]
    assert values(endingOffsetsByTimestamp=json.dumps({topic: {"0": middle}})) == [
        b"early0",
        b"early1",
    ]
    future = str(int(time.time() * 1000) + 3_600_000)
    with pytest.raises(AnalysisException, match="no record at or after the timestamp"):
        values(startingTimestamp=future)
    assert values(startingTimestamp=future, startingOffsetsByTimestampStrategy="latest") == []
    assert values(endingTimestamp=future) == [b"early0", b"early1", b"late0", b"late1"]
