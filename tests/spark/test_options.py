"""Option validation: Spark's Kafka source rules, errors that name the option."""

from __future__ import annotations

import json

import pytest

from tidelog.client.metadata import TopicPartition
from tidelog.spark.offsets import from_offset_dict, partition_offsets_json, to_offset_dict
from tidelog.spark.options import (
    TidelogOptionError,
    parse_sink_options,
    parse_source_options,
)

B = {"kafka.bootstrap.servers": "127.0.0.1:9092"}


def _error(options: dict[str, str], *, streaming: bool = False) -> TidelogOptionError:
    with pytest.raises(TidelogOptionError) as info:
        parse_source_options(options, streaming=streaming)
    return info.value


def test_defaults_follow_spark() -> None:
    batch = parse_source_options({**B, "subscribe": "a, b,,a"}, streaming=False)
    assert batch.subscription.topics == ("a", "b")
    assert batch.starting_offsets.kind == "earliest"
    assert batch.ending_offsets is not None and batch.ending_offsets.kind == "latest"
    assert batch.fail_on_data_loss is True and batch.include_headers is False
    stream = parse_source_options({**B, "SUBSCRIBEPATTERN": "ev.*"}, streaming=True)
    assert stream.starting_offsets.kind == "latest" and stream.ending_offsets is None
    assert stream.subscription.matches("events") and not stream.subscription.matches("xev")


@pytest.mark.parametrize(
    ("options", "option", "fragment"),
    [
        ({"subscribe": "a"}, "kafka.bootstrap.servers", "must be specified"),
        (
            {**B, "subscribe": "a", "kafka.bootstrap.servers": "nohost"},
            "kafka.bootstrap.servers",
            "host:port",
        ),
        (B, "subscribe", "one of the options"),
        ({**B, "subscribe": "a", "assign": '{"a":[0]}'}, "assign", "only one"),
        ({**B, "subscribe": " , "}, "subscribe", "no topics"),
        ({**B, "subscribePattern": "("}, "subscribePattern", "regular expression"),
        ({**B, "assign": "a:0"}, "assign", "expected JSON"),
        ({**B, "assign": '{"a":["x"]}'}, "assign", "partition numbers"),
        ({**B, "subscribe": "a", "startingOffsets": "latest"}, "startingOffsets", "latest"),
        ({**B, "subscribe": "a", "startingOffsets": '{"a":{"0":-1}}'}, "startingOffsets", "latest"),
        ({**B, "subscribe": "a", "startingOffsets": '{"a":{"0":-3}}'}, "startingOffsets", "-3"),
        ({**B, "subscribe": "a", "startingOffsets": "{bad"}, "startingOffsets", "JSON"),
        ({**B, "subscribe": "a", "endingOffsets": "earliest"}, "endingOffsets", "earliest"),
        ({**B, "subscribe": "a", "endingOffsets": '{"a":{"0":-2}}'}, "endingOffsets", "earliest"),
        (
            {
                **B,
                "subscribe": "a",
                "startingOffsets": '{"a":{"0":9}}',
                "endingOffsets": '{"a":{"0":3}}',
            },
            "endingOffsets",
            "before starting",
        ),
        (
            {
                **B,
                "subscribe": "a",
                "startingOffsets": '{"a":{"0":1}}',
                "endingOffsets": '{"b":{"0":3}}',
            },
            "endingOffsets",
            "same topic-partitions",
        ),
        ({**B, "subscribe": "a", "failOnDataLoss": "maybe"}, "failOnDataLoss", "true or false"),
        ({**B, "subscribe": "a", "maxOffsetsPerTrigger": "0"}, "maxOffsetsPerTrigger", "positive"),
        (
            {**B, "subscribe": "a", "maxOffsetsPerTrigger": "5", "minOffsetsPerTrigger": "9"},
            "minOffsetsPerTrigger",
            "higher than",
        ),
        (
            {**B, "subscribe": "a", "kafka.auto.offset.reset": "earliest"},
            "kafka.auto.offset.reset",
            "startingOffsets",
        ),
        ({**B, "subscribe": "a", "startingTimestamp": "soon"}, "startingTimestamp", "single long"),
        (
            {**B, "subscribe": "a", "endingOffsetsByTimestamp": '{"a":{"0":-5}}'},
            "endingOffsetsByTimestamp",
            ">= 0",
        ),
        (
            {**B, "subscribe": "a", "kafka.security.protocol": "SASL_SSL"},
            "kafka.security.protocol",
            "PLAINTEXT",
        ),
        ({**B, "subscribe": "a", "kafka.sasl.mechanism": "PLAIN"}, "kafka.sasl.mechanism", "SASL"),
        (
            {**B, "subscribe": "a", "startingOffsetsByTimestampStrategy": "skip"},
            "startingOffsetsByTimestampStrategy",
            "error or latest",
        ),
    ],
)
def test_batch_option_errors_name_the_option(options, option: str, fragment: str) -> None:
    error = _error(options)
    assert error.option == option
    assert f"option '{option}'" in str(error) and fragment in str(error)


