"""One TCP connection to one Kafka-protocol broker: version negotiation and pipelining.

:class:`BrokerConnection` opens the socket, asks ApiVersions (falling back to v0 when the broker
answers UNSUPPORTED_VERSION, as Kafka's clients do), and then lets many requests be in flight at
once. Requests are written in the order ``send`` is called; Kafka brokers answer a connection's
requests in order, and each response is matched to its request by correlation id.

A request that times out fails alone: its late answer is discarded and the connection stays up
for the others. A closed or broken socket fails every request in flight with
:class:`KafkaConnectionError`; the connection is then ``closed`` and is not reopened (the pool in
``client/cluster.py`` opens a new one).
"""

from __future__ import annotations

import asyncio
from collections import deque
from struct import Struct
from typing import Any

from tidelog.client.errors import (
    KafkaConnectionError,
    RequestTimedOutError,
    UnsupportedVersionError,
)
from tidelog.protocol.api_keys import ApiKey, api_spec
from tidelog.protocol.codec import decode_response, encode_request
from tidelog.protocol.errors import DecodeError, ErrorCode
from tidelog.protocol.framing import DEFAULT_MAX_FRAME_BYTES, FrameReader
from tidelog.protocol.messages.api_versions import ApiVersionsRequest, ApiVersionsResponse
from tidelog.protocol.primitives import ZERO_UUID

__all__ = ["DEFAULT_MAX_FRAME_BYTES", "BrokerConnection", "WriteFlowControl"]

_CORRELATION = Struct(">i")
_SOFTWARE_NAME = "tidelog"
_MAX_NO_ANSWER_IDS = 4096
# The last Fetch version that names topics (v13+ carry topic ids only, KIP-516).
_FETCH_BY_NAME_MAX_VERSION = 12


def _fetch_uses_topic_ids(request: Any) -> bool:
    """The Fetch names (or forgets) topics and every one has an id: Kafka's canUseTopicIds. An
    empty one cannot tell: it goes by name (a session's fetcher picks its version itself)."""
    topics = (*request.topics, *request.forgotten_topics_data)
    return bool(topics) and all(t.topic_id != ZERO_UUID for t in topics)


def _software_version() -> str:
    try:
        from importlib.metadata import version

        return version("tidelog")
    except Exception:  # noqa: BLE001 - a source checkout without metadata
        return "0.0.0"


class _Pending:
    __slots__ = ("api_key", "api_version", "future")

    def __init__(self, api_key: int, api_version: int, future: asyncio.Future[Any]) -> None:
        self.api_key = api_key
        self.api_version = api_version
        self.future = future


class WriteFlowControl:
    """A protocol's write flow control (the transport's pause_writing / resume_writing):
    `wait_writable` returns at once unless writing is paused, else once it resumes or fails
    with the error given to `_wake_writers`. A plain mixin, not asyncio's FlowControlMixin:
    that one is a Protocol, and uvloop hands a Protocol bytes instead of reading into a
    BufferedProtocol's buffer (the broker's connections use this one too)."""

    def __init__(self) -> None:
        self.paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self._wake_writers(None)

    def _wake_writers(self, exc: BaseException | None) -> None:
        waiters, self._drain_waiters = self._drain_waiters, []
        for waiter in waiters:
            if not waiter.done():
                if exc is None:
                    waiter.set_result(None)
                else:
                    waiter.set_exception(exc)

    async def wait_writable(self) -> None:
        if not self.paused:
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._drain_waiters.append(waiter)
        await waiter


class _Protocol(WriteFlowControl, asyncio.BufferedProtocol):
    """Feeds the connection's frames; tracks write flow control for ``drain``. Reads go
    straight into the frame being assembled (a follower's fetch responses run to megabytes:
    no copy of them between the socket and the decoder)."""

    def __init__(self, conn: BrokerConnection) -> None:
        super().__init__()
        self._conn = conn

    def get_buffer(self, sizehint: int) -> memoryview:
        try:
            return self._conn._frames.get_buffer()
        except DecodeError:  # failed before (the connection is being aborted): discard
            return memoryview(bytearray(65536))

    def buffer_updated(self, nbytes: int) -> None:
        self._conn._on_read(nbytes)

    def eof_received(self) -> bool:
        return False  # close the transport; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self._conn._on_lost(exc)
        self._wake_writers(None if exc is None else KafkaConnectionError(str(exc)))


