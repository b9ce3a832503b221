"""MemoryFileIO: an in-memory disk for the simulator that loses what was not made durable.

Model (close to a journaling filesystem with data=ordered, minus reordering across files):
- File content: each file has its current bytes and its durable bytes; `flush()` (fsync) makes
  the current bytes durable. A crash reverts every file to its durable bytes, or with
  `tear=True` keeps a random prefix of the unflushed tail (a torn write).
- Names: creating, renaming and removing a file change the current directory; only
  `fsync_dir(dir)` makes that directory's names durable. A crash restores the durable names, so a
  checkpoint written as temp + fsync + rename + fsync_dir survives, and without the dir fsync the
  old file comes back. Directories themselves (`makedirs`) are durable at once.
- Handles opened before a crash are dead after it (any use raises OSError), like a killed process.

Deterministic: randomness only from the `random.Random` passed to `crash`.
"""

from __future__ import annotations

import errno
import os
import random

__all__ = ["MemoryFile", "MemoryFileHandle", "MemoryFileIO"]


def _norm(path: str) -> str:
    return os.path.normpath(path)


class MemoryFile:
    """An inode: current content, durable content, and the lowest position changed since the
    last fsync (everything from there on may be lost)."""

    __slots__ = ("data", "durable", "dirty_from")

    def __init__(self) -> None:
        self.data = bytearray()
        self.durable = bytearray()
        self.dirty_from = 0

    def fsync(self) -> None:
        del self.durable[self.dirty_from :]
        self.durable += self.data[self.dirty_from :]
        self.dirty_from = len(self.data)

    @property
    def unflushed_bytes(self) -> int:
        return len(self.data) - self.dirty_from

    def crash(self, rng: random.Random | None, tear: bool) -> None:
        if tear and rng is not None:
            # A torn write: the unflushed change from `dirty_from` on reached the disk only in
            # part (possibly not at all, possibly wholly).
            keep = rng.randint(0, len(self.data) - self.dirty_from)
            restored = self.durable[: self.dirty_from] + self.data[self.dirty_from : self.dirty_from + keep]
        else:
            restored = bytearray(self.durable)
        self.data = restored
        self.durable = bytearray(restored)
        self.dirty_from = len(restored)


class MemoryFileHandle:
    __slots__ = ("path", "_fs", "_file", "_generation", "_closed")

    def __init__(self, fs: MemoryFileIO, path: str, file: MemoryFile) -> None:
        self.path = path
        self._fs = fs
        self._file = file
        self._generation = fs.generation
        self._closed = False

    def _check(self, write: bool = True) -> MemoryFile:
        if self._closed:
            raise OSError(errno.EBADF, "file is closed", self.path)
        if self._generation != self._fs.generation:
            raise OSError(errno.EIO, "file handle from before a crash", self.path)
        self._fs._maybe_fail(self.path, write)
        return self._file

    def append(self, data: bytes | bytearray | memoryview) -> int:
        file = self._check()
        position = len(file.data)
        file.data += data
        self._fs.bytes_written += len(file.data) - position
        return position

    def append_parts(self, parts: list[memoryview]) -> int:
        file = self._check()
        position = len(file.data)
        for part in parts:
            file.data += part
        self._fs.bytes_written += len(file.data) - position
        return position

    def read(self, position: int, size: int) -> bytes:
        file = self._check(write=False)
        with memoryview(file.data) as view:
            return bytes(view[position : position + size])

    def size(self) -> int:
        return len(self._check(write=False).data)

    def flush(self) -> None:
        self._check().fsync()
        self._fs.fsyncs += 1

    def truncate(self, size: int) -> None:
        file = self._check()
        if size < len(file.data):
            del file.data[size:]
        else:
            file.data += bytes(size - len(file.data))
        file.dirty_from = min(file.dirty_from, size)

    def close(self) -> None:
        self._closed = True