def test_ending_offsets_are_batch_only() -> None:
    for name in ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp"):
        error = _error({**B, "subscribe": "a", name: "latest"}, streaming=True)
        assert error.option == name and "streaming" in str(error)


def test_timestamp_options_take_precedence_as_in_spark() -> None:
    options = parse_source_options(
        {
            **B,
            "subscribe": "a",
            "startingOffsets": "earliest",
            "startingOffsetsByTimestamp": '{"a":{"0":1000}}',
            "endingTimestamp": "5000",
            "endingOffsetsByTimestamp": '{"a":{"0":4000}}',
        },
        streaming=False,
    )
    start, end = options.starting_offsets, options.ending_offsets
    assert (start.kind, start.offsets, start.option) == (
        "timestamp",
        {TopicPartition("a", 0): 1000},
        "startingOffsetsByTimestamp",
    )
    assert end is not None and (end.kind, end.timestamp) == ("timestamp", 5000)
    assert options.timestamp_no_match == "error"


def test_streaming_accepts_latest_and_trigger_limits() -> None:
    options = parse_source_options(
        {
            **B,
            "assign": '{"a":[0,1]}',
            "startingOffsets": '{"a":{"0":-1,"1":5}}',
            "maxOffsetsPerTrigger": "100",
            "minOffsetsPerTrigger": "10",
            "maxTriggerDelay": "30s",
        },
        streaming=True,
    )
    assert options.starting_offsets.offsets == {
        TopicPartition("a", 0): -1,
        TopicPartition("a", 1): 5,
    }
    assert (options.max_offsets_per_trigger, options.min_offsets_per_trigger) == (100, 10)
    assert options.max_trigger_delay_ms == 30_000


def test_sink_options() -> None:
    sink = parse_sink_options({**B, "topic": " out ", "kafka.compression.type": "LZ4"})
    assert (sink.topic, sink.compression) == ("out", "lz4")
    with pytest.raises(TidelogOptionError, match="kafka.acks"):
        parse_sink_options({**B, "kafka.acks": "1"})
    with pytest.raises(TidelogOptionError, match="kafka.compression.type"):
        parse_sink_options({**B, "kafka.compression.type": "brotli"})
    # allow.auto.create.topics: true by default, as in Kafka's producer
    assert parse_sink_options(B).allow_auto_create_topics is True
    off = parse_sink_options({**B, "kafka.allow.auto.create.topics": "FALSE"})
    assert off.allow_auto_create_topics is False
    with pytest.raises(TidelogOptionError, match="kafka.allow.auto.create.topics"):
        parse_sink_options({**B, "kafka.allow.auto.create.topics": "no"})


def test_offsets_json_is_sparks_format() -> None:
    offsets = {TopicPartition("b", 1): 7, TopicPartition("a", 10): 3, TopicPartition("a", 2): -2}
    text = partition_offsets_json(offsets)
    assert text == '{"a":{"2":-2,"10":3},"b":{"1":7}}'
    assert from_offset_dict(json.loads(text)) == offsets
    assert from_offset_dict(to_offset_dict(offsets)) == offsets
    with pytest.raises(ValueError):
        from_offset_dict({"a": {"x": 1}})
    with pytest.raises(ValueError):
        from_offset_dict({"a": {"0": "1"}})


@pytest.mark.spark
def test_planning_fails_with_the_option_name(spark, broker) -> None:
    from pyspark.errors import AnalysisException, StreamingQueryException

    reader = spark.read.format("tidelog").option("kafka.bootstrap.servers", broker.bootstrap)
    with pytest.raises(AnalysisException, match="option 'subscribe'"):
        reader.load().collect()
    # A streaming query plans in its own thread: the error ends the query.
    query = (
        spark.readStream.format("tidelog")
        .option("kafka.bootstrap.servers", broker.bootstrap)
        .option("subscribe", "x")
        .option("endingOffsets", "latest")
        .load()
        .writeStream.format("console")
        .start()
    )
    try:
        with pytest.raises(StreamingQueryException, match="option 'endingOffsets'"):
            query.awaitTermination(60)
    finally:
        query.stop()