class BrokerConnection:
    """A pipelined connection to one broker. Use ``await connect()`` before ``send``."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        client_id: str = "tidelog",
        request_timeout_ms: int = 30000,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    ) -> None:
        if request_timeout_ms <= 0:
            raise ValueError("request.timeout.ms must be positive")
        self.host = host
        self.port = port
        self.client_id = client_id
        self.request_timeout_ms = request_timeout_ms
        self.max_frame_bytes = max_frame_bytes
        self.closed = False
        self.node_id: int | None = None  # set by the cluster client; informational here
        self._transport: asyncio.Transport | None = None
        # The loop connect() ran on (request_future: no get_running_loop per request, which
        # costs a getpid system call on Python 3.11)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._protocol: _Protocol | None = None
        # A connection's answers are consumed one at a time: a large one's buffer is reused
        # for the next (a replica fetcher's 1 MB fetch answers, a consumer's).
        self._frames = FrameReader(max_frame_bytes, reuse_buffers=True)
        self._next_correlation_id = 0
        self._pending: dict[int, _Pending] = {}
        # correlation ids whose caller gave up (timeout, cancel): their answers are dropped
        self._abandoned: set[int] = set()
        # correlation ids of requests sent without expecting an answer (acks=0). Kafka sends
        # none, but some Kafka-compatible brokers (tansu 0.6) answer anyway: such an answer is
        # dropped rather than taken for a broken stream. Answers come in request order, so ids
        # older than any answered request are forgotten; the rest are capped.
        self._no_answer: deque[int] = deque()
        self._no_answer_ids: set[int] = set()
        self._api_versions: dict[int, tuple[int, int]] = {}
        self._close_reason: str = "connection not open"

    def __repr__(self) -> str:
        state = "closed" if self.closed else ("open" if self._transport else "new")
        return f"<BrokerConnection {self.host}:{self.port} node={self.node_id} {state}>"

    # -- lifecycle ------------------------------------------------------------------------

    async def connect(self, timeout_s: float = 10.0) -> None:
        """Open the socket and negotiate API versions (bounded by ``timeout_s`` in total)."""
        if self._transport is not None or self.closed:
            raise KafkaConnectionError(f"{self.host}:{self.port}: connect() called twice")
        loop = self._loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout_s):
                try:
                    transport, protocol = await loop.create_connection(
                        lambda: _Protocol(self), self.host, self.port
                    )
                except OSError as exc:
                    self.closed = True
                    raise KafkaConnectionError(
                        f"cannot connect to {self.host}:{self.port}: {exc.strerror or exc}"
                    ) from exc
                self._transport = transport  # type: ignore[assignment]
                self._protocol = protocol
                self._close_reason = f"connection to {self.host}:{self.port} closed"
                await self._negotiate()
        except TimeoutError:
            await self.close()
            raise KafkaConnectionError(
                f"connecting to {self.host}:{self.port} timed out after {timeout_s:g} s"
            ) from None
        except BaseException:
            await self.close()
            raise

    async def _negotiate(self) -> None:
        spec = api_spec(ApiKey.API_VERSIONS)
        version = spec.max_version
        request = ApiVersionsRequest(_SOFTWARE_NAME, _software_version())
        for _ in range(3):  # highest, then what the broker says it serves, then v0
            response: ApiVersionsResponse = await self._send(request, version, None, True)
            if response.error_code == ErrorCode.UNSUPPORTED_VERSION and version > 0:
                # The broker's own ApiVersions range is in the (v0) body of its answer.
                broker_max = next(
                    (e.max_version for e in response.api_keys if e.api_key == ApiKey.API_VERSIONS),
                    0,
                )
                lower = min(broker_max, spec.max_version)
                version = lower if lower < version else 0
                continue
            if response.error_code != ErrorCode.NONE:
                raise KafkaConnectionError(
                    f"{self.host}:{self.port}: ApiVersions failed with error {response.error_code}"
                )
            self._api_versions = {
                e.api_key: (e.min_version, e.max_version) for e in response.api_keys
            }
            return
        raise UnsupportedVersionError(f"{self.host}:{self.port}: no common ApiVersions version")

    async def close(self) -> None:
        """Close the socket; every request still in flight fails with KafkaConnectionError."""
        if self.closed and self._transport is None:
            return
        self.closed = True
        transport, self._transport = self._transport, None
        if transport is not None:
            transport.close()
        self._fail_all(KafkaConnectionError(f"connection to {self.host}:{self.port} closed"))

    # -- versions -------------------------------------------------------------------------

    @property
    def api_versions(self) -> dict[int, tuple[int, int]]:
        """The broker's ApiVersions table: api key -> (min, max)."""
        return dict(self._api_versions)

    def api_version_range(self, api_key: int) -> tuple[int, int] | None:
        """The versions of ``api_key`` both sides speak, or None if there are none."""
        broker = self._api_versions.get(api_key)
        if broker is None:
            return None
        spec = api_spec(api_key)
        lo, hi = max(broker[0], spec.min_version), min(broker[1], spec.max_version)
        return (lo, hi) if lo <= hi else None

    def pick_version(self, api_key: int, api_version: int | None = None) -> int:
        """``api_version`` if the broker serves it, else the highest common version."""
        rng = self.api_version_range(api_key)
        name = api_spec(api_key).name
        if rng is None:
            raise UnsupportedVersionError(
                f"broker {self.host}:{self.port} does not serve {name} in a version tidelog speaks"
            )
        if api_version is None:
            return rng[1]
        if not rng[0] <= api_version <= rng[1]:
            raise UnsupportedVersionError(
                f"broker {self.host}:{self.port} serves {name} v{rng[0]}-{rng[1]}, "
                f"not v{api_version}"
            )
        return api_version

    # -- requests -------------------------------------------------------------------------

    async def send(
        self, request: Any, api_version: int | None = None, *, timeout_ms: int | None = None
    ) -> Any:
        """Send ``request`` and return the decoded response dataclass.

        ``timeout_ms`` overrides ``request_timeout_ms`` for this request (long-polling fetches
        need more than their ``max_wait_ms``).
        """
        if self.closed or self._transport is None:
            raise KafkaConnectionError(self._close_reason)
        version = self.pick_version(request.API_KEY, api_version)
        if api_version is None and version > _FETCH_BY_NAME_MAX_VERSION \
                and request.API_KEY == ApiKey.FETCH and not _fetch_uses_topic_ids(request):
            # Fetch v13+ names topics by id only: a request without ids goes as v12, as Kafka's
            # clients and ReplicaFetcherThread do when they cannot use topic ids.
            version = self.pick_version(request.API_KEY, _FETCH_BY_NAME_MAX_VERSION)
        return await self._send(request, version, timeout_ms, False)

    async def send_no_response(self, request: Any, api_version: int | None = None) -> None:
        """Send a request the broker does not answer (Produce with acks=0)."""
        if self.closed or self._transport is None:
            raise KafkaConnectionError(self._close_reason)
        version = self.pick_version(request.API_KEY, api_version)
        correlation_id = self._write(request, version)
        self._no_answer.append(correlation_id)
        self._no_answer_ids.add(correlation_id)
        if len(self._no_answer) > _MAX_NO_ANSWER_IDS:
            self._no_answer_ids.discard(self._no_answer.popleft())
        await self._drain()

    def _write(self, request: Any, version: int) -> int:
        if self.closed or self._transport is None:
            raise KafkaConnectionError(self._close_reason)
        correlation_id = self._next_correlation_id
        self._next_correlation_id = (correlation_id + 1) & 0x7FFFFFFF
        try:
            parts = encode_request(request, version, correlation_id, self.client_id)
        except Exception as exc:  # struct.error, bad field types: the caller's request is wrong
            raise ValueError(f"cannot encode {type(request).__name__} v{version}: {exc}") from exc
        self._transport.writelines(parts)
        return correlation_id

    def request_future(self, request: Any, api_version: int, timeout_ms: int
                       ) -> asyncio.Future[Any]:
        """Write ``request`` (at ``api_version``) now and return the future of its decoded
        response, for a caller that goes on from a done callback: no task, no await and no
        timeout scope per request (the replica fetchers, one request after the other). After
        ``timeout_ms`` it fails with `RequestTimedOutError` (the late answer is dropped, the
        connection stays up); a broken connection fails it with `KafkaConnectionError`;
        cancelling it abandons the request. The write is not drained: meant for small
        requests, one at a time."""
        correlation_id = self._write(request, api_version)  # raises unless connected
        loop = self._loop
        assert loop is not None
        future: asyncio.Future[Any] = loop.create_future()
        self._pending[correlation_id] = _Pending(request.API_KEY, api_version, future)
        timer = loop.call_later(timeout_ms / 1000, self._time_out, correlation_id, timeout_ms)

        def settled(_: asyncio.Future[Any]) -> None:
            timer.cancel()
            self._abandon(correlation_id)

        future.add_done_callback(settled)
        return future

    def _time_out(self, correlation_id: int, timeout_ms: int) -> None:
        pending = self._pending.get(correlation_id)
        if pending is not None and not pending.future.done():
            pending.future.set_exception(RequestTimedOutError(
                f"{api_spec(pending.api_key).name} v{pending.api_version} to "
                f"{self.host}:{self.port} got no response within {timeout_ms:g} ms"))

    def _abandon(self, correlation_id: int) -> None:
        """The caller is done with a request: an answer still to come is dropped."""
        if self._pending.pop(correlation_id, None) is not None and not self.closed:
            self._abandoned.add(correlation_id)

    async def _drain(self) -> None:
        if self._protocol is not None:
            await self._protocol.wait_writable()

    async def _send(
        self, request: Any, version: int, timeout_ms: int | None, negotiating: bool
    ) -> Any:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        correlation_id = self._write(request, version)
        self._pending[correlation_id] = _Pending(request.API_KEY, version, future)
        timeout_s = (timeout_ms if timeout_ms is not None else self.request_timeout_ms) / 1000
        try:
            async with asyncio.timeout(timeout_s):
                await self._drain()
                return await future
        except TimeoutError:
            raise RequestTimedOutError(
                f"{api_spec(request.API_KEY).name} v{version} to {self.host}:{self.port} "
                f"got no response within {timeout_s * 1000:g} ms"
            ) from None
        finally:
            self._abandon(correlation_id)

    # -- incoming -------------------------------------------------------------------------

    def _on_read(self, nbytes: int) -> None:
        try:
            frames = self._frames.buffer_updated(nbytes)
        except DecodeError as exc:
            self._abort(f"bad frame from {self.host}:{self.port}: {exc}")
            return
        for frame in frames:
            if len(frame) < 4:
                self._abort(f"{self.host}:{self.port} sent a {len(frame)}-byte response")
                return
            (correlation_id,) = _CORRELATION.unpack_from(frame, 0)
            pending = self._pending.pop(correlation_id, None)
            if pending is None:
                if correlation_id in self._abandoned:
                    self._abandoned.discard(correlation_id)
                    continue
                if correlation_id in self._no_answer_ids:
                    self._no_answer_ids.discard(correlation_id)
                    continue
                self._abort(
                    f"{self.host}:{self.port} answered unknown correlation id {correlation_id}"
                )
                return
            if self._no_answer:
                self._forget_no_answer_before(correlation_id)
            if pending.future.done():
                continue
            try:
                _, body = decode_response(pending.api_key, pending.api_version, frame)
            except DecodeError as exc:
                body = self._decode_fallback(pending, frame, exc)
                if isinstance(body, Exception):
                    pending.future.set_exception(body)
                    continue
            pending.future.set_result(body)

    def _forget_no_answer_before(self, correlation_id: int) -> None:
        # ids wrap at 2**31: "older" is a forward distance of less than half the id space
        queue = self._no_answer
        while queue and 0 < ((correlation_id - queue[0]) & 0x7FFFFFFF) < 0x40000000:
            self._no_answer_ids.discard(queue.popleft())

    @staticmethod
    def _decode_fallback(pending: _Pending, frame: memoryview, exc: DecodeError) -> Any:
        # An ApiVersions error answer is always a v0 body, whatever version was asked.
        if pending.api_key == ApiKey.API_VERSIONS and pending.api_version > 0:
            try:
                return decode_response(pending.api_key, 0, frame)[1]
            except DecodeError:
                pass
        return KafkaConnectionError(
            f"malformed {api_spec(pending.api_key).name} v{pending.api_version} response: {exc}"
        )

    def _abort(self, reason: str) -> None:
        self._close_reason = reason
        self.closed = True
        transport, self._transport = self._transport, None
        if transport is not None:
            transport.abort()
        self._fail_all(KafkaConnectionError(reason))

    def _on_lost(self, exc: Exception | None) -> None:
        if not self.closed:
            self._close_reason = f"{self.host}:{self.port} closed the connection" + (
                f": {exc}" if exc else ""
            )
        self.closed = True
        self._transport = None
        self._fail_all(KafkaConnectionError(self._close_reason))

    def _fail_all(self, error: Exception) -> None:
        pending, self._pending = self._pending, {}
        self._abandoned.clear()
        self._no_answer.clear()
        self._no_answer_ids.clear()
        for entry in pending.values():
            if not entry.future.done():
                entry.future.set_exception(error)
