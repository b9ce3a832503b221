"""The sink: DataFrame rows -> records, through tidelog's idempotent producer (acks=all).

Columns, as Spark's Kafka sink: ``value`` (required, binary or string), ``key`` (binary or
string), ``topic`` (string; the ``topic`` option overrides it), ``partition`` (int; else the key
hash or sticky partitioning picks one) and ``headers`` (array<struct<key string, value
binary>>). Other columns are ignored. Each Spark task opens its own producer, sends its rows,
flushes, and fails the task if any record was not acknowledged.

Delivery is at least once. The idempotent producer removes the duplicates of its own retries
within a task, but a task Spark retries, or a micro-batch replayed after a failure between the
write and the commit of the batch, is sent again by a new producer: its records appear twice.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    StringType,
    StructType,
)

from tidelog.client.cluster import KafkaClient
from tidelog.client.errors import BrokerResponseError
from tidelog.client.metadata import TopicPartition
from tidelog.client.producer import Producer
from tidelog.protocol.errors import ErrorCode
from tidelog.spark.options import SinkOptions, TidelogOptionError

__all__ = [
    "TidelogBatchWriter",
    "TidelogCommitMessage",
    "TidelogStreamWriter",
    "validate_sink_schema",
    "write_arrow_batches",
]

log = logging.getLogger("tidelog.spark")

_BYTES_TYPES = (BinaryType, StringType)


def _is_headers_type(data_type: DataType) -> bool:
    if not isinstance(data_type, ArrayType) or not isinstance(data_type.elementType, StructType):
        return False
    fields = data_type.elementType.fields
    return (
        len(fields) == 2
        and fields[0].name == "key"
        and isinstance(fields[0].dataType, StringType)
        and fields[1].name == "value"
        and isinstance(fields[1].dataType, BinaryType)
    )


def validate_sink_schema(schema: StructType, options: SinkOptions) -> None:
    """Spark's KafkaWriter.validateQuery: the column types, and a topic from somewhere."""
    columns = {f.name.lower(): f for f in schema.fields}
    value = columns.get("value")
    if value is None:
        raise TidelogOptionError("value", "required column 'value' not found in the DataFrame")
    if not isinstance(value.dataType, _BYTES_TYPES):
        raise TidelogOptionError(
            "value", f"column 'value' must be string or binary, not {value.dataType.simpleString()}"
        )
    key = columns.get("key")
    if key is not None and not isinstance(key.dataType, _BYTES_TYPES):
        raise TidelogOptionError(
            "key", f"column 'key' must be string or binary, not {key.dataType.simpleString()}"
        )
    topic = columns.get("topic")
    if options.topic is None:
        if topic is None:
            raise TidelogOptionError(
                "topic", "the topic option is required when there is no 'topic' column"
            )
    if topic is not None and not isinstance(topic.dataType, StringType):
        raise TidelogOptionError(
            "topic", f"column 'topic' must be string, not {topic.dataType.simpleString()}"
        )
    partition = columns.get("partition")
    if partition is not None and not isinstance(partition.dataType, IntegerType):
        raise TidelogOptionError(
            "partition",
            f"column 'partition' must be int, not {partition.dataType.simpleString()}",
        )
    headers = columns.get("headers")
    if headers is not None and not _is_headers_type(headers.dataType):
        raise TidelogOptionError(
            "headers",
            "column 'headers' must be array<struct<key:string,value:binary>>, not "
            f"{headers.dataType.simpleString()}",
        )


@dataclass
class TidelogCommitMessage(WriterCommitMessage):
    """What one task wrote: records and [first, last] offset per partition."""

    records: int = 0
    offsets: dict[TopicPartition, tuple[int, int]] = field(default_factory=dict)


def _column(batch: pa.RecordBatch, name: str) -> list | None:
    for i, field_name in enumerate(batch.schema.names):
        if field_name.lower() == name:
            return batch.column(i).to_pylist()
    return None


def _as_bytes(value: bytes | str | None) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    return value.encode()


