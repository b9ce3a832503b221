"""The sink: batch and streaming writes round-trip through the log."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.errors import AnalysisException
from pyspark.sql import functions as F

pytestmark = pytest.mark.spark


def _read_back(spark, broker, topic: str, headers: bool = False):
    return (
        spark.read.format("tidelog")
        .option("kafka.bootstrap.servers", broker.bootstrap)
        .option("subscribe", topic)
        .option("includeHeaders", str(headers).lower())
        .load()
    )


def test_batch_write_round_trip_with_keys_partitions_and_headers(spark, broker) -> None:
    topic = broker.new_topic(partitions=2)
    rows = [
        (f"k{i}", f"value-{i}".encode(), i % 2, [("n", str(i).encode())] if i % 3 else [])
        for i in range(40)
    ]
    df = spark.createDataFrame(
        rows,
        "key string, value binary, partition int, headers array<struct<key:string,value:binary>>",
    )
    (
        df.write.format("tidelog")
        .option("kafka.bootstrap.servers", broker.bootstrap)
        .option("topic", topic)
        .mode("append")
        .save()
    )
    back = _read_back(spark, broker, topic, headers=True).collect()
    got = sorted(
        (r.key.decode(), r.value, r.partition, [(h.key, h.value) for h in r.headers]) for r in back
    )
    assert got == sorted((k, v, p, h) for k, v, p, h in rows)
    # Per partition, offsets are dense from 0: every acked record is there exactly once.
    for p in (0, 1):
        offsets = sorted(r.offset for r in back if r.partition == p)
        assert offsets == list(range(20))


def test_topic_column_routes_rows(spark, broker) -> None:
    a, b = broker.new_topic(), broker.new_topic()
    df = spark.createDataFrame([(a, "x"), (b, "y"), (a, "z")], "topic string, value string")
    df.write.format("tidelog").mode("append").option(
        "kafka.bootstrap.servers", broker.bootstrap
    ).save()
    assert sorted(r.value for r in _read_back(spark, broker, a).collect()) == [b"x", b"z"]
    assert [r.value for r in _read_back(spark, broker, b).collect()] == [b"y"]


def test_streaming_write_copies_a_topic(spark, broker, tmp_path: Path) -> None:
    source = broker.new_topic(partitions=2)
    target = broker.new_topic()
    for p in (0, 1):
        broker.produce(source, [b"s%d-%d" % (p, i) for i in range(15)], partition=p)
    stream = (
        spark.readStream.format("tidelog")
        .option("kafka.bootstrap.servers", broker.bootstrap)
        .option("subscribe", source)
        .option("startingOffsets", "earliest")
        .load()
        .select(F.upper(F.col("value").cast("string")).alias("value"), "key")
    )
    query = (
        stream.writeStream.format("tidelog")
        .option("kafka.bootstrap.servers", broker.bootstrap)
        .option("topic", target)
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(120)
    finally:
        query.stop()
    copied = sorted(r.value for r in _read_back(spark, broker, target).collect())
    assert copied == sorted(b"S%d-%d" % (p, i) for p in (0, 1) for i in range(15))


def test_sink_schema_errors_name_the_column(spark, broker) -> None:
    no_value = spark.createDataFrame([("a",)], "body string")
    with pytest.raises(AnalysisException, match="'value'"):
        no_value.write.mode("append").format("tidelog").option(
            "kafka.bootstrap.servers", broker.bootstrap
        ).option("topic", "t").save()
    no_topic = spark.createDataFrame([("a",)], "value string")
    with pytest.raises(AnalysisException, match="option 'topic'"):
        no_topic.write.mode("append").format("tidelog").option(
            "kafka.bootstrap.servers", broker.bootstrap
        ).save()
    bad_partition = spark.createDataFrame([("a", "p")], "value string, partition string")
    with pytest.raises(AnalysisException, match="'partition' must be int"):
        bad_partition.write.mode("append").format("tidelog").option(
            "kafka.bootstrap.servers", broker.bootstrap
        ).option("topic", "t").save()


def test_unknown_partition_fails_the_write(spark, broker) -> None:
    topic = broker.new_topic()
    df = spark.createDataFrame([("a", 5)], "value string, partition int")
    with pytest.raises(Exception, match="no partition 5"):
        df.write.mode("append").format("tidelog").option(
            "kafka.bootstrap.servers", broker.bootstrap
        ).option("topic", topic).save()
    assert json.loads("[]") == [r.value for r in _read_back(spark, broker, topic).collect()]


def _topic_exists(broker, topic: str) -> bool:
    meta = broker.run(broker.client.refresh_metadata([topic]))
    return topic in meta.topics and meta.topics[topic].error == 0


def _needs_tidelog_broker(broker) -> None:
    if broker.cluster is None:
        pytest.skip("auto.create.topics.enable is the tidelog broker's setting")


def test_writing_to_a_missing_topic_creates_it(spark, broker) -> None:
    # As Kafka's producer (allow.auto.create.topics=true): the broker's
    # auto.create.topics.enable (true by default) creates it.
    _needs_tidelog_broker(broker)
    topic = f"auto-{uuid.uuid4().hex[:10]}"
    assert not _topic_exists(broker, topic)
    df = spark.createDataFrame([("a",), ("b",)], "value string")
    df.write.mode("append").format("tidelog").option(
        "kafka.bootstrap.servers", broker.bootstrap
    ).option("topic", topic).save()
    assert _topic_exists(broker, topic)
    assert sorted(r.value for r in _read_back(spark, broker, topic).collect()) == [b"a", b"b"]


def test_a_sink_that_may_not_create_topics_fails_on_a_missing_one(spark, broker) -> None:
    _needs_tidelog_broker(broker)
    topic = f"absent-{uuid.uuid4().hex[:10]}"
    df = spark.createDataFrame([("a",)], "value string")
    with pytest.raises(
        Exception,
        match=f"UNKNOWN_TOPIC_OR_PARTITION: topic '{topic}' does not exist and "
        "kafka.allow.auto.create.topics is false",
    ):
        df.write.mode("append").format("tidelog").option(
            "kafka.bootstrap.servers", broker.bootstrap
        ).option("topic", topic).option("kafka.allow.auto.create.topics", "false").save()
    assert not _topic_exists(broker, topic)


@pytest.fixture(scope="module")
def no_auto_create_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One tidelog broker with auto.create.topics.enable=false."""
    from tidelog.cluster.local import LocalCluster

    cluster = LocalCluster(tmp_path_factory.mktemp("no-auto-create"))
    cluster.up(1, overrides={"auto.create.topics.enable": "false"}, timeout_s=120)
    try:
        yield cluster.bootstrap_servers
    finally:
        cluster.down()


def test_a_broker_that_does_not_auto_create_fails_the_write(
    spark, no_auto_create_cluster: str
) -> None:
    df = spark.createDataFrame([("a",)], "value string")
    with pytest.raises(
        Exception,
        match="UNKNOWN_TOPIC_OR_PARTITION: topic 'nowhere' does not exist and the broker did "
        r"not create it \(auto.create.topics.enable=false on the broker\?\)",
    ):
        df.write.mode("append").format("tidelog").option(
            "kafka.bootstrap.servers", no_auto_create_cluster
        ).option("topic", "nowhere").save()
