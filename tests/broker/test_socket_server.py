"""The network layer: bad input closes only the offending connection, limits are enforced from
the size prefix, responses keep request order, idle connections are reaped, and ApiVersions /
Produce version edge cases are answered as Kafka answers them."""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from typing import Any

import pytest
from harness import BrokerThread, fetch, produce_request, send

from tidelog.broker import socket_server
from tidelog.broker.socket_server import (
    CloseConnection,
    DeferredResponse,
    RequestContext,
    SocketServer,
)
from tidelog.client.connection import BrokerConnection
from tidelog.cluster.zookeeper import pick_free_port
from tidelog.protocol.api_keys import ApiKey
from tidelog.protocol.codec import decode_response, encode_request
from tidelog.protocol.errors import ErrorCode
from tidelog.protocol.framing import FrameReader
from tidelog.protocol.messages.api_versions import ApiVersionsRequest, ApiVersionsResponse
from tidelog.protocol.messages.metadata import MetadataRequest
from tidelog.protocol.records.batch import iter_batches
from tidelog.protocol.records.builder import build_values
from tidelog.protocol.records.decoder import decode_records

pytestmark = pytest.mark.integration


def _connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.settimeout(10)
    return s


def _frame(request: Any, version: int, corr: int) -> bytes:
    return b"".join(bytes(b) for b in encode_request(request, version, corr))