async def _require_topic(client: KafkaClient, topic: str, options: SinkOptions) -> None:
    """The topic's partitions, asking the broker to create a missing topic as Kafka's producer
    does (allow.auto.create.topics); the broker's auto.create.topics.enable decides."""
    try:
        await client.partitions_for(
            topic, allow_auto_topic_creation=options.allow_auto_create_topics
        )
    except BrokerResponseError as exc:
        if exc.code != ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
            raise
        why = (
            "the broker did not create it (auto.create.topics.enable=false on the broker?)"
            if options.allow_auto_create_topics
            else "kafka.allow.auto.create.topics is false"
        )
        raise BrokerResponseError(
            exc.code_value, f"topic '{topic}' does not exist and {why}"
        ) from None


async def _produce(options: SinkOptions, batches: Iterator[pa.RecordBatch]) -> TidelogCommitMessage:
    message = TidelogCommitMessage()
    client = KafkaClient(options.bootstrap_servers, client_id=options.client_id)
    await client.start()
    try:
        producer = Producer(
            client,
            acks="all",
            enable_idempotence=True,
            compression=options.compression,
            linger_ms=options.linger_ms,
            batch_size=options.batch_size,
            allow_auto_create_topics=options.allow_auto_create_topics,
        )
        await producer.start()
        futures: list[asyncio.Future[tuple[TopicPartition, int]]] = []
        topics_seen: set[str] = set()
        try:
            for batch in batches:
                values = _column(batch, "value")
                assert values is not None  # validated at planning
                n = len(values)
                keys = _column(batch, "key") or [None] * n
                topics = [options.topic] * n if options.topic else _column(batch, "topic")
                assert topics is not None
                partitions = _column(batch, "partition") or [None] * n
                headers = _column(batch, "headers") or [None] * n
                for value, key, topic, partition, hdrs in zip(
                    values, keys, topics, partitions, headers, strict=True
                ):
                    if topic is None:
                        raise ValueError(
                            "null topic present in the data; use the topic option to set a "
                            "default topic"
                        )
                    if topic not in topics_seen:
                        await _require_topic(client, topic, options)
                        topics_seen.add(topic)
                    record_headers = (
                        tuple((h["key"], h["value"]) for h in hdrs) if hdrs is not None else ()
                    )
                    futures.append(
                        await producer.send(
                            topic,
                            _as_bytes(value),
                            key=_as_bytes(key),
                            partition=partition,
                            headers=record_headers,
                        )
                    )
            await producer.flush()
        finally:
            await producer.close()
        for future in futures:
            tp, offset = future.result()  # raises the error of a record that failed
            first, last = message.offsets.get(tp, (offset, offset))
            message.offsets[tp] = (min(first, offset), max(last, offset))
        message.records = len(futures)
        return message
    finally:
        await client.close()


def write_arrow_batches(
    options: SinkOptions, batches: Iterator[pa.RecordBatch]
) -> TidelogCommitMessage:
    """Send every row of ``batches``; returns once all are acknowledged (or raises)."""
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(_produce(options, batches))
    finally:
        loop.close()


def _summary(messages: list[WriterCommitMessage | None]) -> str:
    records = sum(m.records for m in messages if isinstance(m, TidelogCommitMessage))
    return f"{records} records from {len(messages)} tasks"


class TidelogBatchWriter(DataSourceArrowWriter):
    """``df.write.format("tidelog")``."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TidelogCommitMessage:
        return write_arrow_batches(self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        log.info("tidelog sink committed %s", _summary(messages))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        # Acknowledged records stay in the log: a sink on a log cannot take them back.
        log.warning("tidelog sink aborted after %s were acknowledged", _summary(messages))


class TidelogStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("tidelog")``: each micro-batch's tasks write as the batch sink."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TidelogCommitMessage:
        return write_arrow_batches(self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.info("tidelog sink committed batch %d: %s", batchId, _summary(messages))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning(
            "tidelog sink aborted batch %d after %s were acknowledged", batchId, _summary(messages)
        )
