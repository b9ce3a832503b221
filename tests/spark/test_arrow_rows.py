"""RowBuffer: fetched record batches -> the Arrow RecordBatch Spark receives, the same with the C
column builder and the pure-Python one."""

from __future__ import annotations

import os
from datetime import UTC, datetime

import pytest

from tidelog.protocol.records import GZIP, Record, RecordBatch, build_batch
from tidelog.protocol.records.columnar import PyColumnBuilder
from tidelog.spark.arrow import RowBuffer, arrow_schema, source_schema

BUILDERS = ["native", "python"]


def _row_buffer(kind: str, include_headers: bool) -> RowBuffer:
    buffer = RowBuffer("clicks", 4, arrow_schema(source_schema(include_headers)))
    if kind == "python":
        buffer._builder = PyColumnBuilder(include_headers)
    elif os.environ.get("TIDELOG_PURE_PYTHON") == "1":
        pytest.skip("TIDELOG_PURE_PYTHON=1: the C builder is not under test")
    return buffer


def _batches() -> list[RecordBatch]:
    first = build_batch(
        [
            Record(value=b"v0", key=b"k0", headers=(("trace", b"t0"), ("empty", None))),
            Record(value=None, key=None, timestamp=1_700_000_000_123),
            Record(value=b"", key=b"k2", headers=(("\u00e9t\u00e9", b"x"),)),
        ],
        base_offset=10,
        now_ms=1_700_000_000_000,
    )
    second = build_batch(
        [Record(value=b"v%d" % i) for i in range(3)],
        base_offset=13,
        compression=GZIP,
        log_append_time=True,
        now_ms=1_700_000_000_999,
    )
    return [RecordBatch(memoryview(first)), RecordBatch(memoryview(second))]


@pytest.mark.parametrize("kind", BUILDERS)
def test_rows_in_the_window_become_one_arrow_batch_with_spark_kafka_columns(kind: str) -> None:
    buffer = _row_buffer(kind, include_headers=True)
    added = [buffer.add(batch, 11, 15) for batch in _batches()]
    assert added == [2, 2] and len(buffer) == 4
    table = buffer.to_arrow()
    table.validate(full=True)
    assert table.schema == arrow_schema(source_schema(True))
    rows = table.to_pylist()
    assert [r["offset"] for r in rows] == [11, 12, 13, 14]
    assert [r["key"] for r in rows] == [None, b"k2", None, None]
    assert [r["value"] for r in rows] == [None, b"", b"v0", b"v1"]
    assert {r["topic"] for r in rows} == {"clicks"} and {r["partition"] for r in rows} == {4}
    assert rows[0]["timestamp"] == datetime.fromtimestamp(1_700_000_000.123, UTC)
    assert [r["timestampType"] for r in rows] == [0, 0, 1, 1]
    assert rows[1]["headers"] == [{"key": "\u00e9t\u00e9", "value": b"x"}]
    assert rows[0]["headers"] == [] and rows[2]["headers"] == []
    assert len(buffer) == 0 and buffer.to_arrow().num_rows == 0


@pytest.mark.parametrize("kind", BUILDERS)
def test_headers_of_several_records_line_up_with_their_rows(kind: str) -> None:
    buffer = _row_buffer(kind, include_headers=True)
    buffer.add(_batches()[0], 0, 100)
    rows = buffer.to_arrow().to_pylist()
    assert [r["headers"] for r in rows] == [
        [{"key": "trace", "value": b"t0"}, {"key": "empty", "value": None}],
        [],
        [{"key": "\u00e9t\u00e9", "value": b"x"}],
    ]


def test_both_builders_give_equal_arrow_batches() -> None:
    tables = []
    for kind in BUILDERS:
        buffer = _row_buffer(kind, include_headers=True)
        for batch in _batches():
            buffer.add(batch, 0, 100)
        tables.append(buffer.to_arrow())
    assert tables[0].equals(tables[1])
