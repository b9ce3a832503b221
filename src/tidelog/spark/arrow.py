"""The source's schema and the Arrow record batches built from decoded Kafka record batches.

The schema is Spark's Kafka source schema, column for column, so queries move between
``format("kafka")`` and ``format("tidelog")`` unchanged. Rows are collected column-wise
(:class:`RowBuffer`, fed with :func:`~tidelog.protocol.records.decode_columns` output) and turned
into one :class:`pyarrow.RecordBatch` per buffer: no Python tuple per row ever exists.
"""

from __future__ import annotations

import bisect

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from tidelog.protocol.records import RecordColumns

__all__ = ["RowBuffer", "arrow_schema", "source_schema"]

_HEADER = StructType([StructField("key", StringType()), StructField("value", BinaryType())])


def source_schema(include_headers: bool = False) -> StructType:
    """``key binary, value binary, topic string, partition int, offset long, timestamp
    timestamp, timestampType int`` (+ ``headers array<struct<key string, value binary>>``)."""
    fields = [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
    if include_headers:
        fields.append(StructField("headers", ArrayType(_HEADER)))
    return StructType(fields)


def arrow_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema Spark expects for ``schema`` (it compares the two exactly)."""
    return to_arrow_schema(schema, timezone="UTC")


class RowBuffer:
    """Records of one topic-partition, column-wise, until :meth:`to_arrow` empties it."""

    __slots__ = (
        "topic",
        "partition",
        "schema",
        "include_headers",
        "offsets",
        "timestamps",
        "timestamp_types",
        "keys",
        "values",
        "headers",
    )

    def __init__(self, topic: str, partition: int, schema: pa.Schema) -> None:
        self.topic = topic
        self.partition = partition
        self.schema = schema
        self.include_headers = "headers" in schema.names
        self._reset()

    def _reset(self) -> None:
        self.offsets: list[int] = []
        self.timestamps: list[int] = []
        self.timestamp_types: list[int] = []
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.headers: list[tuple[tuple[str, bytes | None], ...]] = []

    def __len__(self) -> int:
        return len(self.offsets)

    def add(self, columns: RecordColumns, timestamp_type: int, start: int, end: int) -> int:
        """Append the records of one decoded batch whose offsets are in [start, end); returns
        how many. A compressed batch can begin before ``start`` (fetches return whole batches)
        and the last one can reach past ``end``; offsets within a batch increase, so bisect."""
        offsets = columns.offsets
        lo = 0 if not offsets or offsets[0] >= start else bisect.bisect_left(offsets, start)
        hi = len(offsets) if not offsets or offsets[-1] < end else bisect.bisect_left(offsets, end)
        if hi <= lo:
            return 0
        whole = lo == 0 and hi == len(offsets)
        if whole:
            self.offsets += offsets
            self.timestamps += columns.timestamps
            self.keys += columns.keys
            self.values += columns.values
            if self.include_headers:
                self.headers += columns.headers
        else:
            self.offsets += offsets[lo:hi]
            self.timestamps += columns.timestamps[lo:hi]
            self.keys += columns.keys[lo:hi]
            self.values += columns.values[lo:hi]
            if self.include_headers:
                self.headers += columns.headers[lo:hi]
        self.timestamp_types += [timestamp_type] * (hi - lo)
        return hi - lo

    def to_arrow(self) -> pa.RecordBatch:
        """The buffered rows as one RecordBatch of :attr:`schema`; the buffer is emptied."""
        n = len(self.offsets)
        millis = pa.array(self.timestamps, pa.int64())
        arrays: list[pa.Array] = [
            pa.array(self.keys, pa.binary()),
            pa.array(self.values, pa.binary()),
            pa.array([self.topic] * n, pa.string()),
            pa.array([self.partition] * n, pa.int32()),
            pa.array(self.offsets, pa.int64()),
            pc.multiply(millis, 1000).cast(self.schema.field("timestamp").type),
            pa.array(self.timestamp_types, pa.int32()),
        ]
        if self.include_headers:
            arrays.append(self._headers_array())
        batch = pa.RecordBatch.from_arrays(arrays, schema=self.schema)
        self._reset()
        return batch

    def _headers_array(self) -> pa.Array:
        header_type = self.schema.field("headers").type
        list_offsets = [0]
        keys: list[str] = []
        values: list[bytes | None] = []
        total = 0
        for record_headers in self.headers:
            for key, value in record_headers:
                keys.append(key)
                values.append(value)
            total += len(record_headers)
            list_offsets.append(total)
        struct_type = header_type.value_type
        elements = pa.StructArray.from_arrays(
            [pa.array(keys, pa.string()), pa.array(values, pa.binary())],
            fields=list(struct_type),
        )
        return pa.ListArray.from_arrays(
            pa.array(list_offsets, pa.int32()), elements, type=header_type
        )
