"""ColumnBuilder: records -> Arrow column buffers. The C builder must agree with the pure-Python
one byte for byte on every input, valid or not, and both with decode_columns."""

from __future__ import annotations

import os
import random
import struct
from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.protocol.records import (
    GZIP,
    LZ4,
    NONE,
    SNAPPY,
    ZSTD,
    CorruptRecordError,
    Record,
    RecordBatch,
    build_batch,
    columnar,
    decode_columns,
    decoder,
)
from tidelog.protocol.records.columnar import PyColumnBuilder, append_batch
from tidelog.protocol.records.decoder import RecordColumns, _decode_into, open_records

headers_st = st.lists(
    st.tuples(st.text(max_size=8), st.none() | st.binary(max_size=20)), max_size=3
).map(tuple)
record_st = st.builds(
    Record,
    value=st.none() | st.binary(max_size=200),
    key=st.none() | st.binary(max_size=30),
    headers=headers_st,
    timestamp=st.none() | st.integers(min_value=0, max_value=2**45),
)


def _c_builder(include_headers: bool):
    if os.environ.get("TIDELOG_PURE_PYTHON") == "1":
        pytest.skip("TIDELOG_PURE_PYTHON=1: the C builder is not under test")
    from tidelog.protocol.records._columnar import ColumnBuilder

    return ColumnBuilder(include_headers)


def _append(builder, batch: bytes | bytearray, start: int = 0, stop: int = 2**63 - 1) -> int:
    return append_batch(builder, RecordBatch(memoryview(batch)), start, stop)


def _binary_items(buffers: tuple, n: int) -> list[bytes | None]:
    validity, offsets, data, nulls = buffers
    ends = array("i", offsets)
    assert len(ends) == n + 1 and ends[0] == 0
    items = []
    for i in range(n):
        present = validity is None or validity[i >> 3] >> (i & 7) & 1
        items.append(bytes(data[ends[i] : ends[i + 1]]) if present else None)
    assert nulls == items.count(None)
    return items


def test_the_c_builder_is_built_unless_pure_python_is_asked_for() -> None:
    if os.environ.get("TIDELOG_PURE_PYTHON") == "1":
        assert columnar.ColumnBuilder is PyColumnBuilder
    else:
        assert columnar.NATIVE, "the _columnar C extension was not built"


@settings(max_examples=120, deadline=None)
@given(
    batches=st.lists(st.lists(record_st, min_size=1, max_size=12), min_size=1, max_size=4),
    codec=st.sampled_from([NONE, GZIP, SNAPPY, LZ4, ZSTD]),
    log_append_time=st.booleans(),
    window=st.tuples(st.integers(0, 40), st.integers(0, 40)),
    include_headers=st.booleans(),
)
def test_c_and_python_builders_agree_and_match_decode_columns(
    batches: list[list[Record]],
    codec: int,
    log_append_time: bool,
    window: tuple[int, int],
    include_headers: bool,
) -> None:
    start, stop = min(window), max(window)
    c, py = _c_builder(include_headers), PyColumnBuilder(include_headers)
    expected: list[tuple] = []
    offset = 0
    for records in batches:
        raw = build_batch(
            records,
            base_offset=offset,
            compression=codec,
            log_append_time=log_append_time,
            now_ms=1_700_000_000_000,
        )
        columns = decode_columns(RecordBatch(memoryview(raw)))
        for i, o in enumerate(columns.offsets):
            if start <= o < stop:
                expected.append(
                    (
                        o,
                        columns.timestamps[i] * 1000,
                        columns.keys[i],
                        columns.values[i],
                        columns.headers[i],
                    )
                )
        assert _append(c, raw, start, stop) == _append(py, raw, start, stop)
        offset += len(records)
    assert len(c) == len(py) == len(expected)
    taken = c.take()
    assert taken == py.take()
    n, offsets, timestamps, types, keys, values, headers = taken
    assert list(array("q", offsets)) == [e[0] for e in expected]
    assert list(array("q", timestamps)) == [e[1] for e in expected]
    assert list(array("i", types)) == [int(log_append_time)] * n
    assert _binary_items(keys, n) == [e[2] for e in expected]
    assert _binary_items(values, n) == [e[3] for e in expected]
    if include_headers:
        lists, hkeys, hvalues = headers
        ends = array("i", lists)
        flat = [h for e in expected for h in e[4]]
        assert list(ends) == [0] + [sum(len(e[4]) for e in expected[: i + 1]) for i in range(n)]
        assert _binary_items(hkeys, len(flat)) == [k.encode() for k, _ in flat]
        assert _binary_items(hvalues, len(flat)) == [v for _, v in flat]
    else:
        assert headers is None
    assert len(c) == 0 and c.take()[0] == 0  # take() empties the builder


