"""Log.read_slice: the byte range of a zero-copy (sendfile) fetch is exactly what Log.read
returns, found without reading the records; the slice outlives its segment's deletion."""

from __future__ import annotations

import os
import random

from storage_helpers import batch, small_config

from tidelog.protocol.records.batch import iter_batches
from tidelog.sim.disk import MemoryFileIO
from tidelog.storage.file_io import FileSlice, OsFileIO
from tidelog.storage.log import FetchDataInfo, Log


def _bytes(info: FetchDataInfo) -> bytes:
    records = info.records
    return records.read() if isinstance(records, FileSlice) else bytes(records)


def _filled_log(path: str, seed: int) -> Log:
    """Batches of 1 to 3,000 bytes over several segments, with a sparse index."""
    rng = random.Random(seed)
    log = Log(path, small_config(segment_bytes=20_000, index_interval_bytes=rng.choice(
        [64, 512, 4096])), OsFileIO())
    for _ in range(120):
        values = [rng.randbytes(rng.choice([1, 40, 300, 1500])) for _ in range(rng.randint(1, 3))]
        log.append_as_leader(batch(*values), 0, 0)
    return log


def test_a_slice_holds_the_same_batches_as_a_read_with_every_bound(tmp_path: object) -> None:
    for seed in range(4):
        log = _filled_log(f"{tmp_path}/s{seed}-0", seed)
        rng = random.Random(100 + seed)
        end = log.log_end_offset
        slices = 0
        for _ in range(300):
            start = rng.randrange(0, end)
            max_bytes = rng.choice([0, 1, 30, 200, 1000, 5000, 30_000, 10**6])
            max_offset = rng.choice([None, rng.randrange(start, end + 1)])
            min_one = rng.random() < 0.5
            read = log.read(start, max_bytes, max_offset, min_one)
            info = log.read_slice(start, max_bytes, max_offset, min_one, min_slice_bytes=0)
            assert _bytes(info) == bytes(read.records), (start, max_bytes, max_offset, min_one)
            assert info.first_offset == read.first_offset
            if isinstance(info.records, FileSlice):
                slices += 1
                # aborted transactions are collected up to the offset after the last batch
                last = [b.last_offset for b in iter_batches(bytes(read.records))][-1]
                assert info.records.next_offset == last + 1
        assert slices > 100
        log.close()


def test_a_range_below_the_threshold_is_read_into_memory(tmp_path: object) -> None:
    log = Log(f"{tmp_path}/t-0", small_config(segment_bytes=100_000), OsFileIO())
    for _ in range(10):
        log.append_as_leader(batch(b"x" * 1000), 0, 0)
    size = len(batch(b"x" * 1000))
    small = log.read_slice(0, 3 * size, min_slice_bytes=3 * size + 1)
    assert isinstance(small.records, memoryview) and len(small.records) == 3 * size
    large = log.read_slice(0, 3 * size, min_slice_bytes=3 * size)
    assert isinstance(large.records, FileSlice) and len(large.records) == 3 * size
    assert log.read_slice(10, 10**6, min_slice_bytes=0).records == memoryview(b"")
    log.close()


def test_a_log_without_file_descriptors_reads_into_memory() -> None:
    log = Log("/data/m-0", small_config(), MemoryFileIO())
    for _ in range(5):
        log.append_as_leader(batch(b"abc"), 0, 0)
    info = log.read_slice(0, 10**6, min_slice_bytes=0)
    assert bytes(info.records) == bytes(log.read(0, 10**6).records)


def test_a_slice_keeps_its_bytes_after_retention_deletes_the_segment(tmp_path: object) -> None:
    config = small_config(segment_bytes=5_000, retention_bytes=5_000, file_delete_delay_ms=0)
    log = Log(f"{tmp_path}/r-0", config, OsFileIO())
    for _ in range(30):
        log.append_as_leader(batch(b"y" * 900), 0, 0)
    log.high_watermark = log.log_end_offset
    expected = bytes(log.read(0, 3_000).records)
    info = log.read_slice(0, 3_000, min_slice_bytes=0)
    assert isinstance(info.records, FileSlice)
    first = os.path.basename(log.segments[0].log_path)
    assert log.delete_old_segments(now_ms=0) > 0
    assert first not in os.listdir(log.dir) and log.log_start_offset > 0
    assert info.records.read() == expected
    info.records.close()
    log.close()


def test_a_dropped_slice_closes_its_descriptor(tmp_path: object) -> None:
    log = Log(f"{tmp_path}/d-0", small_config(segment_bytes=100_000), OsFileIO())
    log.append_as_leader(batch(b"z" * 5000), 0, 0)
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(50):
        log.read_slice(0, 10**6, min_slice_bytes=0)
    assert len(os.listdir("/proc/self/fd")) == before
    log.close()
