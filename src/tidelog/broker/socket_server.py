"""The broker's network layer: Kafka's `SocketServer` on asyncio.

One asyncio task per connection reads size-prefixed frames (`FrameReader`, which enforces
`socket.request.max.bytes` from the size prefix alone) and handles them strictly one after the
other, as Kafka's processor mutes a channel while its request is in flight: a long-polling fetch
holds only its own connection. A response is a list of buffers written with `writelines` (record
data is never joined into a copy) followed by `drain()`, so a slow reader slows down only its
own connection (backpressure).

One exception to the one-at-a-time rule: a handler whose remaining work is only waiting (an
acks=all produce whose append is done and which waits for the ISR) returns a
`DeferredResponse`. The connection then goes on with its next requests while it waits, and a
writer task sends the responses strictly in request order, as Kafka guarantees. Without this a
client that pipelines many small produce requests on one connection (librdkafka at
linger.ms=0) pays one full replication round trip per request, one after the other; with it the
appends of a connection still happen in request order, and the followers pick many of them up
in one fetch. At most `MAX_DEFERRED_RESPONSES` wait per connection; beyond that the connection
stops reading (TCP backpressure) until the oldest is answered. The immediate answers to a read's
consecutive produce requests leave in one write, and a reader with many requests in one read
lets the other connections run every millisecond.

Bad input never takes the broker down: a malformed frame, an unknown API key or an unsupported
version (other than ApiVersions, which gets UNSUPPORTED_VERSION in a v0 body) closes that
connection only. A connection with no request for `connections.max.idle.ms` is closed.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, cast

from tidelog.client.connection import WriteFlowControl
from tidelog.protocol.api_keys import ApiKey, api_spec
from tidelog.protocol.api_versions import unsupported_api_versions_response
from tidelog.protocol.codec import UnsupportedVersionError, decode_request, encode_response
from tidelog.protocol.errors import DecodeError
from tidelog.protocol.framing import FrameError, FrameReader
from tidelog.protocol.headers import RequestHeader
from tidelog.storage.file_io import FileSlice

__all__ = ["MAX_DEFERRED_RESPONSES", "SENDFILE_MIN_BYTES", "CloseConnection",
           "DeferredResponse", "RequestContext", "SocketServer"]

logger = logging.getLogger(__name__)

_READ_CHUNK = 256 * 1024

# The longest a connection's reader handles frames of one read before it lets others run.
_TURN_S = 0.001

# What a read's list of frames holds in place of one handled (which must not stay referenced).
_HANDLED = memoryview(b"")

# Responses a connection may owe while it goes on reading requests: a memory bound (an owed
# response holds its request's partition list and results, not its records, which are in the
# log by then). A replication round trip stalled for 100 ms at 10,000 requests/s on one
# connection owes about this many.
MAX_DEFERRED_RESPONSES = 1000

# A partition's fetched records of at least this many bytes leave by sendfile from the segment
# file (a FileSlice); smaller ones are copied. A slice costs ~30 µs more per answer (its own
# descriptor, the header walk, three sends instead of one); copying costs ~0.2 µs per KiB:
# bench/zero_copy.py --threshold-only put the break-even between 128 and 256 KiB.
SENDFILE_MIN_BYTES = 256 * 1024


class CloseConnection(Exception):  # noqa: N818 - Kafka's "close the channel" action
    """Raised by a handler: close this connection without answering (Kafka does this for
    unsupported versions, and for a failed acks=0 produce so the client notices)."""


@dataclass(slots=True)
class RequestContext:
    """What a handler knows about the request besides its body."""

    header: RequestHeader
    client_host: str
    client_port: int
    connection_id: int
    listener_name: str = "PLAINTEXT"

    @property
    def api_version(self) -> int:
        return self.header.request_api_version


@dataclass(slots=True)
class DeferredResponse:
    """A handler's answer when everything that must happen in request order is done and only
    waiting remains: once ``result`` is done, ``respond(result)`` gives the response dataclass
    (or None for no response, or raises `CloseConnection`)."""

    result: asyncio.Future[Any]
    respond: Callable[[Any], Any]


# A handler returns the response dataclass, None for "no response" (Produce with acks=0), or a
# DeferredResponse.
Handler = Callable[[RequestContext, Any], Awaitable[Any]]


class _Owed:
    """One owed response: encoded buffers, or a deferred one with its request header."""

    __slots__ = ("header", "deferred", "buffers")

    def __init__(self, header: RequestHeader | None, deferred: DeferredResponse | None,
                 buffers: list[Any] | None) -> None:
        self.header = header
        self.deferred = deferred
        self.buffers = buffers

    @property
    def ready(self) -> bool:
        return self.deferred is None or self.deferred.result.done()

    def encode(self) -> list[Any]:
        """The buffers to send (none for "no response"); may raise `CloseConnection`."""
        if self.deferred is None:
            assert self.buffers is not None
            return self.buffers
        assert self.header is not None
        response = self.deferred.respond(self.deferred.result.result())
        return [] if response is None else _encode(self.header, response)


class _ResponseQueue:
    """The responses one connection owes, in request order.

    While the queue is not empty every response goes through it (a quick answer must not
    overtake a deferred one); when it is empty the server writes directly. The responses that
    are ready together leave in one write (one acks=all HW advance answers many requests).
    The head's future wakes the queue by a done callback that writes at once, in the turn
    the future completes (no task and no extra turn per acks=all request); a writer task
    takes over only when the write must wait (the connection's writes are paused, a file
    slice, a closing transport) and hands back once the queue is empty."""

    __slots__ = ("_entries", "_writer", "_protocol", "_task", "_armed", "_space", "_empty",
                 "failed", "on_idle")

    def __init__(self, writer: asyncio.StreamWriter, protocol: _Connection,
                 on_idle: Callable[[], None]) -> None:
        self._entries: collections.deque[_Owed] = collections.deque()
        self._writer = writer
        self._protocol = protocol
        self._task: asyncio.Task[None] | None = None
        self._armed: asyncio.Future[Any] | None = None  # the future our callback is on
        self._space: asyncio.Event | None = None
        self._empty: asyncio.Future[None] | None = None  # finish() waits on it
        self.failed = False  # the connection must close (write error, CloseConnection)
        self.on_idle = on_idle

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, entry: _Owed) -> None:
        self._entries.append(entry)
        if len(self._entries) == 1 and self._task is None:
            self._arm()

    def _arm(self) -> None:
        """Wake up when the head is ready: its future's callback, or the next turn."""
        head = self._entries[0]
        if head.ready:
            self._protocol._loop.call_soon(self._on_ready)
        else:
            assert head.deferred is not None
            self._armed = head.deferred.result
            self._armed.add_done_callback(self._on_ready)

    def _take_ready(self) -> tuple[list[Any], int, CloseConnection | None]:
        """The buffers of the ready entries at the front, how many, and a `CloseConnection`
        one of them raised (it and the entries after it are not taken)."""
        entries = self._entries
        buffers: list[Any] = []
        taken = 0
        while taken < len(entries) and entries[taken].ready:
            try:
                buffers += entries[taken].encode()
            except CloseConnection as e:
                return buffers, taken, e
            taken += 1
        return buffers, taken, None

    def _on_ready(self, _: Any = None) -> None:
        self._armed = None
        if self.failed or self._task is not None or not self._entries:
            return
        try:
            buffers, taken, close = self._take_ready()
        except asyncio.CancelledError:  # the replica manager shut down under the request
            self._fail()
            return
        except Exception:
            logger.exception("answering a deferred request failed")
            self._fail()
            return
        transport = self._writer.transport
        if (self._protocol.paused or transport.is_closing()
                or any(type(b) is FileSlice for b in buffers)):
            # This write must wait: a task does it (buffers encoded once, taken over as is).
            self._task = self._protocol._loop.create_task(self._run((buffers, taken, close)))
            return
        if buffers:
            self._writer.writelines(buffers)
        self._written(taken, close)
        if self._entries and not self.failed:
            self._arm()

    def _written(self, taken: int, close: CloseConnection | None) -> None:
        for _ in range(taken):
            self._entries.popleft()
        if close is not None:
            logger.info("closing connection: %s", close)
            self._fail()
            return
        if self._space is not None:
            self._space.set()
        if not self._entries:
            self._emptied()
            self.on_idle()

    def _emptied(self) -> None:
        if self._empty is not None and not self._empty.done():
            self._empty.set_result(None)

    async def wait_for_space(self, limit: int) -> None:
        while len(self._entries) >= limit and not self.failed:
            self._space = asyncio.Event()
            await self._space.wait()

    async def _run(self, first: tuple[list[Any], int, CloseConnection | None]) -> None:
        entries = self._entries
        try:
            buffers, taken, close = first
            while True:
                if buffers:
                    await SocketServer._write(self._writer, buffers)
                # Popped only once written: while this write is in flight (a sendfile may
                # take many turns) the queue is not empty, so the server's next answer
                # queues behind it instead of writing into the middle of it.
                self._written(taken, close)
                if not entries or self.failed:
                    return
                head = entries[0]
                if head.deferred is not None and not head.deferred.result.done():
                    # (cancelling this task, when the connection ends, cancels this future
                    # too: its owner, the replica manager, drops a cancelled future)
                    with contextlib.suppress(Exception):  # its outcome is read just below
                        await head.deferred.result
                buffers, taken, close = self._take_ready()
        except asyncio.CancelledError:
            self._fail()
            raise
        except (ConnectionError, OSError):
            self._fail()
        except Exception:
            logger.exception("answering a deferred request failed")
            self._fail()
        finally:
            self._task = None

    def _fail(self) -> None:
        self.failed = True
        self._entries.clear()
        if self._space is not None:
            self._space.set()
        self._emptied()
        self._writer.close()  # the reader sees EOF and the connection ends

    async def finish(self) -> None:
        """Wait until every owed response is written (or the connection failed)."""
        if self._entries and not self.failed:
            if self._empty is None or self._empty.done():
                self._empty = asyncio.get_running_loop().create_future()
            with contextlib.suppress(BaseException):
                await asyncio.shield(self._empty)
        task = self._task
        if task is not None:
            with contextlib.suppress(BaseException):
                await asyncio.shield(task)

    def cancel(self) -> None:
        """The connection ended: nothing more is written."""
        self.failed = True
        if self._task is not None:
            self._task.cancel()
        elif self._armed is not None:
            # As the writer task's cancellation did: the awaited future goes with it (its
            # owner, the replica manager, drops a cancelled future).
            armed, self._armed = self._armed, None
            armed.remove_done_callback(self._on_ready)
            armed.cancel()