class MemoryFileIO:
    """The FileIO of the simulator. `crash(rng, tear)` simulates power loss."""

    def __init__(self) -> None:
        self.files: dict[str, MemoryFile] = {}
        self.durable_files: dict[str, MemoryFile] = {}
        self.dirs: set[str] = {_norm("/")}
        self.generation = 0
        self.fsyncs = 0
        self.bytes_written = 0
        self.crashes = 0
        # path prefix -> (errno, writes only): simulated disk errors
        self._failing: dict[str, tuple[int, bool]] | None = None

    # -- faults ----------------------------------------------------------------------------
    def fail_io(
        self, path_prefix: str = "/", error: int = errno.EIO, writes_only: bool = False
    ) -> None:
        """From now on operations under `path_prefix` raise OSError(`error`): every operation
        (a dead disk), or with `writes_only` only those that change the disk (a full disk:
        `errno.ENOSPC`, a read-only one: `errno.EROFS`)."""
        if self._failing is None:
            self._failing = {}
        self._failing[_norm(path_prefix)] = (error, writes_only)

    def heal(self) -> None:
        self._failing = None

    def _maybe_fail(self, path: str, write: bool = True) -> None:
        if self._failing:
            p = _norm(path)
            for prefix, (error, writes_only) in self._failing.items():
                if writes_only and not write:
                    continue
                if p == prefix or p.startswith(prefix.rstrip("/") + "/"):
                    raise OSError(error, f"simulated I/O error ({os.strerror(error)})", path)

    def crash(self, rng: random.Random | None = None, tear: bool = False) -> None:
        """Power loss: names revert to the last fsync_dir of their directory, contents to their
        last fsync (with `tear`, plus a random prefix of the unflushed tail, drawn from `rng`).
        Open handles become unusable."""
        self.crashes += 1
        self.generation += 1
        # A deterministic order, so that a seeded rng always tears the same way.
        self.files = dict(sorted(self.durable_files.items()))
        for file in self.files.values():
            file.crash(rng, tear)

    def unflushed_bytes(self) -> int:
        return sum(f.unflushed_bytes for f in self.files.values())

    # -- FileIO ----------------------------------------------------------------------------
    def open(self, path: str) -> MemoryFileHandle:
        p = _norm(path)
        self._maybe_fail(p, write=p not in self.files)
        parent = os.path.dirname(p)
        if parent not in self.dirs:
            raise FileNotFoundError(errno.ENOENT, "no such directory", parent)
        if p in self.dirs:
            raise IsADirectoryError(errno.EISDIR, "is a directory", p)
        file = self.files.get(p)
        if file is None:
            file = MemoryFile()
            self.files[p] = file
        return MemoryFileHandle(self, p, file)

    def exists(self, path: str) -> bool:
        p = _norm(path)
        return p in self.files or p in self.dirs

    def listdir(self, path: str) -> list[str]:
        p = _norm(path)
        self._maybe_fail(p, write=False)
        if p in self.files:
            raise NotADirectoryError(errno.ENOTDIR, "not a directory", p)
        if p not in self.dirs:
            raise FileNotFoundError(errno.ENOENT, "no such directory", p)
        names = {os.path.basename(f) for f in self.files if os.path.dirname(f) == p}
        names |= {os.path.basename(d) for d in self.dirs if d != p and os.path.dirname(d) == p}
        return sorted(names)

    def makedirs(self, path: str) -> None:
        p = _norm(path)
        self._maybe_fail(p)
        while p not in self.dirs:
            if p in self.files:
                raise FileExistsError(errno.EEXIST, "a file is in the way", p)
            self.dirs.add(p)
            p = os.path.dirname(p)

    def remove(self, path: str) -> None:
        p = _norm(path)
        self._maybe_fail(p)
        if p in self.files:
            del self.files[p]
            return
        if p in self.dirs:
            if any(os.path.dirname(x) == p for x in (*self.files, *self.dirs)):
                raise OSError(errno.ENOTEMPTY, "directory not empty", p)
            self.dirs.discard(p)
            # An empty directory's removal is durable at once, and its durable names go too.
            for name in [n for n in self.durable_files if os.path.dirname(n) == p]:
                del self.durable_files[name]
            return
        raise FileNotFoundError(errno.ENOENT, "no such file", p)

    def rename(self, src: str, dst: str) -> None:
        s, d = _norm(src), _norm(dst)
        self._maybe_fail(s)
        if s not in self.files:
            raise FileNotFoundError(errno.ENOENT, "no such file", s)
        if os.path.dirname(d) not in self.dirs:
            raise FileNotFoundError(errno.ENOENT, "no such directory", os.path.dirname(d))
        self.files[d] = self.files.pop(s)

    def fsync_dir(self, path: str) -> None:
        p = _norm(path)
        self._maybe_fail(p)
        if p not in self.dirs:
            raise FileNotFoundError(errno.ENOENT, "no such directory", p)
        for name in [n for n in self.durable_files if os.path.dirname(n) == p]:
            if name not in self.files:
                del self.durable_files[name]
        for name, file in self.files.items():
            if os.path.dirname(name) == p:
                self.durable_files[name] = file

    # -- inspection (tests, the simulator's invariant checks) -------------------------------
    def read_file(self, path: str) -> bytes:
        return bytes(self.files[_norm(path)].data)

    def write_file(self, path: str, data: bytes, durable: bool = True) -> None:
        """Replace a file's content (tests use it to plant corrupt or garbage files)."""
        p = _norm(path)
        self.makedirs(os.path.dirname(p))
        file = self.files.setdefault(p, MemoryFile())
        file.data = bytearray(data)
        file.dirty_from = 0
        if durable:
            file.fsync()
            self.durable_files[p] = file
