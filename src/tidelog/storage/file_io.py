"""The one narrow file interface of the log (so the simulator can swap in a crash-able disk).

`OsFileIO` maps it onto real files with plain `os` calls: appends with `os.write` on an O_APPEND
descriptor, reads with `os.pread`, durability with `os.fsync`. Paths are strings; a handle keeps
its size in memory so that an append never needs a `stat`.
"""

from __future__ import annotations

import os
from typing import Protocol, runtime_checkable

try:
    _IOV_MAX = max(16, min(1024, os.sysconf("SC_IOV_MAX")))
except (AttributeError, ValueError, OSError):
    _IOV_MAX = 16

__all__ = ["FileHandle", "FileIO", "FileSlice", "OsFileHandle", "OsFileIO", "write_file_atomically"]


@runtime_checkable
class FileHandle(Protocol):
    path: str

    def append(self, data: bytes | bytearray | memoryview) -> int:
        """Write at the end; returns the position written at."""
        ...

    def read(self, position: int, size: int) -> bytes | memoryview:
        """Up to `size` bytes from `position` (fewer at the end of the file)."""
        ...

    # Optional: `append_parts(parts: list[memoryview]) -> int` writes the concatenation of
    # `parts` at the end (writev); the log falls back to `append(b"".join(parts))`.

    def size(self) -> int: ...

    def flush(self) -> None:
        """Make everything written so far durable (fsync)."""
        ...

    def truncate(self, size: int) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class FileIO(Protocol):
    def open(self, path: str) -> FileHandle:
        """Open for read/append, creating the file when missing."""
        ...

    def exists(self, path: str) -> bool: ...

    def listdir(self, path: str) -> list[str]: ...

    def makedirs(self, path: str) -> None: ...

    def remove(self, path: str) -> None:
        """Remove a file, or an empty directory."""
        ...

    def rename(self, src: str, dst: str) -> None:
        """Atomically replace `dst` with `src` (durable once the directory is fsynced)."""
        ...

    def fsync_dir(self, path: str) -> None: ...


class FileSlice:
    """Whole batches of a segment file, sent with `os.sendfile` on the broker's fetch path
    (Kafka's FileRecords slice written by transferTo).

    It owns a duplicate of the segment's descriptor, so retention, the cleaner or a roll may
    delete or close the segment while the slice waits to be sent: the bytes it names stay
    readable until the slice is closed (Kafka keeps its FileChannel open the same way).
    `next_offset` is the offset after its last batch (the upper bound for aborted
    transactions). Closed by the sender, or when dropped unsent."""

    __slots__ = ("_fd", "position", "length", "next_offset")

    def __init__(self, fd: int, position: int, length: int, next_offset: int) -> None:
        self._fd = -1  # (for __del__ when dup fails)
        self._fd = os.dup(fd)
        self.position = position
        self.length = length
        self.next_offset = next_offset

    def __len__(self) -> int:
        return self.length

    def fileno(self) -> int:
        return self._fd

    def read(self) -> bytes:
        """The bytes themselves (a copy: for a connection that cannot sendfile, and checks)."""
        data = os.pread(self._fd, self.length, self.position)
        if len(data) != self.length:
            raise OSError(f"segment file shrank below a slice being sent ({len(data)} of "
                          f"{self.length} bytes)")
        return data

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __del__(self) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"FileSlice(position={self.position}, length={self.length})"


class OsFileHandle:
    __slots__ = ("path", "_fd", "_size")

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        self._size = os.fstat(self._fd).st_size

    def fileno(self) -> int:
        return self._fd

    def append(self, data: bytes | bytearray | memoryview) -> int:
        position = self._size
        view = memoryview(data)
        written = os.write(self._fd, view)
        while written < len(view):  # regular files rarely write short, but may (signals, quotas)
            written += os.write(self._fd, view[written:])
        self._size += written
        return position

    def append_parts(self, parts: list[memoryview]) -> int:
        """Write the concatenation of `parts` at the end with writev (no joining copy)."""
        position = self._size
        for i in range(0, len(parts), _IOV_MAX):
            chunk = parts[i : i + _IOV_MAX]
            want = sum(len(p) for p in chunk)
            written = os.writev(self._fd, chunk)
            if written < want:  # a short writev: finish the chunk with plain writes
                rest = memoryview(b"".join(chunk))[written:]
                while len(rest):
                    rest = rest[os.write(self._fd, rest) :]
            self._size += want
        return position

    def read(self, position: int, size: int) -> bytes:
        return os.pread(self._fd, size, position)

    def size(self) -> int:
        return self._size

    def flush(self) -> None:
        os.fsync(self._fd)

    def truncate(self, size: int) -> None:
        os.ftruncate(self._fd, size)
        self._size = size

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class OsFileIO:
    """Real files."""

    def open(self, path: str) -> OsFileHandle:
        return OsFileHandle(path)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def listdir(self, path: str) -> list[str]:
        return sorted(os.listdir(path))

    def makedirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def remove(self, path: str) -> None:
        if os.path.isdir(path):
            os.rmdir(path)
        else:
            os.remove(path)

    def rename(self, src: str, dst: str) -> None:
        os.replace(src, dst)

    def fsync_dir(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_file_atomically(file_io: FileIO, path: str, data: bytes) -> None:
    """Kafka's checkpoint write: temp file, fsync, rename over the target, fsync the directory.
    After a crash the file shows either the old or the new content, never a mix."""
    tmp = path + ".tmp"
    if file_io.exists(tmp):
        file_io.remove(tmp)
    handle = file_io.open(tmp)
    try:
        handle.truncate(0)
        handle.append(data)
        handle.flush()
    finally:
        handle.close()
    file_io.rename(tmp, path)
    file_io.fsync_dir(os.path.dirname(path) or ".")
