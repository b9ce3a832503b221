"""Kafka RecordBatch v2 (magic 2): zero-copy header view, builder, compression, record decoder."""

from tidelog.protocol.records.batch import (
    CorruptRecordError,
    RecordBatch,
    batch_size_at,
    complete_batches_size,
    iter_batches,
)
from tidelog.protocol.records.builder import (
    Record,
    build_batch,
    build_end_transaction_marker,
    build_values,
)
from tidelog.protocol.records.compression import (
    GZIP,
    LZ4,
    NONE,
    SNAPPY,
    ZSTD,
    UnsupportedCompressionTypeError,
    compress,
    decompress,
)
from tidelog.protocol.records.decoder import (
    ControlRecordType,
    DecodedRecord,
    EndTransactionMarker,
    RecordColumns,
    decode_columns,
    decode_records,
    iter_records,
    parse_control_record,
    parse_end_transaction_marker,
)

__all__ = [
    "GZIP",
    "LZ4",
    "NONE",
    "SNAPPY",
    "ZSTD",
    "ControlRecordType",
    "CorruptRecordError",
    "DecodedRecord",
    "EndTransactionMarker",
    "Record",
    "RecordBatch",
    "RecordColumns",
    "UnsupportedCompressionTypeError",
    "batch_size_at",
    "build_batch",
    "build_end_transaction_marker",
    "build_values",
    "complete_batches_size",
    "compress",
    "decode_columns",
    "decode_records",
    "decompress",
    "iter_batches",
    "iter_records",
    "parse_control_record",
    "parse_end_transaction_marker",
]
