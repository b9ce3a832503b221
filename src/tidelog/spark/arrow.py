"""The source's schema and the Arrow record batches built from decoded Kafka record batches.

The schema is Spark's Kafka source schema, column for column, so queries move between
``format("kafka")`` and ``format("tidelog")`` unchanged. Record batches are parsed
straight into Arrow column buffers (:class:`RowBuffer` over
:class:`~tidelog.protocol.records.columnar.ColumnBuilder`, in C when built) and handed to
Spark as one :class:`pyarrow.RecordBatch` per buffer: no Python object per row ever exists.
"""

from __future__ import annotations

import struct

import pyarrow as pa
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

from tidelog.protocol.records import RecordBatch
from tidelog.protocol.records.columnar import ColumnBuilder, append_batch

__all__ = ["RowBuffer", "arrow_schema", "source_schema"]

_INT32 = struct.Struct("<i")
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
    """Records of one topic-partition, as Arrow column buffers, until :meth:`to_arrow`."""

    __slots__ = ("topic", "partition", "schema", "include_headers", "_builder")

    def __init__(self, topic: str, partition: int, schema: pa.Schema) -> None:
        self.topic = topic
        self.partition = partition
        self.schema = schema
        self.include_headers = "headers" in schema.names
        self._builder = ColumnBuilder(self.include_headers)

    def __len__(self) -> int:
        return len(self._builder)

    @property
    def data_bytes(self) -> int:
        """Bytes in the largest binary column (Arrow caps one array at 2 GiB)."""
        return self._builder.data_bytes

    def add(self, batch: RecordBatch, start: int, end: int) -> int:
        """Append the records of ``batch`` whose offsets are in [start, end); returns how
        many. A compressed batch can begin before ``start`` (fetches return whole batches) and
        the last one can reach past ``end``. The batch's CRC is checked first."""
        return append_batch(self._builder, batch, start, end)

    def to_arrow(self) -> pa.RecordBatch:
        """The buffered rows as one RecordBatch of :attr:`schema`; the buffer is emptied."""
        n, offsets, timestamps, timestamp_types, keys, values, headers = self._builder.take()
        schema = self.schema
        arrays: list[pa.Array] = [
            _binary(pa.binary(), n, keys),
            _binary(pa.binary(), n, values),
            _repeated_string(self.topic, n),
            pa.Array.from_buffers(pa.int32(), n, [None, _int32s(self.partition, n)]),
            pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(offsets)]),
            pa.Array.from_buffers(
                schema.field("timestamp").type, n, [None, pa.py_buffer(timestamps)]
            ),
            pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(timestamp_types)]),
        ]
        if self.include_headers:
            arrays.append(_headers(schema.field("headers").type, n, headers))
        return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _binary(type_: pa.DataType, n: int, buffers: tuple) -> pa.Array:
    validity, offsets, data, nulls = buffers
    return pa.Array.from_buffers(
        type_,
        n,
        [
            None if validity is None else pa.py_buffer(validity),
            pa.py_buffer(offsets),
            pa.py_buffer(data),
        ],
        null_count=nulls,
    )


def _int32s(value: int, n: int) -> pa.Buffer:
    return pa.py_buffer(_INT32.pack(value) * n)


def _repeated_string(value: str, n: int) -> pa.Array:
    # A one-entry dictionary decoded by Arrow: no Python work per row.
    indices = pa.Array.from_buffers(pa.int32(), n, [None, _int32s(0, n)])
    return pa.DictionaryArray.from_arrays(
        indices, pa.array([value], pa.string())
    ).dictionary_decode()


def _headers(list_type: pa.ListType, n: int, headers: tuple) -> pa.Array:
    lists, keys, values = headers
    count = _INT32.unpack_from(lists, len(lists) - 4)[0]  # the last list's end
    struct_type = list_type.value_type
    elements = pa.StructArray.from_arrays(
        [_binary(pa.string(), count, keys), _binary(pa.binary(), count, values)],
        fields=list(struct_type),
    )
    return pa.Array.from_buffers(list_type, n, [None, pa.py_buffer(lists)], children=[elements])
