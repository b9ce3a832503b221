"""A scripted Kafka-protocol peer for the client tests (see :class:`ScriptedBroker`)."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from tidelog.protocol.api_keys import ApiKey, api_spec
from tidelog.protocol.api_versions import BROKER_API_VERSIONS
from tidelog.protocol.codec import decode_request, encode_response
from tidelog.protocol.errors import ErrorCode
from tidelog.protocol.framing import FrameReader
from tidelog.protocol.headers import RequestHeader
from tidelog.protocol.messages.api_versions import ApiVersion, ApiVersionsResponse

# -- the scripted peer --------------------------------------------------------------------

# What a handler may return besides a response dataclass or raw bytes:
CLOSE = object()  # close the connection instead of answering
NO_ANSWER = object()  # never answer this request
# None: not handled here (ApiVersions gets the default answer, anything else no answer)

Handler = Callable[[RequestHeader, Any], Any | Awaitable[Any]]


class ScriptedBroker:
    """A Kafka-protocol server on 127.0.0.1 answering with ``handler(header, request)``.

    ApiVersions is answered from ``api_versions`` (tidelog's broker table by default) unless the
    handler answers it itself. Each request is handled in its own task, so a handler that sleeps
    lets later requests overtake it (responses then go out of order). Every request received is
    kept in ``requests`` as (header, body).
    """

    def __init__(
        self,
        handler: Handler | None = None,
        api_versions: dict[int, tuple[int, int]] | None = None,
    ) -> None:
        self.handler = handler
        self.api_versions = dict(BROKER_API_VERSIONS if api_versions is None else api_versions)
        self.requests: list[tuple[RequestHeader, Any]] = []
        self.connections = 0
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def received(self, api_key: int) -> list[tuple[RequestHeader, Any]]:
        return [(h, r) for h, r in self.requests if h.request_api_key == api_key]

    async def start(self) -> ScriptedBroker:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        for writer in list(self._writers):
            writer.close()
        for task in list(self._tasks):
            task.cancel()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def __aenter__(self) -> ScriptedBroker:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _api_versions_answer(self, header: RequestHeader) -> ApiVersionsResponse:
        lo, hi = self.api_versions.get(ApiKey.API_VERSIONS, (0, 0))
        if header.request_api_version > hi:
            return ApiVersionsResponse(
                error_code=ErrorCode.UNSUPPORTED_VERSION,
                api_keys=[ApiVersion(ApiKey.API_VERSIONS, lo, hi)],
            )
        return ApiVersionsResponse(
            error_code=0,
            api_keys=[
                ApiVersion(k, lo_, hi_) for k, (lo_, hi_) in sorted(self.api_versions.items())
            ],
        )

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.add(writer)
        frames = FrameReader()
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                for frame in frames.feed(data):
                    header, body = decode_request(frame)
                    self.requests.append((header, body))
                    task = asyncio.get_running_loop().create_task(
                        self._answer(header, body, writer)
                    )
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _answer(self, header: RequestHeader, body: Any, writer: asyncio.StreamWriter) -> None:
        answer: Any = None
        if self.handler is not None:
            answer = self.handler(header, body)
            if inspect.isawaitable(answer):
                answer = await answer
        if answer is None and header.request_api_key == ApiKey.API_VERSIONS:
            answer = self._api_versions_answer(header)
        if answer is None or answer is NO_ANSWER:
            return
        if answer is CLOSE:
            writer.close()
            return
        version = header.request_api_version
        if header.request_api_key == ApiKey.API_VERSIONS and answer.error_code:
            version = 0  # Kafka answers an unsupported ApiVersions in a v0 body
        spec = api_spec(header.request_api_key)
        if isinstance(answer, (bytes, bytearray)):
            writer.write(answer)  # raw bytes: for malformed-answer tests
        else:
            parts = encode_response(
                spec.response_header_version(version), header.correlation_id, answer, version
            )
            writer.writelines(parts)
        try:
            await writer.drain()
        except ConnectionError:
            pass


def metadata_answer(
    brokers: dict[int, int],
    leaders: dict[tuple[str, int], int],
    leader_epoch: int = 0,
    controller_id: int = -1,
) -> Any:
    """A MetadataResponse: ``brokers`` {node id: port on 127.0.0.1}, ``leaders`` {(topic,
    partition): leader node id}."""
    from tidelog.protocol.messages.metadata import (
        MetadataResponse,
        MetadataResponseBroker,
        MetadataResponsePartition,
        MetadataResponseTopic,
    )

    topics: dict[str, list[Any]] = {}
    for (topic, partition), leader in sorted(leaders.items()):
        topics.setdefault(topic, []).append(
            MetadataResponsePartition(
                error_code=0,
                partition_index=partition,
                leader_id=leader,
                leader_epoch=leader_epoch,
                replica_nodes=sorted(brokers),
                isr_nodes=sorted(brokers),
            )
        )
    return MetadataResponse(
        brokers=[MetadataResponseBroker(n, "127.0.0.1", p) for n, p in sorted(brokers.items())],
        cluster_id="scripted",
        controller_id=controller_id,
        topics=[
            MetadataResponseTopic(error_code=0, name=t, partitions=ps) for t, ps in topics.items()
        ],
    )
