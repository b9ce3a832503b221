"""Streaming reads: availableNow, processingTime, checkpoint restarts, rate limits, data loss."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from pyspark.errors import StreamingQueryException

from tidelog.client.metadata import TopicPartition
from tidelog.spark.stream_reader import rate_limit

pytestmark = pytest.mark.spark

Row = tuple[str, int, int, bytes]


class Collector:
    """foreachBatch target: the rows of every micro-batch, by batch id (runs on the driver)."""

    def __init__(self) -> None:
        self.batches: dict[int, list[Row]] = {}
        self.runs: list[int] = []

    def __call__(self, df, batch_id: int) -> None:
        rows = [(r.topic, r.partition, r.offset, r.value) for r in df.collect()]
        self.batches[batch_id] = sorted(rows)
        self.runs.append(batch_id)

    def rows(self) -> list[Row]:
        return sorted(row for rows in self.batches.values() for row in rows)


def _stream(spark, broker, **options: str):
    reader = spark.readStream.format("tidelog").option("kafka.bootstrap.servers", broker.bootstrap)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def _run_available_now(df, checkpoint: Path, collector: Collector) -> None:
    query = (
        df.writeStream.foreachBatch(collector)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(120), "availableNow query did not finish in 120 s"
    finally:
        query.stop()


def _expected(topic: str, partition: int, acks, values) -> list[Row]:
    return [(topic, partition, off, v) for (_, off), v in zip(acks, values, strict=True)]


def test_available_now_then_restart_reads_new_data_once(spark, broker, tmp_path: Path) -> None:
    topic = broker.new_topic(partitions=2)
    first = [b"a%d" % i for i in range(6)]
    acks0 = broker.produce(topic, first, partition=0)
    acks1 = broker.produce(topic, first[:3], partition=1)
    collector = Collector()
    df = _stream(spark, broker, subscribe=topic, startingOffsets="earliest")
    _run_available_now(df, tmp_path / "ckpt", collector)
    expected = _expected(topic, 0, acks0, first) + _expected(topic, 1, acks1, first[:3])
    assert collector.rows() == sorted(expected)

    # New data while the query is down; the restart resumes at the checkpointed offsets.
    second = [b"b%d" % i for i in range(4)]
    acks2 = broker.produce(topic, second, partition=1)
    restarted = Collector()
    _run_available_now(df, tmp_path / "ckpt", restarted)
    assert restarted.rows() == sorted(_expected(topic, 1, acks2, second))
    assert min(restarted.batches) > max(collector.batches)


def test_replayed_batch_reads_the_same_records(spark, broker, tmp_path: Path) -> None:
    """A failure after a batch's offsets were logged but before its commit: on restart Spark
    replans that batch from the logged offsets, and it must see exactly the same records."""
    topic = broker.new_topic(partitions=2)
    acks = broker.produce(topic, [b"x%d" % i for i in range(5)], partition=0)
    acks += broker.produce(topic, [b"y%d" % i for i in range(5)], partition=1)
    checkpoint = tmp_path / "ckpt"
    collector = Collector()
    df = _stream(spark, broker, subscribe=topic, startingOffsets="earliest")
    _run_available_now(df, checkpoint, collector)
    last = max(collector.batches)
    # The commit never happened (the log entry and Hadoop's checksum file beside it).
    (checkpoint / "commits" / str(last)).unlink()
    (checkpoint / "commits" / f".{last}.crc").unlink(missing_ok=True)
    broker.produce(topic, [b"late"], partition=0)  # must not leak into the replayed batch

    replay = Collector()
    _run_available_now(df, checkpoint, replay)
    assert replay.runs[0] == last
    assert replay.batches[last] == collector.batches[last]
    assert [row[3] for b in replay.runs[1:] for row in replay.batches[b]] == [b"late"]


def test_processing_time_trigger_sees_records_as_they_arrive(spark, broker, tmp_path) -> None:
    topic = broker.new_topic()
    collector = Collector()
    df = _stream(spark, broker, subscribe=topic, startingOffsets="earliest")
    query = (
        df.writeStream.foreachBatch(collector)
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        sent: list[bytes] = []
        for round_ in range(3):
            values = [b"r%d-%d" % (round_, i) for i in range(3)]
            broker.produce(topic, values)
            sent += values
            deadline = time.monotonic() + 60
            while len(collector.rows()) < len(sent) and time.monotonic() < deadline:
                assert query.exception() is None
                time.sleep(0.1)
            assert [r[3] for r in collector.rows()] == sorted(sent)
    finally:
        query.stop()
    assert len(collector.batches) >= 2  # the records arrived in separate micro-batches


def test_max_offsets_per_trigger_bounds_every_batch(spark, broker, tmp_path) -> None:
    topic = broker.new_topic(partitions=3)
    total = 0
    for p, n in enumerate((20, 9, 1)):
        broker.produce(topic, [b"m%d" % i for i in range(n)], partition=p)
        total += n
    collector = Collector()
    df = _stream(
        spark, broker, subscribe=topic, startingOffsets="earliest", maxOffsetsPerTrigger="8"
    )
    _run_available_now(df, tmp_path / "ckpt", collector)
    sizes = [len(collector.batches[b]) for b in sorted(collector.batches)]
    assert sum(sizes) == total and len(collector.rows()) == total
    assert max(sizes) <= 8 + 2  # the per-partition round-up can exceed the cap by < partitions
    assert len(sizes) >= total // 10


def test_rate_limit_splits_in_proportion_and_starves_nobody() -> None:
    a, b, c = (TopicPartition("t", p) for p in range(3))
    start = {a: 0, b: 100, c: 5}
    latest = {a: 1000, b: 110, c: 5}
    # a has 1000 of 1010 new offsets, b 10: shares 99.0 and 0.99 -> 99 and 1 (rounded up)
    assert rate_limit(100, start, latest) == {a: 99, b: 101, c: 5}
    assert rate_limit(10_000, start, latest) == latest  # never past the latest offsets


def test_new_topics_matching_the_pattern_are_read_from_earliest(spark, broker, tmp_path) -> None:
    base = broker.new_topic(prefix="np")
    broker.produce(base, [b"one"])
    collector = Collector()
    df = _stream(spark, broker, subscribePattern=base + ".*", startingOffsets="earliest")
    _run_available_now(df, tmp_path / "ckpt", collector)
    assert [r[3] for r in collector.rows()] == [b"one"]

    added = base + "-new"
    broker.create_topic(added, 2)
    broker.produce(added, [b"two", b"three"], partition=1)
    restarted = Collector()
    _run_available_now(df, tmp_path / "ckpt", restarted)
    assert restarted.rows() == [(added, 1, 0, b"two"), (added, 1, 1, b"three")]


def _recreate_with_fewer_records(broker, topic: str) -> None:
    broker.delete_topic(topic)
    deadline = time.monotonic() + 10
    while True:
        try:
            broker.create_topic(topic, 1)
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    broker.produce(topic, [b"new0", b"new1"])


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_offsets_that_went_away_are_data_loss(
    spark, broker, tmp_path, fail_on_data_loss: bool
) -> None:
    """tansu deletes no records (no retention, no DeleteRecords), so the lost offsets come
    from deleting the topic and recreating it shorter while the query is down."""
    topic = broker.new_topic()
    broker.produce(topic, [b"old%d" % i for i in range(6)])
    df = _stream(
        spark,
        broker,
        subscribe=topic,
        startingOffsets="earliest",
        failOnDataLoss=str(fail_on_data_loss).lower(),
    )
    _run_available_now(df, tmp_path / "ckpt", Collector())
    _recreate_with_fewer_records(broker, topic)

    after = Collector()
    if fail_on_data_loss:
        with pytest.raises(StreamingQueryException, match="failOnDataLoss"):
            _run_available_now(df, tmp_path / "ckpt", after)
        assert after.rows() == []
    else:
        _run_available_now(df, tmp_path / "ckpt", after)
        assert [r[3] for r in after.rows()] == [b"new0", b"new1"]


def test_leader_killed_during_a_streaming_query(spark, broker, tmp_path) -> None:
    """Every acknowledged record is read exactly once although a partition leader dies
    (SIGKILL) mid-stream and comes back: tasks and the driver follow the new leader."""
    if broker.cluster is None:
        pytest.skip("needs a tidelog cluster (TIDELOG_SPARK_BROKER=tidelog)")
    topic = broker.new_topic(partitions=2)
    collector = Collector()
    df = _stream(spark, broker, subscribe=topic, startingOffsets="earliest")
    query = (
        df.writeStream.foreachBatch(collector)
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(processingTime="300 milliseconds")
        .start()
    )
    sent: list[bytes] = []

    def send_round(name: str) -> None:
        for p in (0, 1):
            values = [b"%s-p%d-%d" % (name.encode(), p, i) for i in range(20)]
            broker.produce(topic, values, partition=p)
            sent.extend(values)
        deadline = time.monotonic() + 120
        while len(collector.rows()) < len(sent) and time.monotonic() < deadline:
            assert query.exception() is None, query.exception()
            time.sleep(0.2)
        assert sorted(r[3] for r in collector.rows()) == sorted(sent)

    try:
        send_round("before")
        broker.run(broker.client.refresh_metadata([topic]))
        leader = broker.client.leader_for(TopicPartition(topic, 0))
        assert leader is not None
        broker.cluster.stop_broker(leader, kill=True)
        send_round("during")
        broker.cluster.start_broker(leader)
        send_round("after")
    finally:
        query.stop()
