"""A crash at every step of a clean (each write, fsync, rename and removal of the cleaner, on
the simulator's MemoryFileIO, with torn unflushed writes) leaves a log that loads, keeps every
offset's record or drops only records the clean may drop, and still holds each key's latest
value: before the `.swap` rename the old segments come back, after it the cleaned ones."""

from __future__ import annotations

import os
import random

import pytest

from tidelog.protocol.records.builder import Record, build_batch
from tidelog.protocol.records.decoder import decode_records
from tidelog.sim.disk import MemoryFileHandle, MemoryFileIO
from tidelog.storage.cleaner.log_cleaner import Cleaner, log_to_clean
from tidelog.storage.cleaner.offset_map import OffsetMap
from tidelog.storage.log import Log
from tidelog.storage.log_config import LogConfig

CONFIG = LogConfig.from_dict({"cleanup.policy": "compact", "segment.bytes": 700,
                              "file.delete.delay.ms": 0})


class Crash(Exception):
    pass


class CrashingFileIO(MemoryFileIO):
    """Counts the operations that change the disk and raises Crash at the `crash_at`-th."""

    def __init__(self) -> None:
        super().__init__()
        self.crash_at: int | None = None
        self.steps = 0
        self.renames: list[tuple[str, str]] = []
        self.crash_on_rename_to: str | None = None  # a suffix: crash once renamed to it

    def step(self) -> None:
        if self.crash_at is not None:
            self.steps += 1
            if self.steps >= self.crash_at:
                raise Crash()

    def open(self, path: str) -> MemoryFileHandle:
        self.step()
        return _Counting(super().open(path), self)  # type: ignore[return-value]

    def rename(self, src: str, dst: str) -> None:
        self.step()
        super().rename(src, dst)
        if self.crash_on_rename_to is not None and dst.endswith(self.crash_on_rename_to):
            super().fsync_dir(os.path.dirname(dst))
            raise Crash()

    def remove(self, path: str) -> None:
        self.step()
        super().remove(path)

    def fsync_dir(self, path: str) -> None:
        self.step()
        super().fsync_dir(path)


class _Counting:
    """A handle whose writes count as steps."""

    def __init__(self, handle: MemoryFileHandle, fs: CrashingFileIO) -> None:
        self._handle = handle
        self._fs = fs
        self.path = handle.path

    def append(self, data: bytes | bytearray | memoryview) -> int:
        self._fs.step()
        return self._handle.append(data)

    def append_parts(self, parts: list[memoryview]) -> int:
        self._fs.step()
        return self._handle.append_parts(parts)

    def flush(self) -> None:
        self._fs.step()
        self._handle.flush()

    def truncate(self, size: int) -> None:
        self._fs.step()
        self._handle.truncate(size)

    def read(self, position: int, size: int) -> bytes:
        return self._handle.read(position, size)

    def size(self) -> int:
        return self._handle.size()

    def close(self) -> None:
        self._handle.close()


def contents(log: Log) -> list[tuple[int, bytes | None, bytes | None]]:
    return [(r.offset, r.key, r.value) for b in log.batches(0) for r in decode_records(b)]


def dirty_log(fio: CrashingFileIO) -> Log:
    log = Log("/d/c-0", CONFIG, fio)
    for i in range(40):
        batch = build_batch([Record(b"v%d" % i, key=b"k%d" % (i % 7)),
                             Record(b"w%d" % i, key=b"j%d" % (i % 3))], base_timestamp=i)
        log.append_as_leader(batch, 0, now_ms=i)
    log.roll(100)
    log.update_high_watermark(log.log_end_offset)
    log.flush()
    return log


def latest_per_key(records: list[tuple[int, bytes | None, bytes | None]]) -> dict[bytes, tuple[int, bytes | None]]:
    out: dict[bytes, tuple[int, bytes | None]] = {}
    for offset, key, value in records:
        assert key is not None
        out[key] = (offset, value)
    return out


def clean_with_crash_at(crash_at: int | None, seed: int) -> tuple[bool, CrashingFileIO, list]:  # type: ignore[type-arg]
    fio = CrashingFileIO()
    log = dirty_log(fio)
    before = contents(log)
    fio.crash_at = crash_at
    fio.steps = 0
    cleaner = Cleaner(OffsetMap(1 << 20), step_bytes=300)
    try:
        for _ in cleaner.clean(log_to_clean(log, None, 200), 200):
            pass
        crashed = False
    except Crash:
        crashed = True
    return crashed, fio, before


