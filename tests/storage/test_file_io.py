"""OsFileIO over real files, and the atomic file write used by checkpoints."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tidelog.storage.file_io import FileHandle, FileIO, OsFileIO, write_file_atomically


def test_os_file_handle_appends_reads_and_truncates(tmp_path: Path) -> None:
    fio = OsFileIO()
    assert isinstance(fio, FileIO)
    h = fio.open(str(tmp_path / "seg.log"))
    assert isinstance(h, FileHandle)
    assert h.append(b"hello ") == 0
    assert h.append(memoryview(b"world")) == 6
    assert h.append_parts([memoryview(b"!"), memoryview(b"?!")]) == 11
    assert h.size() == 14 and h.read(4, 4) == b"o wo"
    assert h.read(12, 100) == b"?!"
    h.truncate(5)
    assert h.size() == 5
    assert h.append(b"!") == 5
    h.flush()
    h.close()
    assert (tmp_path / "seg.log").read_bytes() == b"hello!"
    again = fio.open(str(tmp_path / "seg.log"))
    assert again.size() == 6  # an existing file opens at its size
    again.close()


def test_append_parts_writes_more_buffers_than_iov_max(tmp_path: Path) -> None:
    h = OsFileIO().open(str(tmp_path / "many"))
    parts = [memoryview(bytes([i % 256]) * 3) for i in range(3000)]
    h.append_parts(parts)
    h.close()
    assert (tmp_path / "many").read_bytes() == b"".join(parts)


def test_directory_operations(tmp_path: Path) -> None:
    fio = OsFileIO()
    d = str(tmp_path / "a" / "b")
    fio.makedirs(d)
    fio.makedirs(d)  # idempotent
    fio.open(d + "/x").close()
    assert fio.listdir(d) == ["x"] and fio.exists(d + "/x")
    fio.rename(d + "/x", d + "/y")
    fio.fsync_dir(d)
    assert fio.listdir(d) == ["y"]
    with pytest.raises(OSError):
        fio.remove(d)  # not empty
    fio.remove(d + "/y")
    fio.remove(d)
    assert not fio.exists(d)
    with pytest.raises(NotADirectoryError):
        fio.open(str(tmp_path / "f")).close()
        fio.listdir(str(tmp_path / "f"))


def test_write_file_atomically_replaces_and_leaves_no_temp(tmp_path: Path) -> None:
    fio = OsFileIO()
    path = str(tmp_path / "cp")
    write_file_atomically(fio, path, b"one")
    write_file_atomically(fio, path, b"two")
    assert Path(path).read_bytes() == b"two"
    assert os.listdir(tmp_path) == ["cp"]
    Path(path + ".tmp").write_bytes(b"stale leftover")
    write_file_atomically(fio, path, b"three")
    assert Path(path).read_bytes() == b"three" and os.listdir(tmp_path) == ["cp"]
