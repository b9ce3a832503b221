"""Checkpoint files: Kafka's text format, atomic replacement, malformed files."""

from __future__ import annotations

import random

import pytest

from tidelog.sim.disk import MemoryFileIO
from tidelog.storage.checkpoint import OffsetCheckpointFile
from tidelog.storage.errors import KafkaStorageError
from tidelog.storage.file_io import OsFileIO

PATH = "/logs/replication-offset-checkpoint"


def test_offset_checkpoint_round_trip_in_kafka_format(tmp_path: object) -> None:
    fio = OsFileIO()
    path = f"{tmp_path}/replication-offset-checkpoint"
    cp = OffsetCheckpointFile(fio, path)
    cp.write({("orders", 1): 99, ("orders", 0): 1234, ("my-topic", 7): 0})
    with open(path) as f:
        assert f.read() == "0\n3\nmy-topic 7 0\norders 0 1234\norders 1 99\n"
    assert cp.read() == {("orders", 0): 1234, ("orders", 1): 99, ("my-topic", 7): 0}


def test_a_missing_checkpoint_reads_as_empty() -> None:
    fio = MemoryFileIO()
    fio.makedirs("/logs")
    assert OffsetCheckpointFile(fio, PATH).read() == {}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"1\n1\norders 0 5\n", "unrecognized version 1"),
        (b"0\n2\norders 0 5\n", "expected 2 entries, found 1"),
        (b"0\n0\norders 0 5\n", "expected 0 entries, found 1"),
        (b"0\nthree\n", "bad count line"),
        (b"x\n0\n", "bad version line"),
        (b"0\n1\norders zero 5\n", "bad line 3"),
        (b"0\n1\norders 0\n", "bad line 3"),
        (b"0\n", "missing header lines"),
        (b"", "missing header lines"),
        (b"\xff\xfe\x00", "not text"),
    ],
)
def test_a_malformed_checkpoint_is_a_clear_error(content: bytes, message: str) -> None:
    fio = MemoryFileIO()
    fio.write_file(PATH, content)
    with pytest.raises(KafkaStorageError, match=message) as info:
        OffsetCheckpointFile(fio, PATH).read()
    assert PATH in str(info.value)


@pytest.mark.parametrize("seed", range(6))
def test_a_crash_during_or_after_a_write_shows_the_old_or_the_new_content(seed: int) -> None:
    fio = MemoryFileIO()
    fio.makedirs("/logs")
    cp = OffsetCheckpointFile(fio, PATH)
    cp.write({("t", 0): 1})
    rng = random.Random(seed)
    crash_after = rng.choice(["nothing", "append", "flush", "rename"])
    # Drive the atomic write step by step to crash at each point.
    tmp = PATH + ".tmp"
    handle = fio.open(tmp)
    if crash_after != "nothing":
        handle.append(b"0\n1\nt 0 2\n")
    if crash_after in ("flush", "rename"):
        handle.flush()
    if crash_after == "rename":
        fio.rename(tmp, PATH)
    fio.crash(rng, tear=True)
    assert cp.read() == {("t", 0): 1}
    cp.write({("t", 0): 2})
    fio.crash(rng, tear=True)
    assert cp.read() == {("t", 0): 2}


def test_an_unwritable_dir_is_a_storage_error() -> None:
    fio = MemoryFileIO()
    fio.makedirs("/logs")
    fio.fail_io("/logs")
    with pytest.raises(KafkaStorageError, match="error writing checkpoint"):
        OffsetCheckpointFile(fio, PATH).write({("t", 0): 1})