def _records_section(records: list[Record]) -> tuple[bytes, int]:
    raw = build_batch(records, base_offset=1000, now_ms=1_700_000_000_000)
    section = open_records(RecordBatch(memoryview(raw)))
    return bytes(section.data), section.count


def _outcome(builder, data: bytes, count: int) -> tuple:
    try:
        added = builder.append(data, count, 1000, 1_700_000_000_000, None, 0, 0, 2**62)
    except CorruptRecordError:
        return ("corrupt", builder.take())
    return (added, builder.take())


def _random_records(rng: random.Random, count: int, headers: tuple) -> list[Record]:
    return [
        Record(
            value=rng.randbytes(rng.randrange(0, 200)) if rng.random() > 0.1 else None,
            key=rng.randbytes(rng.randrange(0, 20)) if rng.random() > 0.5 else None,
            headers=headers if rng.random() > 0.6 else (),
        )
        for _ in range(count)
    ]


def _mutations(rng: random.Random, good: bytes, rounds: int = 400):
    """`good` with 1-3 changes each time: a byte overwritten, the tail cut, or bytes spliced in."""
    for _ in range(rounds):
        data = bytearray(good)
        for _ in range(rng.randrange(1, 4)):
            if not data:
                break
            kind = rng.random()
            if kind < 0.6:
                data[rng.randrange(len(data))] = rng.randrange(256)
            elif kind < 0.8:
                del data[rng.randrange(len(data)) :]
            else:
                data[rng.randrange(len(data)) : rng.randrange(len(data))] = rng.randbytes(9)
        yield bytes(data)


@pytest.mark.parametrize("seed", range(6))
def test_mutated_records_get_the_same_outcome_from_both_builders(seed: int) -> None:
    """Garbage in a records section: both builders raise CorruptRecordError (and keep only the
    rows of earlier calls) or both accept it with identical buffers; nothing else, no crash."""
    rng = random.Random(seed)
    good, count = _records_section(_random_records(rng, 20, (("h", b"v"),)))
    corrupt_seen = 0
    for data in _mutations(rng, good):
        mutated_count = count if rng.random() < 0.8 else rng.randrange(0, 40)
        c, py = _c_builder(True), PyColumnBuilder(True)
        # One good batch first: a failing append must leave its rows in place.
        for builder in (c, py):
            builder.append(good, count, 0, 1_700_000_000_000, None, 0, 0, 2**62)
        before = (len(c), len(py))
        c_result = _outcome(c, data, mutated_count)
        py_result = _outcome(py, data, mutated_count)
        assert c_result == py_result
        if c_result[0] == "corrupt":
            corrupt_seen += 1
            assert before == (count, count) and c_result[1][0] == count
    assert corrupt_seen > 100  # the mutations really did reach the error paths


@pytest.mark.parametrize(
    "section, why",
    [
        (b"\x02", "truncated varint region"),
        (b"\x0c\x00\x00\x00\xff\xff\xff\xff\xff\x01\x00", "overlong key length"),
        (b"\x0e\x00\x00\x00\x00\x00\x00", "record shorter than its length"),
        (b"\x0c\x00" + b"\xff" * 9 + b"\x7f", "varlong past 64 bits"),
        (b"\x0c\x00\x00\x00\x05\x00\x00", "key length 2 below -1 (-3 zig-zag)"),
    ],
)
def test_malformed_sections_raise_corrupt_record_error(section: bytes, why: str) -> None:
    for builder in (_c_builder(False), PyColumnBuilder(False)):
        with pytest.raises(CorruptRecordError):
            builder.append(section, 1, 0, 0, None, 0, 0, 10)
        assert len(builder) == 0


def test_a_count_that_cannot_fit_is_refused_before_parsing() -> None:
    data, count = _records_section([Record(value=b"x")] * 3)
    with pytest.raises(CorruptRecordError, match="does not fit"):
        _c_builder(False).append(data, len(data), 0, 0, None, 0, 0, 10)


