"""Spark's own Kafka connector (format "kafka", spark-sql-kafka-0-10 from Maven Central) on
tidelog, unchanged, side by side with the tidelog connector: batch and streaming, reads and
writes, and a streaming read through a leader kill -9 and a restart from its checkpoint."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from tidelog.client.metadata import TopicPartition

pytestmark = pytest.mark.spark

HEADERS = "array<struct<key:string,value:binary>>"
Row = tuple[str, int, int, bytes | None, bytes | None]


def _read(spark, fmt: str, broker, topic: str):
    return (
        spark.read.format(fmt)
        .option("kafka.bootstrap.servers", broker.bootstrap)
        .option("subscribe", topic)
        .option("includeHeaders", "true")
        .load()
    )


def _observable(rows) -> list[tuple]:
    """Everything a reader of either connector sees of a record."""
    return sorted(
        (
            r.topic,
            r.partition,
            r.offset,
            r.key,
            r.value,
            r.timestamp,
            r.timestampType,
            tuple((h.key, h.value) for h in r.headers or ()),
        )
        for r in rows
    )


def test_sparks_kafka_connector_and_tidelogs_read_and_write_the_same_records(
    spark, broker, kafka_format: str
) -> None:
    topic = broker.new_topic(partitions=2)
    rows = [
        (f"k{i}", f"v{i}".encode(), i % 2, [("n", str(i).encode())] if i % 3 else [])
        for i in range(30)
    ]
    df = spark.createDataFrame(rows, f"key string, value binary, partition int, headers {HEADERS}")
    # The first half through Spark's Kafka sink, the second through tidelog's.
    for fmt, part in (
        (kafka_format, df.where("cast(substr(key, 2) as int) < 15")),
        ("tidelog", df.where("cast(substr(key, 2) as int) >= 15")),
    ):
        part.write.format(fmt).mode("append").option(
            "kafka.bootstrap.servers", broker.bootstrap
        ).option("topic", topic).save()

    by_kafka = _observable(_read(spark, kafka_format, broker, topic).collect())
    by_tidelog = _observable(_read(spark, "tidelog", broker, topic).collect())
    assert by_kafka == by_tidelog
    assert sorted((r[3].decode(), r[4], r[1], list(r[7])) for r in by_kafka) == sorted(
        (k, v, p, h) for k, v, p, h in rows
    )
    for p in (0, 1):  # dense offsets: every row written exactly once
        assert sorted(r[2] for r in by_kafka if r[1] == p) == list(range(15))


def test_sparks_kafka_streaming_copy_resumes_from_its_checkpoint(
    spark, broker, kafka_format: str, tmp_path: Path
) -> None:
    source, target = broker.new_topic(partitions=2), broker.new_topic()
    for p in (0, 1):
        broker.produce(source, [b"a%d-%d" % (p, i) for i in range(10)], partition=p)

    def copy() -> None:
        query = (
            spark.readStream.format(kafka_format)
            .option("kafka.bootstrap.servers", broker.bootstrap)
            .option("subscribe", source)
            .option("startingOffsets", "earliest")
            .load()
            .select(F.upper(F.col("value").cast("string")).alias("value"))
            .writeStream.format(kafka_format)
            .option("kafka.bootstrap.servers", broker.bootstrap)
            .option("topic", target)
            .option("checkpointLocation", str(tmp_path / "ckpt"))
            .trigger(availableNow=True)
            .start()
        )
        try:
            assert query.awaitTermination(180), "availableNow query did not finish in 180 s"
            assert query.exception() is None
        finally:
            query.stop()

    copy()
    broker.produce(source, [b"b%d" % i for i in range(5)], partition=1)
    copy()  # from the checkpoint: only the new records
    copied = sorted(r.value for r in _read(spark, "tidelog", broker, target).collect())
    expected = [b"A%d-%d" % (p, i) for p in (0, 1) for i in range(10)]
    assert copied == sorted(expected + [b"B%d" % i for i in range(5)])


def _process_all(query, timeout_s: float = 180.0) -> None:  # type: ignore[no-untyped-def]
    """query.processAllAvailable(), bounded: a hung query fails the test."""
    failure: list[BaseException] = []

    def wait() -> None:
        try:
            query.processAllAvailable()
        except BaseException as exc:  # re-raised below
            failure.append(exc)

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    waiter.join(timeout_s)
    assert not waiter.is_alive(), f"the query did not process its input in {timeout_s:.0f} s"
    if failure:
        raise failure[0]


class Collector:
    """foreachBatch target: every row seen, as (topic, partition, offset, key, value)."""

    def __init__(self) -> None:
        self.rows: list[Row] = []

    def __call__(self, df, batch_id: int) -> None:
        self.rows.extend((r.topic, r.partition, r.offset, r.key, r.value) for r in df.collect())


def test_sparks_kafka_source_reads_every_acked_record_once_through_a_leader_kill(
    spark, broker, kafka_format: str, tmp_path: Path
) -> None:
    if broker.cluster is None:
        pytest.skip("needs a tidelog cluster (TIDELOG_SPARK_BROKER=tidelog)")
    topic = broker.new_topic(partitions=2)
    collector = Collector()
    sent: list[bytes] = []

    def start():  # type: ignore[no-untyped-def]
        return (
            spark.readStream.format(kafka_format)
            .option("kafka.bootstrap.servers", broker.bootstrap)
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .load()
            .writeStream.foreachBatch(collector)
            .option("checkpointLocation", str(tmp_path / "ckpt"))
            .trigger(processingTime="300 milliseconds")
            .start()
        )

    def send_round(query, name: str) -> None:  # type: ignore[no-untyped-def]
        for p in (0, 1):
            values = [b"%s-p%d-%d" % (name.encode(), p, i) for i in range(20)]
            broker.produce(topic, values, partition=p)
            sent.extend(values)
        _process_all(query)  # every micro-batch of what is acked now has run
        assert sorted(r[4] for r in collector.rows) == sorted(sent)

    query = start()
    try:
        send_round(query, "before")
        broker.run(broker.client.refresh_metadata([topic]))
        leader = broker.client.leader_for(TopicPartition(topic, 0))
        assert leader is not None
        broker.cluster.stop_broker(leader, kill=True)
        send_round(query, "during")
        broker.cluster.start_broker(leader)
        send_round(query, "after")
    finally:
        query.stop()
    # Stopped and started again from its checkpoint: it resumes after what it committed.
    broker.produce(topic, [b"resumed-%d" % i for i in range(5)], partition=1)
    sent.extend(b"resumed-%d" % i for i in range(5))
    query = start()
    try:
        _process_all(query)
    finally:
        query.stop()
    offsets = [(r[1], r[2]) for r in collector.rows]
    assert len(offsets) == len(set(offsets)), "a record was read twice"
    assert sorted(r[4] for r in collector.rows) == sorted(sent)
