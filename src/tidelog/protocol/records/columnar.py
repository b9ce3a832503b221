"""Records of many batches gathered as Arrow column buffers, with no Python object per record.

:class:`ColumnBuilder` is the C implementation (``_columnar.c``) when it was built, else a
pure-Python one over :func:`~tidelog.protocol.records.decoder.decode_columns` with the same
interface and the same output, byte for byte; setting ``TIDELOG_PURE_PYTHON=1`` before import
selects the Python one. ``take()`` returns::

    (rows, offsets, timestamps, timestamp_types, keys, values, headers)

``offsets`` and ``timestamps`` (microseconds) are little-endian int64 buffers, ``timestamp_types``
int32; ``keys`` / ``values`` are ``(validity bitmap or None, int32 offsets, data, null count)``,
the three buffers of an Arrow binary array; ``headers`` is ``None`` unless ``include_headers``,
else ``(int32 list offsets, header keys, header values)`` with keys and values as above.
"""

from __future__ import annotations

from array import array
from typing import Any

from tidelog.protocol.native import load_native
from tidelog.protocol.records.batch import RecordBatch
from tidelog.protocol.records.decoder import RecordColumns, _decode_into, open_records

BinaryBuffers = tuple[bytes | None, bytes, bytes, int]

__all__ = ["NATIVE", "ColumnBuilder", "PyColumnBuilder", "append_batch"]


def _binary_buffers(items: list[bytes | None]) -> BinaryBuffers:
    offsets = array("i", [0])
    validity = bytearray((len(items) + 7) // 8)
    end = 0
    nulls = 0
    for i, item in enumerate(items):
        if item is None:
            nulls += 1
        else:
            validity[i >> 3] |= 1 << (i & 7)
            end += len(item)
        offsets.append(end)
    if end > 0x7FFFFFFF:
        raise OverflowError("more than 2 GiB of data in one Arrow column: take() more often")
    data = b"".join(item for item in items if item is not None)
    return (bytes(validity) if nulls else None), offsets.tobytes(), data, nulls


class PyColumnBuilder:
    """The pure-Python ColumnBuilder (see the module doc)."""

    def __init__(self, include_headers: bool = False) -> None:
        self.include_headers = include_headers
        self._reset()

    def _reset(self) -> None:
        self._offsets = array("q")
        self._timestamps = array("q")
        self._timestamp_types = array("i")
        self._keys: list[bytes | None] = []
        self._values: list[bytes | None] = []
        self._headers: list[Any] = []

    def __len__(self) -> int:
        return len(self._offsets)

    @property
    def data_bytes(self) -> int:
        return max(
            sum(len(k) for k in self._keys if k is not None),
            sum(len(v) for v in self._values if v is not None),
        )

    def append(
        self,
        records: bytes | memoryview,
        count: int,
        base_offset: int,
        base_timestamp: int,
        fixed_timestamp: int | None,
        timestamp_type: int,
        start: int,
        stop: int,
    ) -> int:
        columns = RecordColumns()
        _decode_into(columns, bytes(records), count, base_offset, base_timestamp, fixed_timestamp)
        added = 0
        for i, offset in enumerate(columns.offsets):
            offset = (offset + 2**63) % 2**64 - 2**63  # wraps as the C builder (and Java) do
            if start <= offset < stop:
                self._offsets.append(offset)
                # Wraps as the C builder (and Java) do on absurd timestamps.
                micros = (columns.timestamps[i] * 1000 + 2**63) % 2**64 - 2**63
                self._timestamps.append(micros)
                self._timestamp_types.append(timestamp_type)
                self._keys.append(columns.keys[i])
                self._values.append(columns.values[i])
                if self.include_headers:
                    self._headers.append(columns.headers[i])
                added += 1
        return added

    def take(self) -> tuple[Any, ...]:
        headers = None
        if self.include_headers:
            lists = array("i", [0])
            keys: list[bytes | None] = []
            values: list[bytes | None] = []
            for record_headers in self._headers:
                for key, value in record_headers:
                    keys.append(key.encode())
                    values.append(value)
                lists.append(len(keys))
            headers = (lists.tobytes(), _binary_buffers(keys), _binary_buffers(values))
        result = (
            len(self._offsets),
            self._offsets.tobytes(),
            self._timestamps.tobytes(),
            self._timestamp_types.tobytes(),
            _binary_buffers(self._keys),
            _binary_buffers(self._values),
            headers,
        )
        self._reset()
        return result


_columnar = load_native("tidelog.protocol.records._columnar")
NATIVE = _columnar is not None
ColumnBuilder: type[Any] = PyColumnBuilder if _columnar is None else _columnar.ColumnBuilder


def append_batch(builder: Any, batch: RecordBatch, start: int, stop: int) -> int:
    """Check `batch` (magic, CRC32C, record count), decompress it, and append its records with
    offsets in [start, stop) to `builder`; returns how many."""
    section = open_records(batch, copy=False)
    return builder.append(
        section.data,
        section.count,
        section.base_offset,
        section.base_timestamp,
        section.fixed_timestamp,
        section.timestamp_type,
        start,
        stop,
    )
