"""PySpark data source "tidelog": batch and streaming read, write (Arrow).

``register(spark)`` makes ``spark.read.format("tidelog")`` (and readStream / write /
writeStream) available in that session; see docs/spark.md for the options.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["register"]


def register(spark: SparkSession) -> None:
    """Register the ``tidelog`` format with ``spark`` (imports pyspark only when called)."""
    from tidelog.spark.source import TidelogDataSource

    spark.dataSource.register(TidelogDataSource)