def test_a_crash_at_every_step_of_a_clean_recovers_to_a_valid_log() -> None:
    crash_points = 0
    for crash_at in range(1, 10_000):
        crashed, fio, before = clean_with_crash_at(crash_at, crash_at)
        if not crashed:
            break
        crash_points += 1
        fio.crash_at = None
        fio.crash(random.Random(crash_at), tear=True)
        log = Log("/d/c-0", CONFIG, fio)
        after = contents(log)
        offsets = [o for o, _, _ in after]
        assert offsets == sorted(set(offsets)), crash_at
        assert set(after) <= set(before), crash_at  # records keep their offsets and values
        assert latest_per_key(after) == latest_per_key(before), crash_at
        assert log.log_end_offset == before[-1][0] + 1
        names = fio.listdir("/d/c-0")
        assert not [n for n in names if n.endswith((".cleaned", ".swap", ".deleted"))], names
        # the recovered log cleans to the same result as a clean without a crash
        for _ in Cleaner(OffsetMap(1 << 20)).clean(log_to_clean(log, None, 300), 300):
            pass
        assert latest_per_key(contents(log)) == latest_per_key(before)
    assert crash_points > 20  # the clean has that many disk steps: each was crashed at


@pytest.mark.parametrize("suffix", [".log.swap", ".log"])
def test_a_crash_after_the_swap_rename_keeps_the_cleaned_segment(suffix: str) -> None:
    """Once a `.log.swap` name is durable, loading completes the swap (old segments go); the
    same holds once the swap took the `.log` name while old segments were still listed."""
    fio = CrashingFileIO()
    log = dirty_log(fio)
    before = contents(log)
    fio.crash_on_rename_to = suffix
    with pytest.raises(Crash):
        for _ in Cleaner(OffsetMap(1 << 20)).clean(log_to_clean(log, None, 200), 200):
            pass
    fio.crash_on_rename_to = None
    fio.crash()
    reopened = Log("/d/c-0", CONFIG, fio)
    after = contents(reopened)
    assert len(after) < len(before)  # the first group's cleaned segment is in
    assert set(after) <= set(before)
    assert latest_per_key(after) == latest_per_key(before)
    assert not [n for n in fio.listdir("/d/c-0") if n.endswith((".swap", ".cleaned"))]


def test_a_crash_before_the_swap_rename_drops_the_cleaned_file() -> None:
    fio = CrashingFileIO()
    log = dirty_log(fio)
    before = contents(log)
    fio.crash_on_rename_to = ".log.swap"
    orig_rename = fio.rename

    def refuse_swap(src: str, dst: str) -> None:
        if dst.endswith(".swap"):
            raise Crash()
        orig_rename(src, dst)

    fio.rename = refuse_swap  # type: ignore[method-assign]
    with pytest.raises(Crash):
        for _ in Cleaner(OffsetMap(1 << 20)).clean(log_to_clean(log, None, 200), 200):
            pass
    fio.fsync_dir("/d/c-0")  # even with the .cleaned name durable
    assert [n for n in fio.listdir("/d/c-0") if n.endswith(".cleaned")]
    fio.crash()
    reopened = Log("/d/c-0", CONFIG, fio)
    assert contents(reopened) == before
    assert not [n for n in fio.listdir("/d/c-0") if n.endswith(".cleaned")]


def test_an_io_error_during_the_swap_takes_the_log_offline_until_reloaded() -> None:
    fio = CrashingFileIO()
    log = dirty_log(fio)
    before = contents(log)
    orig_rename = fio.rename

    def failing_rename(src: str, dst: str) -> None:
        if src.endswith(".swap"):
            raise OSError(5, "simulated I/O error")
        orig_rename(src, dst)

    fio.rename = failing_rename  # type: ignore[method-assign]
    with pytest.raises(OSError):
        for _ in Cleaner(OffsetMap(1 << 20)).clean(log_to_clean(log, None, 200), 200):
            pass
    assert log.failed  # appends are refused until the log is loaded again
    fio.rename = orig_rename  # type: ignore[method-assign]
    log.close()
    reopened = Log("/d/c-0", CONFIG, fio)
    after = contents(reopened)
    assert len(after) < len(before) and set(after) <= set(before)
    assert latest_per_key(after) == latest_per_key(before)
