"""Size-prefixed frames, sans-I/O: bytes in, complete frames out.

A Kafka frame is a big-endian int32 size followed by that many bytes. :class:`FrameReader`
enforces ``socket.request.max.bytes`` from the size prefix alone, so garbage (an HTTP request or
a TLS hello reads as a size of hundreds of MB) is rejected after 4 bytes, never buffered.
"""

from __future__ import annotations

import sys
from struct import Struct

from tidelog.protocol.errors import DecodeError

__all__ = ["DEFAULT_MAX_FRAME_BYTES", "FrameError", "FrameReader", "frame_size_prefix"]

# Kafka's default socket.request.max.bytes (100 MiB).
DEFAULT_MAX_FRAME_BYTES = 104857600

_SIZE = Struct(">i")
# get_buffer's buffer between frames (size prefixes, small frames): one read's worth.
_SCRATCH_BYTES = 256 * 1024
# With ``reuse_buffers``, a frame of at least this size is assembled in the buffer of an earlier
# one that nothing references any more (smaller ones come cheaply from the allocator).
REUSE_MIN_BYTES = 64 * 1024


class FrameError(DecodeError):
    """The size prefix is negative or larger than the limit: the connection must be closed."""


def frame_size_prefix(size: int) -> bytes:
    return _SIZE.pack(size)