def test_log_append_time_gives_every_record_the_batch_max_timestamp() -> None:
    raw = build_batch(
        [Record(value=b"a", timestamp=5), Record(value=b"b", timestamp=9)],
        log_append_time=True,
        now_ms=777,
    )
    max_timestamp = RecordBatch(memoryview(raw)).max_timestamp
    builder = _c_builder(False)
    _append(builder, raw)
    n, _, timestamps, types, *_ = builder.take()
    assert list(array("q", timestamps)) == [max_timestamp * 1000] * n
    assert list(array("i", types)) == [1, 1]


def test_offsets_outside_the_window_are_parsed_but_not_kept() -> None:
    raw = build_batch([Record(value=bytes([i])) for i in range(10)], base_offset=100)
    builder = _c_builder(False)
    assert _append(builder, raw, 103, 106) == 3
    n, offsets, _, _, _, values, _ = builder.take()
    assert list(array("q", offsets)) == [103, 104, 105]
    assert _binary_items(values, n) == [b"\x03", b"\x04", b"\x05"]
    assert struct.calcsize("<q") == 8


# -- decode_columns: the same parser into Python lists ------------------------------------------


def _c_decode_columns():
    if os.environ.get("TIDELOG_PURE_PYTHON") == "1":
        pytest.skip("TIDELOG_PURE_PYTHON=1: the C decoder is not under test")
    from tidelog.protocol.records._columnar import decode_columns as c_decode_columns

    return c_decode_columns


def _py_lists(data: bytes, count: int, base_offset: int, base_ts: int, fixed: int | None) -> tuple:
    columns = RecordColumns()
    _decode_into(columns, bytes(data), count, base_offset, base_ts, fixed)
    return (columns.offsets, columns.timestamps, columns.keys, columns.values, columns.headers)


def test_decode_columns_uses_the_c_decoder_unless_pure_python_is_asked_for() -> None:
    if os.environ.get("TIDELOG_PURE_PYTHON") == "1":
        assert decoder._native_decode_columns is None
    else:
        assert decoder._native_decode_columns is not None


@settings(max_examples=120, deadline=None)
@given(
    records=st.lists(record_st, min_size=1, max_size=15),
    codec=st.sampled_from([NONE, GZIP, LZ4]),
    log_append_time=st.booleans(),
    base_offset=st.sampled_from([0, 7, 2**62, 2**63 - 3]),
)
def test_c_decode_columns_builds_the_lists_python_builds(
    records: list[Record], codec: int, log_append_time: bool, base_offset: int
) -> None:
    c_decode_columns = _c_decode_columns()
    raw = build_batch(
        records,
        base_offset=base_offset,
        compression=codec,
        log_append_time=log_append_time,
        now_ms=1_700_000_000_000,
    )
    section = open_records(RecordBatch(memoryview(raw)))
    args = (section.count, section.base_offset, section.base_timestamp, section.fixed_timestamp)
    c_lists = c_decode_columns(section.data, *args)
    assert c_lists == _py_lists(section.data, *args)
    assert all(type(k) is bytes for k in c_lists[2] if k is not None)


def test_offsets_and_timestamps_past_int64_stay_exact_python_ints() -> None:
    c_decode_columns = _c_decode_columns()
    data, count = _records_section(
        [Record(value=b"a", timestamp=10), Record(value=b"b", timestamp=2**40)]
    )
    # The header's int64 bases plus the records' deltas can leave int64: Python stays exact.
    for base_offset, base_ts in [(2**63 - 1, 2**63 - 5), (-(2**63), 2**63 - 1)]:
        assert c_decode_columns(data, count, base_offset, base_ts, None) == _py_lists(
            data, count, base_offset, base_ts, None
        )


@pytest.mark.parametrize("seed", range(4))
def test_mutated_records_decode_alike_in_c_and_python(seed: int) -> None:
    c_decode_columns = _c_decode_columns()
    rng = random.Random(1000 + seed)
    good, count = _records_section(_random_records(rng, 15, (("k\u00e9", b"v"), ("n", None))))
    corrupt_seen = 0
    for data in _mutations(rng, good):
        outcomes = []
        for decode in (c_decode_columns, _py_lists):
            try:
                outcomes.append(decode(data, count, 5, 1_700_000_000_000, None))
            except CorruptRecordError:
                outcomes.append("corrupt")
        assert outcomes[0] == outcomes[1]
        corrupt_seen += outcomes[0] == "corrupt"
    assert corrupt_seen > 100
