"""A frame-aware TCP proxy for fault tests: it forwards Kafka-protocol connections to one
broker listener and can drop chosen responses (the request still reaches the broker, its
answer never comes back), as a lost reply on the network would.

It runs its own event loop in a thread, so tests (and their blocking clients) drive it from
the main thread: `proxy.drop_responses = lambda req: ...` decides per request, from its
decoded header and body (`ProxiedRequest`), whether the broker's answer is dropped;
`proxy.on_response = lambda req, frame: ...` sees every answer it forwards (a barrier: "the
broker has answered such a request").
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from struct import Struct
from typing import Any

from tidelog.cluster.zookeeper import pick_free_port
from tidelog.protocol.codec import decode_request
from tidelog.protocol.headers import peek_api

_SIZE = Struct(">i")


@dataclass
class ProxiedRequest:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body: Any  # the decoded request, or None when it could not be decoded


class FrameProxy:
    def __init__(self, target_port: int, host: str = "127.0.0.1") -> None:
        self.host = host
        self.target_port = target_port
        self.port = pick_free_port(host)
        self.drop_responses: Callable[[ProxiedRequest], bool] | None = None
        self.dropped: list[ProxiedRequest] = []
        # Called (on the proxy's thread) with each forwarded answer: its request and its frame
        # without the size prefix (`decode_response(req.api_key, req.api_version, frame)`).
        self.on_response: Callable[[ProxiedRequest, bytes], None] | None = None
        self.forwarded = 0
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.AbstractServer | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name=f"frame-proxy-{self.port}")

    def start(self) -> FrameProxy:
        self._thread.start()
        fut = asyncio.run_coroutine_threadsafe(self._start(), self._loop)
        fut.result(10)
        return self

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._handle, self.host, self.port)

    def stop(self) -> None:
        async def close() -> None:
            if self._server is not None:
                self._server.close()
            for w in list(self._writers):
                w.close()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(close(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def cut_connections(self) -> None:
        """Close every proxied connection (clients reconnect through the proxy)."""
        def cut() -> None:
            for w in list(self._writers):
                w.close()

        self._loop.call_soon_threadsafe(cut)

    async def _handle(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        try:
            sr, sw = await asyncio.open_connection(self.host, self.target_port)
        except OSError:
            cw.close()
            return
        self._writers.update((cw, sw))
        pending: dict[int, ProxiedRequest] = {}

        async def upstream() -> None:
            while True:
                frame = await _read_frame(cr)
                if frame is None:
                    break
                try:
                    api_key, version, corr = peek_api(frame)
                    try:
                        header, body = decode_request(frame)
                        client_id = header.client_id
                    except Exception:  # noqa: BLE001 - forwarded anyway; the broker decides
                        body, client_id = None, None
                    pending[corr] = ProxiedRequest(api_key, version, corr, client_id, body)
                except Exception:  # noqa: BLE001
                    pass
                sw.write(_SIZE.pack(len(frame)) + frame)
                await sw.drain()

        async def downstream() -> None:
            while True:
                frame = await _read_frame(sr)
                if frame is None:
                    break
                corr = _SIZE.unpack_from(frame, 0)[0] if len(frame) >= 4 else -1
                req = pending.pop(corr, None)
                rule = self.drop_responses
                if req is not None and rule is not None and rule(req):
                    self.dropped.append(req)
                    continue
                self.forwarded += 1
                watch = self.on_response
                if req is not None and watch is not None:
                    watch(req, frame)
                cw.write(_SIZE.pack(len(frame)) + frame)
                await cw.drain()

        tasks = [asyncio.ensure_future(upstream()), asyncio.ensure_future(downstream())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in tasks:
                t.cancel()
            for w in (cw, sw):
                w.close()
                self._writers.discard(w)


async def _read_frame(reader: asyncio.StreamReader) -> bytes | None:
    try:
        head = await reader.readexactly(4)
        (size,) = _SIZE.unpack(head)
        if size < 0 or size > 200 * 1024 * 1024:
            return None
        return await reader.readexactly(size)
    except (asyncio.IncompleteReadError, ConnectionError, OSError):
        return None


class HoldProxy:
    """A byte-level TCP proxy (for ZooKeeper) that can hold the client's traffic: once armed
    with a pattern, the first client chunk containing it, and everything after it, is held
    until `release()` (a write in flight that the server has not seen yet)."""

    def __init__(self, target_port: int, host: str = "127.0.0.1") -> None:
        self.host = host
        self.target_port = target_port
        self.port = pick_free_port(host)
        self.pattern: bytes | None = None
        self.holding = threading.Event()
        self._released: asyncio.Event | None = None
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.AbstractServer | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name=f"hold-proxy-{self.port}")

    def start(self) -> HoldProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    async def _start(self) -> None:
        self._released = asyncio.Event()
        self._released.set()
        self._server = await asyncio.start_server(self._handle, self.host, self.port)

    def arm(self, pattern: bytes) -> None:
        self.holding.clear()
        self.pattern = pattern

    def release(self) -> None:
        self.pattern = None
        self.holding.clear()
        assert self._released is not None
        self._loop.call_soon_threadsafe(self._released.set)

    def stop(self) -> None:
        async def close() -> None:
            if self._server is not None:
                self._server.close()
            for w in list(self._writers):
                w.close()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(close(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    async def _handle(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        try:
            sr, sw = await asyncio.open_connection(self.host, self.target_port)
        except OSError:
            cw.close()
            return
        self._writers.update((cw, sw))

        async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter, up: bool) -> None:
            while data := await r.read(65536):
                if up:
                    assert self._released is not None
                    pattern = self.pattern
                    if pattern is not None and pattern in data and self._released.is_set():
                        self._released.clear()
                        self.holding.set()
                    await self._released.wait()
                w.write(data)
                await w.drain()

        tasks = [asyncio.ensure_future(pipe(cr, sw, True)),
                 asyncio.ensure_future(pipe(sr, cw, False))]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        except (ConnectionError, OSError):
            pass
        finally:
            for t in tasks:
                t.cancel()
            for w in (cw, sw):
                w.close()
                self._writers.discard(w)


def replication_listener(proxy: FrameProxy, real_port: int, client_port: int) -> dict[str, str]:
    """A broker's settings for a REPLICATION listener on `real_port`, advertised at the proxy:
    every inter-broker connection (fetchers, the controller's channel) passes the proxy."""
    return {
        "listeners": f"PLAINTEXT://127.0.0.1:{client_port},REPLICATION://127.0.0.1:{real_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{client_port},"
                                f"REPLICATION://127.0.0.1:{proxy.port}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,REPLICATION:PLAINTEXT",
        "inter.broker.listener.name": "REPLICATION",
    }