class FrameReader:
    """Incremental frame parser for one connection.

    ``feed(data)`` returns the frames (payloads without the size prefix) completed by ``data``.
    Frames cut from an immutable ``bytes`` chunk are zero-copy memoryview slices; a frame that
    spans chunks is assembled in a buffer of its announced size, allocated once its size prefix
    is read (as Kafka's NetworkReceive does; the size is bounded by ``max_frame_bytes``), and
    handed out without another copy. For a ``BufferedProtocol``, ``get_buffer`` /
    ``buffer_updated`` let the socket read straight into that buffer. After a
    :class:`FrameError` the reader stays failed (the stream position is lost).

    ``reuse_buffers``: a large frame (``REUSE_MIN_BYTES``) is assembled in the buffer of the
    last large one when nothing references that buffer any more (no frame, no slice of it is
    alive), instead of a new zero-filled allocation (a follower's 1 MB fetch answers: the
    zero fill, the heap growing and shrinking and the page faults of the first read into fresh
    memory cost more than the kernel's copy into it); whole frames read into the scratch
    buffer are likewise copied into that buffer rather than a fresh one when they are large
    together. The reader then keeps one buffer as large as its largest recent frame (or read):
    for connections with few, large messages (a replica fetcher's answers, a producer's
    requests).
    """

    __slots__ = ("max_frame_bytes", "_prefix", "_frame", "_size", "_fill", "_scratch",
                 "_spare", "_probe", "_reuse", "_failed")

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES, *,
                 reuse_buffers: bool = False) -> None:
        if max_frame_bytes <= 0:
            raise ValueError("socket.request.max.bytes must be positive")
        self.max_frame_bytes = max_frame_bytes
        self._prefix = bytearray()  # a size prefix cut by a chunk boundary
        # The frame being assembled: its buffer (at least its size; larger when reused)
        self._frame: bytearray | None = None
        self._size = 0  # its size
        self._fill = 0  # bytes of it received
        self._scratch: bytearray | None = None  # get_buffer's buffer between frames
        self._spare: bytearray | None = None  # the last large frame's buffer (reuse_buffers)
        # Referenced only by this attribute: the spare's count when nothing else refers to it
        self._probe = bytearray()
        self._reuse = reuse_buffers
        self._failed: FrameError | None = None

    @property
    def buffered(self) -> int:
        """Bytes held for an incomplete frame."""
        return self._fill if self._frame is not None else len(self._prefix)

    def _check(self, size: int) -> int:
        if size < 0 or size > self.max_frame_bytes:
            self._failed = FrameError(
                f"invalid frame size {size} (socket.request.max.bytes={self.max_frame_bytes})"
            )
            self._prefix = bytearray()
            self._frame = None
            raise self._failed
        return size

    def _start(self, size: int, frames: list[memoryview]) -> None:
        """A size prefix was read: an empty frame is complete, else its buffer is allocated."""
        if size == 0:
            frames.append(memoryview(b""))
            return
        if self._reuse and size >= REUSE_MIN_BYTES:
            # 4 bytes more: as the spare, it must also hold the next frame of this size read
            # whole into the scratch buffer (copied with its size prefix, by _own); whether a
            # request comes in one read or several is the kernel's timing
            frame = self._reusable(size) or bytearray(size + _SIZE.size)
        else:
            frame = bytearray(size)
        self._frame = frame
        self._size = size
        self._fill = 0

    def _reusable(self, size: int) -> bytearray | None:
        """The spare buffer if it holds ``size`` bytes and nothing references it: its
        reference count is the probe's, read the same way (any memoryview of it, a frame or
        a records slice, adds one). Not a constant: what getrefcount counts of the caller's
        own references differs between interpreters (3.14 skips some reference count
        changes, so it may report less: a held buffer would look free)."""
        spare = self._spare
        probe = self._probe
        if spare is not None and len(spare) >= size \
                and sys.getrefcount(spare) == sys.getrefcount(probe):
            return spare
        return None

    def release_spare(self) -> None:
        """Let go of the buffer kept for reuse (an idle connection keeps no large buffer)."""
        self._spare = None

    def _own(self, chunk: memoryview) -> memoryview:
        """A copy of ``chunk`` (whole frames in the caller's mutable buffer); with
        ``reuse_buffers`` a large one goes into the spare buffer when it is free (a producer's
        requests read whole into get_buffer's scratch buffer) and else becomes the spare."""
        size = len(chunk)
        if not self._reuse or size < REUSE_MIN_BYTES:
            return memoryview(bytes(chunk))
        buffer = self._reusable(size)
        if buffer is None:
            buffer = self._spare = bytearray(chunk)  # a copy without a zero fill first
        else:
            buffer[:size] = chunk
        return memoryview(buffer)[:size].toreadonly()

    def _complete(self) -> memoryview:
        """The frame assembled: handed out read-only (its buffer kept for reuse)."""
        frame = self._frame
        assert frame is not None
        self._frame = None
        if self._reuse and self._size >= REUSE_MIN_BYTES:
            self._spare = frame
        if len(frame) == self._size:
            return memoryview(frame).toreadonly()
        return memoryview(frame)[: self._size].toreadonly()

    def _take(self, view: memoryview, pos: int, frames: list[memoryview]) -> int:
        """Copy what ``view[pos:]`` holds of the frame being assembled; returns the new pos."""
        frame = self._frame
        assert frame is not None
        fill = self._fill
        take = min(self._size - fill, len(view) - pos)
        frame[fill : fill + take] = view[pos : pos + take]
        self._fill = fill + take
        if self._fill == self._size:
            frames.append(self._complete())
        return pos + take

    def feed(self, data: bytes | bytearray | memoryview) -> list[memoryview]:
        if self._failed is not None:
            raise self._failed
        frames: list[memoryview] = []
        view = memoryview(data).cast("B") if not isinstance(data, bytes) else memoryview(data)
        pos = 0
        end = len(view)
        if self._frame is not None:
            # the rest of a frame started by an earlier chunk (copied: the caller may reuse
            # a mutable buffer)
            pos = self._take(view, pos, frames)
            if self._frame is not None:
                return frames
        elif self._prefix:
            prefix = self._prefix
            take = min(4 - len(prefix), end)
            prefix += view[:take]
            pos = take
            if len(prefix) < 4:
                return frames
            size = self._check(_SIZE.unpack_from(prefix, 0)[0])
            del prefix[:]
            self._start(size, frames)
            if self._frame is not None:
                pos = self._take(view, pos, frames)
                if self._frame is not None:
                    return frames
        # whole frames straight out of this chunk
        if isinstance(data, bytes):
            pos = self._split(view, pos, end, frames)
        elif (whole := self._split(view, pos, end, None)) > pos:
            # the caller may reuse its buffer: own the bytes of its whole frames (a frame it
            # only begins is copied into that frame's own buffer, once)
            self._split(self._own(view[pos:whole]), 0, whole - pos, frames)
            pos = whole
        if end - pos >= 4:  # a frame begun here
            self._start(_SIZE.unpack_from(view, pos)[0], frames)
            self._take(view, pos + 4, frames)
        elif pos < end:
            self._prefix += view[pos:]
        return frames

    def _split(self, view: memoryview, pos: int, end: int,
               frames: list[memoryview] | None) -> int:
        """The end of the whole frames in ``view[pos:end]``, each appended to ``frames``
        (unless None) as a slice of ``view``."""
        while end - pos >= 4:
            size = self._check(_SIZE.unpack_from(view, pos)[0])
            if end - pos - 4 < size:
                break
            if frames is not None:
                frames.append(view[pos + 4 : pos + 4 + size])
            pos += 4 + size
        return pos

    # -- asyncio.BufferedProtocol ----------------------------------------------------------
    def get_buffer(self) -> memoryview:
        """Where the next socket read goes: the rest of the frame being assembled (the kernel
        copies into it directly), else a scratch buffer."""
        if self._failed is not None:
            raise self._failed
        if self._frame is not None:
            return memoryview(self._frame)[self._fill : self._size]
        if self._scratch is None:
            self._scratch = bytearray(_SCRATCH_BYTES)
        return memoryview(self._scratch)

    def buffer_updated(self, nbytes: int) -> list[memoryview]:
        """``nbytes`` were read into the buffer of the last ``get_buffer``: the completed
        frames."""
        if self._failed is not None:
            raise self._failed
        if self._frame is not None:
            self._fill += nbytes
            if self._fill < self._size:
                return []
            return [self._complete()]
        assert self._scratch is not None
        return self.feed(memoryview(self._scratch)[:nbytes])