def _read_frame(s: socket.socket) -> bytes:
    def exact(n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = s.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("closed")
            buf += chunk
        return buf
    size = struct.unpack(">i", exact(4))[0]
    return exact(size)


def _is_closed(s: socket.socket, timeout: float = 5.0) -> bool:
    s.settimeout(timeout)
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def _api_versions_ok(port: int) -> bool:
    resp = send(port, ApiVersionsRequest())
    return resp.error_code == 0 and any(k.api_key == ApiKey.PRODUCE for k in resp.api_keys)


def test_garbage_closes_only_that_connection(one_broker: BrokerThread) -> None:
    good = _connect(one_broker.port)
    bad = _connect(one_broker.port)
    try:
        bad.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")  # reads as a ~1.2 GB frame size
        assert _is_closed(bad)
        good.sendall(_frame(ApiVersionsRequest(), 0, 7))
        _, resp = decode_response(ApiKey.API_VERSIONS, 0, _read_frame(good))
        assert resp.error_code == 0
    finally:
        good.close()
        bad.close()
    assert _api_versions_ok(one_broker.port)


@pytest.mark.parametrize("payload", [
    struct.pack(">hhi", 3, 5, 1) + b"\xff\xff",  # Metadata v5 with a truncated header/body
    struct.pack(">hhi", 999, 0, 1) + b"\x00\x00",  # unknown api key
    struct.pack(">hhi", ApiKey.FETCH, 3, 1) + b"\x00" * 40,  # Fetch v3: below the served range
    b"\x00\x01",  # shorter than any header
])
def test_malformed_or_unserved_requests_close_the_connection(one_broker: BrokerThread, payload: bytes) -> None:
    s = _connect(one_broker.port)
    try:
        s.sendall(struct.pack(">i", len(payload)) + payload)
        assert _is_closed(s)
    finally:
        s.close()
    assert _api_versions_ok(one_broker.port)


def test_negative_frame_size_closes(one_broker: BrokerThread) -> None:
    s = _connect(one_broker.port)
    try:
        s.sendall(struct.pack(">i", -5))
        assert _is_closed(s)
    finally:
        s.close()


def test_unsupported_api_versions_version_gets_a_v0_answer(one_broker: BrokerThread) -> None:
    s = _connect(one_broker.port)
    try:
        # ApiVersions v99: header v1 (key, version, correlation id, client id), empty body.
        body = struct.pack(">hhih", ApiKey.API_VERSIONS, 99, 42, -1)
        s.sendall(struct.pack(">i", len(body)) + body)
        header, resp = decode_response(ApiKey.API_VERSIONS, 0, _read_frame(s))
        assert header.correlation_id == 42
        assert isinstance(resp, ApiVersionsResponse)
        assert resp.error_code == ErrorCode.UNSUPPORTED_VERSION
        assert [(k.api_key, k.min_version) for k in resp.api_keys] == [(ApiKey.API_VERSIONS, 0)]
        # The connection stays usable: the client retries at a version the broker knows.
        s.sendall(_frame(ApiVersionsRequest(), 3, 43))
        _, resp = decode_response(ApiKey.API_VERSIONS, 3, _read_frame(s))
        assert resp.error_code == 0
    finally:
        s.close()


def test_produce_v2_is_advertised_but_refused(one_broker: BrokerThread) -> None:
    resp = send(one_broker.port, ApiVersionsRequest())
    produce_range = next((k.min_version, k.max_version) for k in resp.api_keys if k.api_key == ApiKey.PRODUCE)
    assert produce_range[0] == 0
    s = _connect(one_broker.port)
    try:
        req = produce_request("anything", 0, build_values([b"x"]), acks=1)
        s.sendall(_frame(req, 2, 5))
        _, resp = decode_response(ApiKey.PRODUCE, 2, _read_frame(s))
        assert resp.responses[0].partition_responses[0].error_code == ErrorCode.UNSUPPORTED_VERSION
    finally:
        s.close()


def test_responses_keep_request_order_behind_a_long_poll(one_broker: BrokerThread, controller: Any) -> None:
    from harness import fetch_request

    controller.create_topic("order", {0: [1]})
    s = _connect(one_broker.port)
    try:
        # A fetch that parks for 400 ms, pipelined with a Metadata request on the same
        # connection: Kafka answers one request per connection at a time, in order.
        start = time.monotonic()
        s.sendall(_frame(fetch_request("order", 0, 0, max_wait_ms=400, min_bytes=1), 11, 1)
                  + _frame(MetadataRequest(topics=[]), 9, 2))
        first = _read_frame(s)
        second = _read_frame(s)
        elapsed = time.monotonic() - start
        assert struct.unpack_from(">i", first)[0] == 1
        assert struct.unpack_from(">i", second)[0] == 2
        _, fetched = decode_response(ApiKey.FETCH, 11, first)
        assert fetched.responses[0].partitions[0].error_code == 0
        assert elapsed >= 0.35  # the long poll really waited (no data arrived)
    finally:
        s.close()


# ---------------------------------------------------------------- SocketServer alone


class _Echo:
    """A handler standing in for KafkaApis (the boundary this test is not about)."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    async def __call__(self, ctx: RequestContext, request: Any) -> Any:
        self.seen.append(ctx.header.correlation_id)
        return ApiVersionsResponse(error_code=0)


def _run_server(coro_fn: Any) -> Any:
    async def main() -> Any:
        return await coro_fn()
    return asyncio.run(main())


def test_request_size_limit_is_enforced_from_the_size_prefix() -> None:
    async def scenario() -> tuple[bool, bool]:
        handler = _Echo()
        server = SocketServer("127.0.0.1", 0, handler, max_request_bytes=64)
        port = await server.start()
        try:
            ok_frame = _frame(ApiVersionsRequest(), 0, 1)
            assert len(ok_frame) - 4 <= 64
            r, w = await asyncio.open_connection("127.0.0.1", port)
            w.write(ok_frame)
            await w.drain()
            size = struct.unpack(">i", await r.readexactly(4))[0]
            await r.readexactly(size)
            # 65 bytes declared: refused before any of the payload is buffered.
            w.write(struct.pack(">i", 65))
            await w.drain()
            closed = await asyncio.wait_for(r.read(1), 5) == b""
            w.close()
            return handler.seen == [1], closed
        finally:
            await server.shutdown()

    assert _run_server(scenario) == (True, True)


def test_idle_connections_are_reaped() -> None:
    async def scenario() -> tuple[bool, float]:
        server = SocketServer("127.0.0.1", 0, _Echo(), connections_max_idle_ms=200)
        port = await server.start()
        try:
            r, w = await asyncio.open_connection("127.0.0.1", port)
            start = time.monotonic()
            closed = await asyncio.wait_for(r.read(1), 5) == b""
            w.close()
            return closed, time.monotonic() - start
        finally:
            await server.shutdown()

    closed, after = _run_server(scenario)
    assert closed and after >= 0.15


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_slow_reader_does_not_block_other_connections(
        loop: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Backpressure is per connection: a client that never reads its (large) responses stalls
    only itself (the loop pauses that connection's writes), while another connection is
    served."""
    paused: list[bool] = []
    pause_writing = socket_server._Connection.pause_writing

    def spy(self: Any) -> None:
        paused.append(True)
        pause_writing(self)

    monkeypatch.setattr(socket_server._Connection, "pause_writing", spy)

    class Big:
        async def __call__(self, ctx: RequestContext, request: Any) -> Any:
            from tidelog.protocol.api_versions import api_versions_response
            return api_versions_response()

    async def scenario() -> bool:
        server = SocketServer("127.0.0.1", 0, Big())
        port = await server.start()
        try:
            r1, w1 = await asyncio.open_connection("127.0.0.1", port)
            frame = _frame(ApiVersionsRequest(), 0, 1)
            w1.write(frame * 20000)  # ~20000 responses nobody reads
            await w1.drain()
            r2, w2 = await asyncio.open_connection("127.0.0.1", port)
            w2.write(_frame(ApiVersionsRequest(), 0, 9))
            await w2.drain()
            size = struct.unpack(">i", await asyncio.wait_for(r2.readexactly(4), 5))[0]
            data = await r2.readexactly(size)
            for _ in range(500):  # the first connection's answers fill its socket buffers
                if paused:
                    break
                await asyncio.sleep(0.01)
            w1.close()
            w2.close()
            return struct.unpack_from(">i", data)[0] == 9 and bool(paused)
        finally:
            await server.shutdown(grace_s=0.2)

    if loop == "uvloop":
        assert pytest.importorskip("uvloop").run(scenario())
    else:
        assert _run_server(scenario)


def test_connection_limit_per_ip() -> None:
    async def scenario() -> tuple[bool, bool]:
        server = SocketServer("127.0.0.1", 0, _Echo(), max_connections_per_ip=1)
        port = await server.start()
        try:
            r1, w1 = await asyncio.open_connection("127.0.0.1", port)
            async with asyncio.timeout(5):
                while server.connection_count < 1:  # the first one is counted
                    await asyncio.sleep(0.01)
            r2, w2 = await asyncio.open_connection("127.0.0.1", port)
            refused = await asyncio.wait_for(r2.read(1), 5) == b""
            w1.write(_frame(ApiVersionsRequest(), 0, 3))
            await w1.drain()
            size = struct.unpack(">i", await asyncio.wait_for(r1.readexactly(4), 5))[0]
            first_ok = struct.unpack_from(">i", await r1.readexactly(size))[0] == 3
            w1.close()
            w2.close()
            return refused, first_ok
        finally:
            await server.shutdown()

    assert _run_server(scenario) == (True, True)


class _Deferring:
    """Defers the answer to every request whose correlation id is in ``deferred`` until the
    test resolves its future; answers the others at once."""

    def __init__(self, deferred: set[int]) -> None:
        self.deferred = deferred
        self.futures: dict[int, asyncio.Future[Any]] = {}
        self.seen: list[int] = []
        self.seen_changed = asyncio.Event()

    async def __call__(self, ctx: RequestContext, request: Any) -> Any:
        corr = ctx.header.correlation_id
        self.seen.append(corr)
        self.seen_changed.set()
        if corr not in self.deferred:
            return ApiVersionsResponse(error_code=0)
        fut = self.futures[corr] = asyncio.get_running_loop().create_future()
        return DeferredResponse(fut, self._respond)

    @staticmethod
    def _respond(outcome: Any) -> Any:
        if isinstance(outcome, CloseConnection):
            raise outcome
        return ApiVersionsResponse(error_code=outcome)

    async def wait_seen(self, n: int) -> None:
        while len(self.seen) < n:
            self.seen_changed.clear()
            await asyncio.wait_for(self.seen_changed.wait(), 5)


async def _read_correlation_ids(r: asyncio.StreamReader, n: int) -> list[tuple[int, int]]:
    """(correlation id, error code) of the next ``n`` ApiVersions v0 responses."""
    out = []
    for _ in range(n):
        size = struct.unpack(">i", await asyncio.wait_for(r.readexactly(4), 5))[0]
        corr, error = struct.unpack_from(">ih", await r.readexactly(size))
        out.append((corr, error))
    return out


def test_a_deferred_response_lets_the_connection_go_on_and_answers_stay_in_request_order() -> None:
    """A pipelining client's requests are handled while an earlier one waits (an acks=all
    produce waiting for the ISR), and the answers still leave in request order: a later
    deferred answer that is ready first, and an immediate one, wait for the earlier one."""

    async def scenario() -> tuple[list[int], list[tuple[int, int]]]:
        handler = _Deferring({1, 2})
        server = SocketServer("127.0.0.1", 0, handler)
        port = await server.start()
        try:
            r, w = await asyncio.open_connection("127.0.0.1", port)
            w.write(b"".join(_frame(ApiVersionsRequest(), 0, c) for c in (1, 2, 3)))
            await w.drain()
            await handler.wait_seen(3)  # 2 and 3 handled while 1 still waits
            seen_while_waiting = list(handler.seen)
            handler.futures[2].set_result(0)  # ready before 1
            w.write(_frame(ApiVersionsRequest(), 0, 4))
            await w.drain()
            await handler.wait_seen(4)  # the server ran on after 2 became ready
            handler.futures[1].set_result(0)
            answers = await _read_correlation_ids(r, 4)
            w.close()
            return seen_while_waiting, answers
        finally:
            await server.shutdown()

    seen, answers = _run_server(scenario)
    assert seen == [1, 2, 3]
    assert answers == [(1, 0), (2, 0), (3, 0), (4, 0)]


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_deferred_answers_are_written_by_their_futures_callback_without_a_task_each(
        loop: str) -> None:
    """An acks=all produce answered alone (the connection owes nothing else) is written from
    its future's done callback: no writer task is created per request, where one was (a task
    and two more turns of the event loop for every single-record request at linger.ms=0)."""

    async def scenario() -> tuple[list[tuple[int, int]], int]:
        handler = _Deferring(set(range(1, 6)))
        server = SocketServer("127.0.0.1", pick_free_port(), handler)
        port = await server.start()
        created = 0
        aloop = asyncio.get_running_loop()

        def count(lp: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
            nonlocal created  # the server's tasks (the test's own wait_for make some too)
            created += coro.__qualname__.startswith(("_ResponseQueue", "SocketServer"))
            return asyncio.Task(coro, loop=lp, **kwargs)

        try:
            r, w = await asyncio.open_connection("127.0.0.1", port)
            w.write(_frame(ApiVersionsRequest(), 0, 0))  # (not deferred: the connection is up)
            answers = await _read_correlation_ids(r, 1)
            aloop.set_task_factory(count)
            for corr in range(1, 6):
                w.write(_frame(ApiVersionsRequest(), 0, corr))
                await w.drain()
                await handler.wait_seen(corr + 1)
                handler.futures[corr].set_result(0)
                answers += await _read_correlation_ids(r, 1)
            aloop.set_task_factory(None)
            w.close()
            return answers, created
        finally:
            await server.shutdown()

    if loop == "uvloop":
        answers, created = pytest.importorskip("uvloop").run(scenario())
    else:
        answers, created = _run_server(scenario)
    assert answers == [(c, 0) for c in range(6)]
    assert created == 0


def test_a_deferred_answer_that_closes_the_connection_comes_after_the_earlier_answers() -> None:
    async def scenario() -> tuple[list[tuple[int, int]], bytes]:
        handler = _Deferring({1, 2})
        server = SocketServer("127.0.0.1", 0, handler)
        port = await server.start()
        try:
            r, w = await asyncio.open_connection("127.0.0.1", port)
            w.write(b"".join(_frame(ApiVersionsRequest(), 0, c) for c in (1, 2, 3)))
            await w.drain()
            await handler.wait_seen(3)
            handler.futures[2].set_result(CloseConnection("the answer says: close"))
            handler.futures[1].set_result(0)
            answers = await _read_correlation_ids(r, 1)
            rest = await asyncio.wait_for(r.read(), 5)  # then EOF: 2 and 3 never answered
            w.close()
            return answers, rest
        finally:
            await server.shutdown()

    assert _run_server(scenario) == ([(1, 0)], b"")


def test_a_connection_owing_too_many_answers_stops_reading_until_the_oldest_is_answered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import tidelog.broker.socket_server as socket_server

    monkeypatch.setattr(socket_server, "MAX_DEFERRED_RESPONSES", 2)

    class Recording(_Deferring):
        """Notes, for each request, whether the first answer was ready when it was handled."""

        def __init__(self) -> None:
            super().__init__({1, 2, 3, 4})
            self.first_ready: dict[int, bool] = {}

        async def __call__(self, ctx: RequestContext, request: Any) -> Any:
            first = self.futures.get(1)
            self.first_ready[ctx.header.correlation_id] = first is not None and first.done()
            return await super().__call__(ctx, request)

    async def scenario() -> tuple[dict[int, bool], list[tuple[int, int]]]:
        handler = Recording()
        server = SocketServer("127.0.0.1", 0, handler)
        port = await server.start()
        try:
            r, w = await asyncio.open_connection("127.0.0.1", port)
            w.write(b"".join(_frame(ApiVersionsRequest(), 0, c) for c in (1, 2, 3, 4)))
            await w.drain()
            await handler.wait_seen(2)
            handler.futures[1].set_result(0)
            await handler.wait_seen(3)
            handler.futures[2].set_result(0)
            await handler.wait_seen(4)
            handler.futures[3].set_result(0)
            handler.futures[4].set_result(0)
            answers = await _read_correlation_ids(r, 4)
            w.close()
            return handler.first_ready, answers
        finally:
            await server.shutdown()

    first_ready, answers = _run_server(scenario)
    # 3 arrived in the same read as 1 and 2, but was handled only once 1 was answered.
    assert first_ready == {1: False, 2: False, 3: True, 4: True}
    assert [c for c, _ in answers] == [1, 2, 3, 4]


def test_answers_to_consecutive_produce_requests_of_one_read_leave_in_one_write(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A pipelining producer's requests arrive many per read: their immediate answers are sent
    together (one send instead of one per request), and any other request first flushes them,
    so the order stays the request order."""
    from tidelog.protocol.messages.produce import ProduceResponse

    writes: list[int] = []  # answers per write
    write = SocketServer._write

    async def counting(writer: asyncio.StreamWriter, buffers: list[Any]) -> None:
        data, frames, pos = b"".join(bytes(b) for b in buffers), 0, 0
        while pos < len(data):  # walk the size prefixes
            pos += 4 + struct.unpack_from(">i", data, pos)[0]
            frames += 1
        writes.append(frames)
        await write(writer, buffers)

    monkeypatch.setattr(SocketServer, "_write", staticmethod(counting))

    class Answering:
        async def __call__(self, ctx: RequestContext, request: Any) -> Any:
            if ctx.header.request_api_key == ApiKey.PRODUCE:
                return ProduceResponse(responses=[])
            return ApiVersionsResponse(error_code=0)

    async def scenario() -> list[int]:
        server = SocketServer("127.0.0.1", 0, Answering())
        port = await server.start()
        try:
            r, w = await asyncio.open_connection("127.0.0.1", port)
            produce = produce_request("t", 0, build_values([b"x"]), acks=1)
            w.write(_frame(produce, 9, 1) + _frame(produce, 9, 2)
                    + _frame(ApiVersionsRequest(), 0, 3) + _frame(produce, 9, 4))
            await w.drain()
            ids = []
            for _ in range(4):
                size = struct.unpack(">i", await asyncio.wait_for(r.readexactly(4), 5))[0]
                ids.append(struct.unpack_from(">i", await r.readexactly(size))[0])
            w.close()
            return ids
        finally:
            await server.shutdown()

    assert _run_server(scenario) == [1, 2, 3, 4]
    assert writes == [2, 1, 1]


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_large_requests_dribbled_in_pieces_are_read_whole_in_order(
        loop: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A connection feeds its frames straight to the server: 2 MB produce requests sent in
    pieces of odd sizes, with small requests sharing their pieces, reach the handler whole and
    in order, and every one is answered. On both loops the socket reads go into the buffer
    the connection offers, the rest of the frame being assembled (uvloop handed a plain
    Protocol bytes, which were copied into the frame once more)."""
    offered: list[int] = []
    get_buffer = socket_server._Connection.get_buffer

    def spy(self: Any, sizehint: int) -> memoryview:
        buffer = get_buffer(self, sizehint)
        offered.append(len(buffer))
        return buffer

    monkeypatch.setattr(socket_server._Connection, "get_buffer", spy)
    records = build_values([bytes([65 + i % 26]) * 1000 for i in range(2000)])
    produce = produce_request("t", 0, records, acks=1)
    frames = [_frame(produce if i % 2 else ApiVersionsRequest(), 3 if i % 2 else 0, i)
              for i in range(6)]
    stream = b"".join(frames)
    got: list[tuple[int, int]] = []

    async def handler(ctx: RequestContext, body: Any) -> Any:
        size = sum(len(p.records or b"") for t in getattr(body, "topic_data", [])
                   for p in t.partition_data)
        got.append((ctx.header.correlation_id, size))
        return ApiVersionsResponse(error_code=0)

    async def scenario() -> list[int]:
        server = SocketServer("127.0.0.1", pick_free_port(), handler)
        port = await server.start()
        try:
            r, w = await asyncio.open_connection("127.0.0.1", port)
            pos, step = 0, 1
            while pos < len(stream):
                step = step * 7 % 300_007 + 1  # 8, 57, 400, ... up to ~300 KB
                w.write(stream[pos:pos + step])
                await w.drain()
                pos += step
            answered = []
            for _ in frames:
                head = await asyncio.wait_for(r.readexactly(8), 10)
                answered.append(struct.unpack(">ii", head)[1])
                await r.readexactly(struct.unpack(">i", head[:4])[0] - 4)
            w.close()
            return answered
        finally:
            await server.shutdown()

    if loop == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        answered = uvloop.run(scenario())
    else:
        answered = asyncio.run(scenario())
    assert answered == list(range(6))
    assert [c for c, _ in got] == list(range(6))
    assert all(size == len(records) for c, size in got if c % 2)
    assert max(offered) > 1_000_000  # a socket read straight into a 2 MB frame's buffer


def _spy_frame_reuse(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Per large frame a connection reads (one at a time): was its buffer an earlier one's?"""
    reused: list[bool] = []
    reusable = FrameReader._reusable

    def spy(self: FrameReader, size: int) -> bytearray | None:
        buffer = reusable(self, size)
        reused.append(buffer is not None)
        return buffer

    monkeypatch.setattr(FrameReader, "_reusable", spy)
    return reused


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_connection_reuses_a_request_buffer_only_once_nothing_holds_its_records(
        loop: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Large produce requests on one connection are assembled in the buffer of the last one
    once the server and its handler let go of it; a request whose records the handler still
    holds (as a delayed produce or an appended batch kept as a view would) keeps its buffer,
    and the held records stay byte for byte what was sent."""
    reused = _spy_frame_reuse(monkeypatch)
    batches = [build_values([bytes([65 + i]) * 1000] * 200) for i in range(6)]
    held: dict[int, memoryview] = {}

    async def handler(ctx: RequestContext, body: Any) -> Any:
        corr = ctx.header.correlation_id
        if corr in (0, 2):
            held[corr] = body.topic_data[0].partition_data[0].records
        return ApiVersionsResponse(error_code=0)

    async def scenario() -> None:
        server = SocketServer("127.0.0.1", pick_free_port(), handler)
        port = await server.start()
        try:
            r, w = await asyncio.open_connection("127.0.0.1", port)
            for corr, records in enumerate(batches):  # one at a time: each answered first
                w.write(_frame(produce_request("t", 0, records, acks=1), 3, corr))
                await w.drain()
                head = await asyncio.wait_for(r.readexactly(8), 10)
                assert struct.unpack(">ii", head)[1] == corr
                await r.readexactly(struct.unpack(">i", head[:4])[0] - 4)
            w.close()
        finally:
            await server.shutdown()

    if loop == "uvloop":
        pytest.importorskip("uvloop").run(scenario())
    else:
        asyncio.run(scenario())
    # 1: request 0's records are held; 2: request 1's buffer is free; 3: request 2's is held
    assert reused == [False, False, True, False, True, True]
    assert {corr: bytes(view) for corr, view in held.items()} == {0: batches[0], 2: batches[2]}


def test_a_brokers_produce_path_lets_go_of_the_request_buffer(
        one_broker: BrokerThread, controller: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a broker, the produce path (decode, append, answer) keeps no view of a request's
    bytes once answered: the next large requests on the connection are read into the same
    buffer, and the log holds every batch as sent (none overwritten by a later request)."""
    controller.create_topic("reused-request-buffers", {0: [1]})
    reused = _spy_frame_reuse(monkeypatch)
    values = [[bytes([97 + i]) * 1000] * 150 for i in range(4)]

    async def scenario() -> None:
        conn = BrokerConnection("127.0.0.1", one_broker.port)
        await conn.connect()
        try:
            for batch in values:
                response = await conn.send(
                    produce_request("reused-request-buffers", 0, build_values(batch)))
                error = response.responses[0].partition_responses[0].error_code
                assert error == ErrorCode.NONE
        finally:
            await conn.close()

    asyncio.run(scenario())
    # (the first request to a new partition is sometimes still referenced when the second
    # arrives; from then on each buffer is released before the next request)
    assert reused[0] is False and reused[2:] == [True, True]
    part = fetch(one_broker.port, "reused-request-buffers", 0, 0, max_bytes=4 << 20)
    got = [r.value for b in iter_batches(part.records) for r in decode_records(b)]
    assert got == [v for batch in values for v in batch]


def test_an_idle_connection_lets_go_of_the_request_buffer_it_kept_for_reuse() -> None:
    """The buffer a connection keeps for its next large request goes once the connection has
    been idle for one round of the idle reaper, long before the connection itself is closed:
    memory held for reuse is bounded by the connections in use."""

    async def handler(ctx: RequestContext, body: Any) -> Any:
        return ApiVersionsResponse(error_code=0)

    async def scenario() -> tuple[bool, bool, bool]:
        # Reaper rounds of 2 s; the connection itself is closed after 8 s idle.
        server = SocketServer("127.0.0.1", pick_free_port(), handler,
                              connections_max_idle_ms=8000)
        port = await server.start()
        try:
            r, w = await asyncio.open_connection("127.0.0.1", port)
            records = build_values([b"x" * 1000] * 200)  # a frame above REUSE_MIN_BYTES
            w.write(_frame(produce_request("t", 0, records, acks=1), 3, 0))
            await w.drain()
            head = await asyncio.wait_for(r.readexactly(8), 10)
            await r.readexactly(struct.unpack(">i", head[:4])[0] - 4)
            (writer,) = server._writers.values()
            frames = writer.transport.get_protocol()._frames
            kept = frames._spare is not None
            deadline = time.monotonic() + 7
            while frames._spare is not None and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            released = frames._spare is None
            still_open = not writer.is_closing()
            w.close()
            return kept, released, still_open
        finally:
            await server.shutdown()

    assert asyncio.run(scenario()) == (True, True, True)
