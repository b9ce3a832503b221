"""Size-prefixed frames, sans-I/O: bytes in, complete frames out.

A Kafka frame is a big-endian int32 size followed by that many bytes. :class:`FrameReader`
enforces ``socket.request.max.bytes`` from the size prefix alone, so garbage (an HTTP request or
a TLS hello reads as a size of hundreds of MB) is rejected after 4 bytes, never buffered.
"""

from __future__ import annotations

from struct import Struct

from tidelog.protocol.errors import DecodeError

__all__ = ["DEFAULT_MAX_FRAME_BYTES", "FrameError", "FrameReader", "frame_size_prefix"]

# Kafka's default socket.request.max.bytes (100 MiB).
DEFAULT_MAX_FRAME_BYTES = 104857600

_SIZE = Struct(">i")
# get_buffer's buffer between frames (size prefixes, small frames): one read's worth.
_SCRATCH_BYTES = 256 * 1024


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
    """

    __slots__ = ("max_frame_bytes", "_prefix", "_frame", "_fill", "_scratch", "_failed")

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        if max_frame_bytes <= 0:
            raise ValueError("socket.request.max.bytes must be positive")
        self.max_frame_bytes = max_frame_bytes
        self._prefix = bytearray()  # a size prefix cut by a chunk boundary
        self._frame: bytearray | None = None  # the frame being assembled, at its full size
        self._fill = 0  # bytes of it received
        self._scratch: bytearray | None = None  # get_buffer's buffer between frames
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
        else:
            self._frame = bytearray(size)
            self._fill = 0

    def _take(self, view: memoryview, pos: int, frames: list[memoryview]) -> int:
        """Copy what ``view[pos:]`` holds of the frame being assembled; returns the new pos."""
        frame = self._frame
        assert frame is not None
        fill = self._fill
        take = min(len(frame) - fill, len(view) - pos)
        frame[fill : fill + take] = view[pos : pos + take]
        self._fill = fill + take
        if self._fill == len(frame):
            frames.append(memoryview(frame).toreadonly())
            self._frame = None
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
        if pos < end and not isinstance(data, bytes):
            view = memoryview(bytes(view[pos:]))  # the caller may reuse its buffer: own the bytes
            end -= pos
            pos = 0
        # whole frames straight out of this chunk
        while end - pos >= 4:
            size = self._check(_SIZE.unpack_from(view, pos)[0])
            if end - pos - 4 < size:
                self._start(size, frames)
                self._take(view, pos + 4, frames)
                return frames
            frames.append(view[pos + 4 : pos + 4 + size])
            pos += 4 + size
        if pos < end:
            self._prefix += view[pos:]
        return frames

    # -- asyncio.BufferedProtocol ----------------------------------------------------------
    def get_buffer(self) -> memoryview:
        """Where the next socket read goes: the rest of the frame being assembled (the kernel
        copies into it directly), else a scratch buffer."""
        if self._failed is not None:
            raise self._failed
        if self._frame is not None:
            return memoryview(self._frame)[self._fill :]
        if self._scratch is None:
            self._scratch = bytearray(_SCRATCH_BYTES)
        return memoryview(self._scratch)

    def buffer_updated(self, nbytes: int) -> list[memoryview]:
        """``nbytes`` were read into the buffer of the last ``get_buffer``: the completed
        frames."""
        if self._failed is not None:
            raise self._failed
        frame = self._frame
        if frame is not None:
            self._fill += nbytes
            if self._fill < len(frame):
                return []
            self._frame = None
            return [memoryview(frame).toreadonly()]
        assert self._scratch is not None
        return self.feed(memoryview(self._scratch)[:nbytes])