class _Connection(WriteFlowControl, asyncio.BufferedProtocol):
    """One client connection's protocol. Reads go straight into the frame being assembled
    (`FrameReader.get_buffer`: a 1 MB produce request is copied once, by the kernel, where
    asyncio's StreamReader copied it three times more), on asyncio and on uvloop alike: the
    write flow control `StreamWriter.drain` needs is here rather than inherited from
    asyncio's FlowControlMixin, which is a plain Protocol, and uvloop hands a plain Protocol
    bytes (two copies of a large frame). Complete frames wait for the connection's serving
    task, and reading pauses while more than twice `_READ_CHUNK` of them wait (the
    StreamReader limit this replaces). Writes go through a `StreamWriter` on it.

    A large request frame (a producer's batches) is assembled in the buffer of the last one
    once nothing references that buffer (`FrameReader`'s ``reuse_buffers``): no zero-filled
    allocation and first-touch page faults per produce request. A request whose records are
    still held (a delayed produce, an appended batch kept as a view) keeps its buffer alive, so
    the next frame gets a fresh one. The connection keeps one buffer as large as its largest
    recent request (above 64 KiB) while it is busy; the idle reaper takes it from a connection
    with no request for one of its rounds (memory bounded by the connections in use)."""

    def __init__(self, server: SocketServer, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._loop = loop
        self._server = server
        self._frames = FrameReader(server.max_request_bytes, reuse_buffers=True)
        self._ready: list[memoryview] = []
        self._ready_bytes = 0
        self._eof = False
        self._error: FrameError | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._transport: asyncio.Transport | None = None
        self._reading_paused = False
        self._lost = False
        self._closed: asyncio.Future[None] = loop.create_future()
        self._task: asyncio.Task[None] | None = None  # the serving task (_on_connection)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (uvloop's transports are not asyncio.Transport subclasses: no isinstance check)
        self._transport = cast(asyncio.Transport, transport)
        writer = asyncio.StreamWriter(self._transport, self, None, self._loop)
        self._task = self._loop.create_task(self._server._on_connection(self, writer))

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._error is not None:  # the stream position is lost: discard until closed
            return memoryview(bytearray(65536))
        return self._frames.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        if self._error is not None:
            return
        try:
            frames = self._frames.buffer_updated(nbytes)
        except FrameError as e:
            self._error = e
            self._wake()
            return
        if frames:
            self._ready += frames
            self._ready_bytes += sum(len(f) for f in frames)
            if self._ready_bytes > 2 * _READ_CHUNK and not self._reading_paused:
                assert self._transport is not None
                self._reading_paused = True
                self._transport.pause_reading()
            self._wake()

    def eof_received(self) -> bool:
        self._eof = True
        self._wake()
        return True  # keep the transport open: the client is still owed its answers

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._wake_writers(exc)
        self._eof = True
        self._wake()
        if not self._closed.done():
            self._closed.set_result(None)

    def _get_close_waiter(self, stream: asyncio.StreamWriter) -> asyncio.Future[None]:
        return self._closed  # StreamWriter.wait_closed

    async def _drain_helper(self) -> None:  # StreamWriter.drain (FlowControlMixin's contract)
        if self._lost:
            raise ConnectionResetError("Connection lost")
        await self.wait_writable()

    def release_spare(self) -> None:
        """Idle: let go of the request buffer kept for reuse."""
        self._frames.release_spare()

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def read_frames(self) -> list[memoryview]:
        """The frames received since the last call, waiting for one; [] at the end of the
        stream; raises `FrameError` (after the frames before the bad one)."""
        while not self._ready and not self._eof and self._error is None:
            self._waiter = self._loop.create_future()
            await self._waiter
        if self._ready:
            frames, self._ready, self._ready_bytes = self._ready, [], 0
            if self._reading_paused and self._transport is not None:
                self._reading_paused = False
                self._transport.resume_reading()
            return frames
        if self._error is not None:
            raise self._error
        return []


def _encode(header: RequestHeader, response: Any) -> list[Any]:
    version = header.request_api_version
    spec = api_spec(header.request_api_key)
    return encode_response(spec.response_header_version(version), header.correlation_id,
                           response, version)


class SocketServer:
    """Listens on one (host, port); ``handler(context, request)`` answers decoded requests."""

    def __init__(
        self,
        host: str,
        port: int,
        handler: Handler,
        *,
        max_request_bytes: int = 104857600,
        connections_max_idle_ms: int = 600_000,
        max_connections: int = 2**31 - 1,
        max_connections_per_ip: int = 2**31 - 1,
        send_buffer_bytes: int = -1,
        receive_buffer_bytes: int = -1,
        listener_name: str = "PLAINTEXT",
    ) -> None:
        self.listener_name = listener_name
        self.host = host
        self.port = port
        self.handler = handler
        self.max_request_bytes = max_request_bytes
        self.connections_max_idle_ms = connections_max_idle_ms
        self.max_connections = max_connections
        self.max_connections_per_ip = max_connections_per_ip
        self._per_ip: dict[str, int] = {}
        self.send_buffer_bytes = send_buffer_bytes
        self.receive_buffer_bytes = receive_buffer_bytes
        self._server: asyncio.base_events.Server | None = None
        self._connections: dict[int, asyncio.Task[None]] = {}
        self._writers: dict[int, asyncio.StreamWriter] = {}
        # conn id -> monotonic time of its last request (None while a request is in flight)
        self._last_active: dict[int, float | None] = {}
        self._reaper: asyncio.Task[None] | None = None
        self._next_id = 0
        self.bound_port: int | None = None
        self.closed_by_error = 0  # connections closed because of bad input (for tests/metrics)

    # ------------------------------------------------------------------ life cycle
    async def start(self) -> int:
        """Bind and start accepting; returns the bound port (useful with port 0)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Connection(self, loop), self.host or None, self.port, reuse_address=True)
        sockets = self._server.sockets or []
        if not sockets:
            raise OSError(f"could not bind {self.host}:{self.port}")
        self.bound_port = int(sockets[0].getsockname()[1])
        self._reaper = asyncio.get_running_loop().create_task(self._reap_idle())
        return self.bound_port

    async def _reap_idle(self) -> None:
        """Kafka's idle-connection reaping: close connections with no request for
        `connections.max.idle.ms` (never one whose request is still being handled); and a
        connection idle for one round lets go of the request buffer it keeps for reuse."""
        reap = self.connections_max_idle_ms > 0
        idle_s = self.connections_max_idle_ms / 1000
        interval = min(max(idle_s / 4, 0.02), 30.0) if reap else 30.0
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            for conn_id, last in list(self._last_active.items()):
                if last is None or now - last < interval:
                    continue
                writer = self._writers.get(conn_id)
                if reap and now - last >= idle_s:
                    logger.debug("closing idle connection %d", conn_id)
                    self._last_active.pop(conn_id, None)
                    if writer is not None:
                        writer.close()
                elif writer is not None:
                    conn = writer.transport.get_protocol()
                    if isinstance(conn, _Connection):
                        conn.release_spare()

    def stop_accepting(self) -> None:
        if self._server is not None:
            self._server.close()
        if self._reaper is not None:
            self._reaper.cancel()

    async def shutdown(self, grace_s: float = 1.0) -> None:
        """Stop accepting, then close every connection (in-flight requests get `grace_s`)."""
        self.stop_accepting()
        for conn_id, last in list(self._last_active.items()):
            if last is not None:  # idle: nothing to finish
                writer = self._writers.get(conn_id)
                if writer is not None:
                    writer.close()
        tasks = list(self._connections.values())
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=grace_s)
            for t in pending:
                t.cancel()
            for t in pending:
                with contextlib.suppress(BaseException):
                    await t
        for w in list(self._writers.values()):
            w.close()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), timeout=grace_s)

    @property
    def connection_count(self) -> int:
        return len(self._connections)

    # ------------------------------------------------------------------ connections
    async def _on_connection(self, reader: _Connection, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername") or ("?", 0)
        ip = str(peer[0])
        if (len(self._connections) >= self.max_connections
                or self._per_ip.get(ip, 0) >= self.max_connections_per_ip):
            logger.info("refusing a connection from %s: connection limit reached", ip)
            writer.close()
            return
        self._per_ip[ip] = self._per_ip.get(ip, 0) + 1
        self._next_id += 1
        conn_id = self._next_id
        task = asyncio.current_task()
        assert task is not None
        self._connections[conn_id] = task
        self._writers[conn_id] = writer
        self._last_active[conn_id] = time.monotonic()
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if self.send_buffer_bytes > 0:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.send_buffer_bytes)
                if self.receive_buffer_bytes > 0:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.receive_buffer_bytes)
        try:
            await self._serve(conn_id, reader, writer, str(peer[0]), int(peer[1]))
        except (ConnectionError, asyncio.IncompleteReadError, OSError):
            pass  # the client went away
        except asyncio.CancelledError:
            pass
        except Exception:
            logger.exception("connection %d from %s failed", conn_id, peer)
        finally:
            self._connections.pop(conn_id, None)
            self._writers.pop(conn_id, None)
            self._last_active.pop(conn_id, None)
            left = self._per_ip.get(ip, 1) - 1
            if left > 0:
                self._per_ip[ip] = left
            else:
                self._per_ip.pop(ip, None)
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), timeout=1.0)

    async def _serve(
        self,
        conn_id: int,
        reader: _Connection,
        writer: asyncio.StreamWriter,
        host: str,
        port: int,
    ) -> None:
        handling = [False]  # a request is being handled (its handler may be awaiting)

        def idle() -> None:
            if conn_id in self._last_active and not handling[0]:
                self._last_active[conn_id] = time.monotonic()

        owed = _ResponseQueue(writer, reader, idle)
        # Answers to this read's consecutive produce requests (which never wait inside their
        # handler), written together: one send instead of one per request.
        corked: list[Any] = []

        async def flush() -> None:
            if corked and not owed.failed:
                buffers = corked[:]
                corked.clear()
                await self._write(writer, buffers)

        try:
            while True:
                try:
                    batch = await reader.read_frames()
                except FrameError as e:
                    self.closed_by_error += 1
                    logger.warning("closing connection from %s:%d: %s", host, port, e)
                    return
                if not batch or owed.failed:
                    # The client sent all it will: answer what it is still owed, then close.
                    await owed.finish()
                    return
                turn_start = time.perf_counter()
                for i, frame in enumerate(batch):
                    produce = len(frame) >= 2 and frame[0] == 0 and frame[1] == 0  # api key 0
                    if not produce:
                        await flush()  # this handler may wait (a long-polling fetch)
                    if conn_id in self._last_active:
                        self._last_active[conn_id] = None  # busy: not idle
                    handling[0] = True
                    ok = await self._handle_frame(conn_id, frame, writer, owed, host, port,
                                                  corked if produce else None)
                    handling[0] = False
                    # Nothing holds a handled frame while others run (a turn's flush, the wait
                    # for space): its buffer is then free for the next requests (reuse_buffers).
                    batch[i] = _HANDLED
                    del frame
                    if not ok or owed.failed:
                        await flush()  # the answers before the one that closes
                        self.closed_by_error += 1
                        return
                    if len(owed) >= MAX_DEFERRED_RESPONSES:
                        await owed.wait_for_space(MAX_DEFERRED_RESPONSES)
                    elif not owed and not corked:
                        idle()
                    if time.perf_counter() - turn_start >= _TURN_S:
                        # Many pipelined requests in one read: let the other connections (the
                        # followers' fetches that replicate these appends) have a turn.
                        await flush()
                        await asyncio.sleep(0)
                        turn_start = time.perf_counter()
                await flush()
                if not owed:
                    idle()
        finally:
            owed.cancel()

    async def _handle_frame(
        self,
        conn_id: int,
        frame: memoryview,
        writer: asyncio.StreamWriter,
        owed: _ResponseQueue,
        host: str,
        port: int,
        corked: list[Any] | None = None,
    ) -> bool:
        """Handle one request; False means: close the connection. With ``corked``, an
        immediate answer is added to it instead of being written."""
        try:
            header, body = decode_request(frame)
        except UnsupportedVersionError as e:
            if e.api_key == ApiKey.API_VERSIONS:
                # KIP-511: answer in a v0 body (header v0) so the client can retry lower.
                buffers = encode_response(
                    0, e.correlation_id, unsupported_api_versions_response(), 0)
                if owed:
                    owed.put(_Owed(None, None, buffers))
                else:
                    await self._write(writer, buffers)
                return True
            logger.warning("closing connection from %s:%d: %s", host, port, e)
            return False
        except DecodeError as e:
            logger.warning("closing connection from %s:%d: malformed request: %s", host, port, e)
            return False
        except Exception as e:  # a codec bug must not take the broker down
            logger.warning("closing connection from %s:%d: undecodable request: %r", host, port, e)
            return False
        ctx = RequestContext(header, host, port, conn_id, self.listener_name)
        try:
            response = await self.handler(ctx, body)
        except CloseConnection as e:
            logger.info("closing connection from %s:%d: %s", host, port, e)
            return False
        if isinstance(response, DeferredResponse):
            if corked:  # the answers before this one leave first
                owed.put(_Owed(None, None, corked[:]))
                corked.clear()
            owed.put(_Owed(header, response, None))
        elif owed:
            # An earlier response is still owed: this one must not overtake it.
            if response is not None:
                owed.put(_Owed(None, None, _encode(header, response)))
        elif response is not None:
            if corked is not None:
                corked += _encode(header, response)
            else:
                await self._write(writer, _encode(header, response))
        return True

    @staticmethod
    async def _write(writer: asyncio.StreamWriter, buffers: list[Any]) -> None:
        for buffer in buffers:
            if type(buffer) is FileSlice:
                await _write_with_slices(writer, buffers)
                return
        writer.writelines(buffers)
        await writer.drain()


async def _write_with_slices(writer: asyncio.StreamWriter, buffers: list[Any]) -> None:
    """Write a response holding file slices (fetched records): the buffers before a slice go
    through the transport, which is then flushed empty, and the slice follows with sendfile on
    the socket, so the bytes keep their order (nothing else writes to the connection
    meanwhile: the server writes one response at a time). Kafka's network layer does the same
    with FileRecords.writeTo / FileChannel.transferTo. asyncio's loop.sendfile is not used: the
    broker runs on uvloop, which does not implement it."""
    run: list[Any] = []
    try:
        for buffer in buffers:
            if type(buffer) is not FileSlice:
                run.append(buffer)
                continue
            if run:
                writer.writelines(run)
                run = []
            await _send_slice(writer, buffer)
        if run:
            writer.writelines(run)
        await writer.drain()
    finally:
        for buffer in buffers:
            if type(buffer) is FileSlice:
                buffer.close()


async def _send_slice(writer: asyncio.StreamWriter, piece: FileSlice) -> None:
    transport = writer.transport
    sock = transport.get_extra_info("socket")
    if sock is None or transport.get_extra_info("sslcontext") is not None:
        writer.write(piece.read())  # no sendfile through TLS or a non-socket transport: a copy
        return
    await _flush(writer)
    fd = sock.fileno()
    position, end = piece.position, piece.position + piece.length
    poll_fd = -1
    try:
        while position < end:
            if transport.is_closing():
                raise ConnectionResetError("connection closed while sending a response")
            try:
                sent = os.sendfile(fd, piece.fileno(), position, end - position)
            except (BlockingIOError, InterruptedError):
                # A partial send: wait until the socket is writable. The loop refuses a
                # writer callback on the transport's own descriptor, so poll a duplicate.
                if poll_fd < 0:
                    poll_fd = os.dup(fd)
                await _writable(poll_fd)
                continue
            if sent == 0:
                # The segment file was truncated under the slice (Kafka's "Size of
                # FileRecords has been truncated during write"): the frame is cut short and
                # no other bytes may take its place, so the connection must go.
                raise ConnectionResetError(
                    f"segment file truncated while sending a response "
                    f"({position - piece.position} of {piece.length} bytes)")
            position += sent
    finally:
        if poll_fd >= 0:
            os.close(poll_fd)


async def _flush(writer: asyncio.StreamWriter) -> None:
    """Until the transport's buffer is empty (drain alone stops at the low-water mark)."""
    transport = writer.transport
    if not transport.get_write_buffer_size():
        return
    low, high = transport.get_write_buffer_limits()
    transport.set_write_buffer_limits(high=0, low=0)
    try:
        await writer.drain()
    finally:
        transport.set_write_buffer_limits(high=high, low=low)


async def _writable(fd: int) -> None:
    loop = asyncio.get_running_loop()
    ready = loop.create_future()
    loop.add_writer(fd, lambda: ready.done() or ready.set_result(None))
    try:
        await ready
    finally:
        loop.remove_writer(fd)
