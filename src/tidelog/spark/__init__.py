"""PySpark data source "tidelog": batch and streaming read, write (Arrow).

``register(spark)`` makes ``spark.read.format("tidelog")`` (and readStream / write /
writeStream) available in that session; see docs/spark.md for the options.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["WorkerPythonError", "register", "worker_python"]

# What PySpark's SparkContext starts workers with when PYSPARK_PYTHON is not set.
_SPARK_DEFAULT_PYTHON = "python3"


class WorkerPythonError(RuntimeError):
    """No interpreter for Spark's Python workers was set, and the driver's cannot be assumed."""


def worker_python(
    *,
    master: str,
    context_python: str,
    conf_python: str | None,
    env_python: str | None,
    driver_python: str,
) -> str:
    """The interpreter Spark's Python workers must run: ``spark.pyspark.python``, else
    ``PYSPARK_PYTHON``, as Spark ranks them; else, for a local master, the driver's own.

    ``context_python`` is what the SparkContext took from PYSPARK_PYTHON when it started; a
    value other than PySpark's default was set on purpose and is kept. Executors of a cluster
    run on other machines, where the driver's path means nothing: that is refused.
    """
    chosen = conf_python or env_python
    if chosen:
        return chosen
    if context_python != _SPARK_DEFAULT_PYTHON:
        return context_python
    if master.startswith("local"):
        return driver_python
    raise WorkerPythonError(
        f"tidelog.spark: set PYSPARK_PYTHON (before the SparkSession starts) or "
        f"spark.pyspark.python to a Python that has tidelog installed on the executors of "
        f"{master}; without it they start {_SPARK_DEFAULT_PYTHON!r}"
    )


def _use_worker_python(spark: SparkSession) -> None:
    # A job started as `.venv/bin/python job.py` leaves PYSPARK_PYTHON unset, and Spark's
    # workers would run `python3` from PATH, which lacks tidelog. The SparkContext reads
    # PYSPARK_PYTHON once when it starts, and only spark-submit turns spark.pyspark.python
    # into it; the interpreter is then captured from sc.pythonExec by every Python function
    # wrapped afterwards (the data source included), so setting it here is what takes effect.
    sc = getattr(spark, "_sc", None)
    if sc is None:  # Spark Connect: the server decides its workers' interpreter
        return
    sc.pythonExec = worker_python(
        master=sc.master,
        context_python=sc.pythonExec,
        conf_python=sc.getConf().get("spark.pyspark.python", None),
        env_python=os.environ.get("PYSPARK_PYTHON"),
        driver_python=sys.executable,
    )


def register(spark: SparkSession) -> None:
    """Register the ``tidelog`` format with ``spark`` (imports pyspark only when called).

    Spark's Python workers are pointed at an interpreter that can import tidelog: the one set
    by ``spark.pyspark.python`` or ``PYSPARK_PYTHON``, else (local master) the driver's.
    """
    from tidelog.spark.source import TidelogDataSource

    _use_worker_python(spark)
    spark.dataSource.register(TidelogDataSource)
