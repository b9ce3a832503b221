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


class FrameError(DecodeError):
    """The size prefix is negative or larger than the limit: the connection must be closed."""


def frame_size_prefix(size: int) -> bytes:
    return _SIZE.pack(size)


class FrameReader:
    """Incremental frame parser for one connection.

    ``feed(data)`` returns the frames (payloads without the size prefix) completed by ``data``.
    Frames cut from an immutable ``bytes`` chunk are zero-copy memoryview slices; only a
    frame that spans chunks is assembled in a buffer. After a :class:`FrameError` the reader
    stays failed (the stream position is lost).
    """

    __slots__ = ("max_frame_bytes", "_pending", "_need", "_failed")

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        if max_frame_bytes <= 0:
            raise ValueError("socket.request.max.bytes must be positive")
        self.max_frame_bytes = max_frame_bytes
        self._pending = bytearray()
        self._need = -1  # payload size of the frame being assembled, -1 while reading a prefix
        self._failed: FrameError | None = None

    @property
    def buffered(self) -> int:
        """Bytes held for an incomplete frame."""
        return len(self._pending)

    def _check(self, size: int) -> int:
        if size < 0 or size > self.max_frame_bytes:
            self._failed = FrameError(
                f"invalid frame size {size} (socket.request.max.bytes={self.max_frame_bytes})"
            )
            self._pending = bytearray()
            raise self._failed
        return size

    def feed(self, data: bytes | bytearray | memoryview) -> list[memoryview]:
        if self._failed is not None:
            raise self._failed
        frames: list[memoryview] = []
        view = memoryview(data).cast("B") if not isinstance(data, bytes) else memoryview(data)
        if not isinstance(data, bytes):
            view = memoryview(bytes(view))  # the caller may reuse its buffer: own the bytes
        pos = 0
        end = len(view)
        pending = self._pending
        if pending or self._need >= 0:
            # finish the frame (or the size prefix) started by an earlier chunk
            if self._need < 0:
                take = min(4 - len(pending), end)
                pending += view[:take]
                pos = take
                if len(pending) < 4:
                    return frames
                self._need = self._check(_SIZE.unpack_from(pending, 0)[0])
                del pending[:]
            take = min(self._need - len(pending), end - pos)
            pending += view[pos : pos + take]
            pos += take
            if len(pending) < self._need:
                return frames
            frames.append(memoryview(bytes(pending)))
            del pending[:]
            self._need = -1
        # whole frames straight out of this chunk
        while end - pos >= 4:
            size = self._check(_SIZE.unpack_from(view, pos)[0])
            if end - pos - 4 < size:
                break
            frames.append(view[pos + 4 : pos + 4 + size])
            pos += 4 + size
        if pos < end:
            rest = view[pos:]
            if len(rest) >= 4:
                self._need = _SIZE.unpack_from(rest, 0)[0]
                pending += rest[4:]
            else:
                pending += rest
        return frames
