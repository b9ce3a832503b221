"""MemoryFileIO: an in-memory disk for the simulator that loses what was not made durable.

Model (close to a journaling filesystem with data=ordered, minus reordering across files):
- File content: each file has its current bytes and its durable bytes; `flush()` (fsync) makes
  the current bytes durable. A crash reverts every file to its durable bytes, or with
  `tear=True` keeps a random prefix of the unflushed tail (a torn write).
- Names: a directory is an inode holding its current entries (files and directories) and its
  durable entries; `fsync_dir(dir)` makes its current entries durable. Creating, renaming and
  removing a file, creating a directory (`makedirs`) and renaming a directory (its whole tree
  goes with it) change only the current entries: a crash brings back every directory's durable
  entries, so a checkpoint written as temp + fsync + rename + fsync_dir survives, without the
  dir fsync the old file comes back, and a new directory not yet named in a fsynced parent is
  gone with everything in it. Removing an empty directory (rmdir) is durable only once its
  parent is fsynced too: a crash before brings it back with its durable entries. The root's
  entries (`/d`, `/data`: the mount points) are durable at once; `makedirs(path, durable=True)`
  (and `write_file`) stand for what was on the disk before the process ran.
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


class _Dir:
    """A directory inode: its current and its durable entries (name -> file or directory)."""

    __slots__ = ("durable", "entries")

    def __init__(self) -> None:
        self.entries: dict[str, MemoryFile | _Dir] = {}
        self.durable: dict[str, MemoryFile | _Dir] = {}


def _parts(path: str) -> list[str]:
    return [c for c in _norm(path).split("/") if c]


class MemoryFileIO:
    """The FileIO of the simulator. `crash(rng, tear)` simulates power loss."""

    def __init__(self) -> None:
        self.root = _Dir()
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
        """Power loss: every directory's entries revert to its last fsync_dir, contents to
        their last fsync (with `tear`, plus a random prefix of the unflushed tail, drawn from
        `rng`). Open handles become unusable."""
        self.crashes += 1
        self.generation += 1
        files: dict[str, MemoryFile] = {}
        seen: set[int] = set()
        stack: list[tuple[str, _Dir]] = [("", self.root)]
        while stack:
            path, d = stack.pop()
            d.entries = dict(d.durable)
            for name, node in d.entries.items():
                child = f"{path}/{name}"
                if isinstance(node, _Dir):
                    stack.append((child, node))
                elif id(node) not in seen:  # one inode under two durable names
                    seen.add(id(node))
                    files[child] = node
        # A deterministic order (by path), so that a seeded rng always tears the same way.
        for _, file in sorted(files.items()):
            file.crash(rng, tear)

    def _walk(self) -> list[tuple[str, MemoryFile]]:
        out: list[tuple[str, MemoryFile]] = []
        stack: list[tuple[str, _Dir]] = [("", self.root)]
        while stack:
            path, d = stack.pop()
            for name, node in d.entries.items():
                if isinstance(node, _Dir):
                    stack.append((f"{path}/{name}", node))
                else:
                    out.append((f"{path}/{name}", node))
        return out

    def unflushed_bytes(self) -> int:
        return sum(f.unflushed_bytes for _, f in self._walk())

    @property
    def files(self) -> dict[str, MemoryFile]:
        """Every file by its current path (tests inspect or damage one)."""
        return dict(self._walk())

    # -- lookups ---------------------------------------------------------------------------
    def _node(self, path: str) -> MemoryFile | _Dir | None:
        node: MemoryFile | _Dir = self.root
        for name in _parts(path):
            if not isinstance(node, _Dir):
                return None
            found = node.entries.get(name)
            if found is None:
                return None
            node = found
        return node

    def _dir(self, path: str) -> _Dir:
        node = self._node(path)
        if node is None:
            raise FileNotFoundError(errno.ENOENT, "no such directory", _norm(path))
        if not isinstance(node, _Dir):
            raise NotADirectoryError(errno.ENOTDIR, "not a directory", _norm(path))
        return node

    # -- FileIO ----------------------------------------------------------------------------
    def open(self, path: str) -> MemoryFileHandle:
        p = _norm(path)
        parent = self._node(os.path.dirname(p))
        name = os.path.basename(p)
        existing = parent.entries.get(name) if isinstance(parent, _Dir) else None
        self._maybe_fail(p, write=existing is None)
        if not isinstance(parent, _Dir):
            raise FileNotFoundError(errno.ENOENT, "no such directory", os.path.dirname(p))
        if isinstance(existing, _Dir):
            raise IsADirectoryError(errno.EISDIR, "is a directory", p)
        file = existing
        if file is None:
            file = parent.entries[name] = MemoryFile()
        return MemoryFileHandle(self, p, file)

    def exists(self, path: str) -> bool:
        return self._node(path) is not None

    def listdir(self, path: str) -> list[str]:
        p = _norm(path)
        self._maybe_fail(p, write=False)
        return sorted(self._dir(p).entries)

    def makedirs(self, path: str, durable: bool = False) -> None:
        """Create `path` and its missing parents; their names become durable with their
        parent's next fsync_dir (or at once with `durable`: a directory that was on the disk
        before the process ran)."""
        p = _norm(path)
        self._maybe_fail(p)
        d = self.root
        walked = ""
        for name in _parts(p):
            walked += "/" + name
            node = d.entries.get(name)
            if node is None:
                node = d.entries[name] = _Dir()
            elif not isinstance(node, _Dir):
                raise FileExistsError(errno.EEXIST, "a file is in the way", walked)
            if durable or d is self.root:
                d.durable[name] = node
            d = node

    def remove(self, path: str) -> None:
        p = _norm(path)
        self._maybe_fail(p)
        parent = self._node(os.path.dirname(p))
        name = os.path.basename(p)
        node = parent.entries.get(name) if isinstance(parent, _Dir) else None
        if node is None or not isinstance(parent, _Dir):
            raise FileNotFoundError(errno.ENOENT, "no such file", p)
        if isinstance(node, _Dir):
            if node.entries:
                raise OSError(errno.ENOTEMPTY, "directory not empty", p)
        # As a file's: durable with the parent's next fsync_dir. Until then a crash brings the
        # directory back with its own durable entries (files removed from it unsynced too).
        del parent.entries[name]

    def rename(self, src: str, dst: str) -> None:
        """Rename a file or a directory (with everything in it), replacing a file or an empty
        directory at `dst`; durable with the fsync_dir of both parents."""
        s, d = _norm(src), _norm(dst)
        self._maybe_fail(s)
        src_parent = self._node(os.path.dirname(s))
        node = (src_parent.entries.get(os.path.basename(s))
                if isinstance(src_parent, _Dir) else None)
        if node is None or not isinstance(src_parent, _Dir):
            raise FileNotFoundError(errno.ENOENT, "no such file", s)
        dst_parent = self._node(os.path.dirname(d))
        if not isinstance(dst_parent, _Dir):
            raise FileNotFoundError(errno.ENOENT, "no such directory", os.path.dirname(d))
        if s == d:
            return
        if isinstance(node, _Dir) and d.startswith(s.rstrip("/") + "/"):
            raise OSError(errno.EINVAL, "cannot move a directory into itself", d)
        target = dst_parent.entries.get(os.path.basename(d))
        if target is not None:
            if isinstance(node, _Dir) and not isinstance(target, _Dir):
                raise NotADirectoryError(errno.ENOTDIR, "not a directory", d)
            if isinstance(target, _Dir):
                if not isinstance(node, _Dir):
                    raise IsADirectoryError(errno.EISDIR, "is a directory", d)
                if target.entries:
                    raise OSError(errno.ENOTEMPTY, "directory not empty", d)
        del src_parent.entries[os.path.basename(s)]
        dst_parent.entries[os.path.basename(d)] = node

    def fsync_dir(self, path: str) -> None:
        p = _norm(path)
        self._maybe_fail(p)
        d = self._dir(p)
        d.durable = dict(d.entries)

    # -- inspection (tests, the simulator's invariant checks) -------------------------------
    def read_file(self, path: str) -> bytes:
        node = self._node(path)
        if not isinstance(node, MemoryFile):
            raise FileNotFoundError(errno.ENOENT, "no such file", _norm(path))
        return bytes(node.data)

    def write_file(self, path: str, data: bytes, durable: bool = True) -> None:
        """Replace a file's content (tests use it to plant corrupt or garbage files); with
        `durable`, the file, its name and its parents' names are on the disk already."""
        p = _norm(path)
        self.makedirs(os.path.dirname(p), durable=durable)
        parent = self._dir(os.path.dirname(p))
        name = os.path.basename(p)
        node = parent.entries.get(name)
        if isinstance(node, _Dir):
            raise IsADirectoryError(errno.EISDIR, "is a directory", p)
        file = node if node is not None else MemoryFile()
        parent.entries[name] = file
        file.data = bytearray(data)
        file.dirty_from = 0
        if durable:
            file.fsync()
            parent.durable[name] = file
