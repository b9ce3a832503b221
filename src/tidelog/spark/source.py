"""The data source "tidelog": Spark's Kafka source and sink, over tidelog's own client.

    spark.dataSource.register(TidelogDataSource)        # or tidelog.spark.register(spark)
    df = (spark.read.format("tidelog")
          .option("kafka.bootstrap.servers", "127.0.0.1:9092")
          .option("subscribe", "events").load())

Options are validated when Spark asks for a reader or writer (query planning), with errors
naming the option (see :mod:`tidelog.spark.options`).
"""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from tidelog.spark.arrow import source_schema
from tidelog.spark.options import (
    _bool,
    _lower,
    parse_sink_options,
    parse_source_options,
)
from tidelog.spark.reader import TidelogBatchReader
from tidelog.spark.stream_reader import TidelogStreamReader
from tidelog.spark.writer import TidelogBatchWriter, TidelogStreamWriter, validate_sink_schema

__all__ = ["TidelogDataSource"]


class TidelogDataSource(DataSource):
    """Format ``tidelog``: batch and streaming reads, batch and streaming writes."""

    @classmethod
    def name(cls) -> str:
        return "tidelog"

    def schema(self) -> StructType:
        return source_schema(_bool(_lower(self.options), "includeHeaders", False))

    def reader(self, schema: StructType) -> DataSourceReader:
        return TidelogBatchReader(parse_source_options(self.options, streaming=False), schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return TidelogStreamReader(parse_source_options(self.options, streaming=True), schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        options = parse_sink_options(self.options)
        validate_sink_schema(schema, options)
        return TidelogBatchWriter(options)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        options = parse_sink_options(self.options)
        validate_sink_schema(schema, options)
        return TidelogStreamWriter(options)
