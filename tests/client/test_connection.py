"""BrokerConnection: version negotiation, pipelining, correlation matching, timeouts, failures.

Most tests run against a scripted Kafka-protocol peer (the test is about the client's reaction
to particular answers); the last ones talk to the real tansu broker.
"""

from __future__ import annotations

import asyncio
import random
import struct
import time
from typing import Any

import pytest
from kafka_peer import CLOSE, NO_ANSWER, ScriptedBroker

from tidelog.client.connection import BrokerConnection
from tidelog.client.errors import (
    KafkaConnectionError,
    RequestTimedOutError,
    UnsupportedVersionError,
)
from tidelog.cluster.zookeeper import pick_free_port
from tidelog.protocol.api_keys import ApiKey, api_spec
from tidelog.protocol.headers import RequestHeader
from tidelog.protocol.messages.metadata import (
    MetadataRequest,
    MetadataRequestTopic,
    MetadataResponse,
    MetadataResponseTopic,
)
from tidelog.protocol.messages.produce import (
    PartitionProduceData,
    ProduceRequest,
    ProduceResponse,
    TopicProduceData,
)
from tidelog.protocol.records import build_values


def echo_metadata(header: RequestHeader, request: Any) -> MetadataResponse | None:
    """Answer Metadata with the topic names asked for, so answers can be matched to asks."""
    if header.request_api_key == ApiKey.METADATA:
        return MetadataResponse(
            topics=[MetadataResponseTopic(name=t.name) for t in request.topics or []]
        )
    return None


class SlowMetadata:
    """`echo_metadata`, but a Metadata request for the topic "slow" is answered only once
    ``release`` is set (after the client gave up on it); ``answered`` is set as the last of
    ``slow_requests`` answers goes out."""

    def __init__(self, slow_requests: int = 1) -> None:
        self.release = asyncio.Event()
        self.answered = asyncio.Event()
        self._left = slow_requests

    async def __call__(self, header: RequestHeader, request: Any) -> Any:
        if header.request_api_key == ApiKey.METADATA and request.topics[0].name == "slow":
            await self.release.wait()
            self._left -= 1
            if self._left == 0:
                self.answered.set()
        return echo_metadata(header, request)


def ask(name: str) -> MetadataRequest:
    return MetadataRequest(topics=[MetadataRequestTopic(name=name)])


def test_negotiates_the_highest_version_both_sides_speak() -> None:
    async def main() -> None:
        versions = {ApiKey.API_VERSIONS: (0, 4), ApiKey.METADATA: (0, 5), ApiKey.FETCH: (4, 99)}
        async with ScriptedBroker(echo_metadata, versions) as broker:
            conn = BrokerConnection("127.0.0.1", broker.port, client_id="negotiator")
            await conn.connect()
            assert conn.api_version_range(ApiKey.METADATA) == (0, 5)
            # the broker's newer Fetch versions are cut to what tidelog's schemas know
            assert conn.api_version_range(ApiKey.FETCH) == (4, api_spec(ApiKey.FETCH).max_version)
            assert conn.api_version_range(ApiKey.PRODUCE) is None
            response = await conn.send(ask("a"))
            assert [t.name for t in response.topics] == ["a"]
            header, _ = broker.received(ApiKey.METADATA)[0]
            assert header.request_api_version == 5
            assert header.client_id == "negotiator"
            await conn.send(ask("b"), api_version=1)
            assert broker.received(ApiKey.METADATA)[1][0].request_api_version == 1
            with pytest.raises(UnsupportedVersionError):
                await conn.send(ask("c"), api_version=6)
            with pytest.raises(UnsupportedVersionError, match="Produce"):
                await conn.send(ProduceRequest(acks=1))
            await conn.close()

    asyncio.run(main())


def test_apiversions_falls_back_when_the_broker_knows_only_older_versions() -> None:
    async def main() -> None:
        # A broker whose newest ApiVersions is v2 answers our v4 with UNSUPPORTED_VERSION in a
        # v0 body naming its range; the client asks again at v2.
        versions = {ApiKey.API_VERSIONS: (0, 2), ApiKey.METADATA: (0, 8)}
        async with ScriptedBroker(echo_metadata, versions) as broker:
            conn = BrokerConnection("127.0.0.1", broker.port)
            await conn.connect()
            asked = [h.request_api_version for h, _ in broker.received(ApiKey.API_VERSIONS)]
            assert asked == [api_spec(ApiKey.API_VERSIONS).max_version, 2]
            assert conn.api_version_range(ApiKey.METADATA) == (0, 8)
            await conn.close()

    asyncio.run(main())


def test_pipelined_requests_get_their_own_answers_even_out_of_order() -> None:
    async def slow_echo(header: RequestHeader, request: Any) -> Any:
        if header.request_api_key == ApiKey.METADATA:
            await asyncio.sleep(random.uniform(0, 0.02))
        return echo_metadata(header, request)

    async def main() -> None:
        async with ScriptedBroker(slow_echo) as broker:
            conn = BrokerConnection("127.0.0.1", broker.port)
            await conn.connect()
            names = [f"topic-{i}" for i in range(200)]
            responses = await asyncio.gather(*(conn.send(ask(n)) for n in names))
            assert [r.topics[0].name for r in responses] == names
            # all 200 were on the wire together, over one connection, in call order
            assert broker.connections == 1
            sent = [r.topics[0].name for _, r in broker.received(ApiKey.METADATA)]
            assert sent == names
            await conn.close()

    asyncio.run(main())


def test_answers_of_megabytes_pipelined_with_small_ones_arrive_whole() -> None:
    """The connection reads into the frame being assembled (a BufferedProtocol): answers that
    span many reads, and small ones sharing a read with the end of a large one, come out whole
    and matched to their requests."""
    def wide(i: int) -> MetadataRequest:  # an ask whose answer is ~2 MB
        return MetadataRequest(topics=[MetadataRequestTopic(name=f"{i}-{j:04d}-" + "x" * 990)
                                       for j in range(2000)])

    async def main() -> None:
        async with ScriptedBroker(echo_metadata) as broker:
            conn = BrokerConnection("127.0.0.1", broker.port)
            await conn.connect()
            asks = [wide(i) if i % 3 == 1 else ask(f"small-{i}") for i in range(9)]
            responses = await asyncio.gather(*(conn.send(a) for a in asks))
            for a, r in zip(asks, responses, strict=True):
                assert [t.name for t in r.topics] == [t.name for t in a.topics or []]
            await conn.close()

    asyncio.run(main())


def test_a_timed_out_request_fails_alone_and_its_late_answer_is_dropped() -> None:
    async def main() -> None:
        slow_metadata = SlowMetadata()
        async with ScriptedBroker(slow_metadata) as broker:
            conn = BrokerConnection("127.0.0.1", broker.port, request_timeout_ms=100)
            await conn.connect()
            slow = asyncio.ensure_future(conn.send(ask("slow")))
            # (a generous timeout for the others: only "slow" is to time out, on any load)
            fast = await conn.send(ask("fast"), timeout_ms=30_000)
            assert fast.topics[0].name == "fast"
            with pytest.raises(RequestTimedOutError, match="Metadata"):
                await slow
            assert not conn.closed
            # The late answer goes out before "after" is asked, so it reaches the connection
            # first, and is discarded.
            slow_metadata.release.set()
            await slow_metadata.answered.wait()
            after = await conn.send(ask("after"), timeout_ms=30_000)
            assert after.topics[0].name == "after"
            assert not conn.closed
            await conn.close()

    asyncio.run(main())


def test_server_closing_mid_request_fails_every_request_in_flight() -> None:
    async def handler(header: RequestHeader, request: Any) -> Any:
        if header.request_api_key == ApiKey.METADATA:
            if request.topics[0].name == "boom":
                await asyncio.sleep(0.05)
                return CLOSE
            return NO_ANSWER  # still pending when the socket closes
        return None

    async def main() -> None:
        async with ScriptedBroker(handler) as broker:
            conn = BrokerConnection("127.0.0.1", broker.port)
            await conn.connect()
            pending = [asyncio.ensure_future(conn.send(ask(f"p{i}"))) for i in range(5)]
            boom = asyncio.ensure_future(conn.send(ask("boom")))
            results = await asyncio.gather(*pending, boom, return_exceptions=True)
            assert all(isinstance(r, KafkaConnectionError) for r in results), results
            assert conn.closed
            with pytest.raises(KafkaConnectionError):
                await conn.send(ask("later"))

    asyncio.run(main())


def test_close_fails_requests_in_flight() -> None:
    async def main() -> None:
        async with ScriptedBroker(
            lambda h, r: NO_ANSWER if h.request_api_key == ApiKey.METADATA else None
        ) as broker:
            conn = BrokerConnection("127.0.0.1", broker.port)
            await conn.connect()
            pending = asyncio.ensure_future(conn.send(ask("x")))
            await asyncio.sleep(0.01)
            await conn.close()
            with pytest.raises(KafkaConnectionError):
                await pending
            assert conn.closed

    asyncio.run(main())


def test_acks_zero_produce_expects_no_answer_and_keeps_the_stream_in_step() -> None:
    async def main() -> None:
        async with ScriptedBroker(
            echo_metadata,
            {ApiKey.API_VERSIONS: (0, 4), ApiKey.PRODUCE: (3, 9), ApiKey.METADATA: (0, 12)},
        ) as broker:
            conn = BrokerConnection("127.0.0.1", broker.port)
            await conn.connect()
            request = ProduceRequest(
                acks=0,
                timeout_ms=1000,
                topic_data=[TopicProduceData("t", [PartitionProduceData(0, build_values([b"v"]))])],
            )
            await conn.send_no_response(request)
            response = await conn.send(ask("next"))
            assert response.topics[0].name == "next"
            ((header, produced),) = broker.received(ApiKey.PRODUCE)
            assert header.request_api_version == 9
            assert produced.acks == 0
            assert bytes(produced.topic_data[0].partition_data[0].records) == bytes(
                build_values([b"v"])
            )
            await conn.close()

    asyncio.run(main())


def test_unreachable_server_is_a_connection_error() -> None:
    async def main() -> None:
        conn = BrokerConnection("127.0.0.1", pick_free_port())
        with pytest.raises(KafkaConnectionError, match="cannot connect"):
            await conn.connect(timeout_s=5)
        assert conn.closed

    asyncio.run(main())


def test_a_server_that_never_answers_apiversions_times_out_the_connect() -> None:
    async def main() -> None:
        async with ScriptedBroker(lambda h, r: NO_ANSWER) as broker:
            conn = BrokerConnection("127.0.0.1", broker.port)
            started = time.monotonic()
            with pytest.raises(KafkaConnectionError, match="timed out"):
                await conn.connect(timeout_s=0.2)
            assert time.monotonic() - started < 5
            assert conn.closed

    asyncio.run(main())


def test_garbage_frames_close_the_connection() -> None:
    def handler(header: RequestHeader, request: Any) -> Any:
        if header.request_api_key == ApiKey.METADATA:
            # a size prefix far above the frame limit (an HTTP server would send "HTTP")
            return struct.pack(">i", 2**31 - 1) + b"x" * 10
        return None

    async def main() -> None:
        async with ScriptedBroker(handler) as broker:
            conn = BrokerConnection("127.0.0.1", broker.port, max_frame_bytes=1 << 20)
            await conn.connect()
            with pytest.raises(KafkaConnectionError, match="bad frame"):
                await conn.send(ask("x"))
            assert conn.closed

    asyncio.run(main())


def test_an_answer_to_an_unknown_correlation_id_closes_the_connection() -> None:
    def handler(header: RequestHeader, request: Any) -> Any:
        if header.request_api_key == ApiKey.METADATA:
            body = struct.pack(">i", header.correlation_id + 1000) + b"\x00" * 16
            return struct.pack(">i", len(body)) + body
        return None

    async def main() -> None:
        async with ScriptedBroker(handler) as broker:
            conn = BrokerConnection("127.0.0.1", broker.port)
            await conn.connect()
            with pytest.raises(KafkaConnectionError, match="unknown correlation id"):
                await conn.send(ask("x"))
            assert conn.closed

    asyncio.run(main())


def test_a_malformed_body_fails_that_request_only() -> None:
    def handler(header: RequestHeader, request: Any) -> Any:
        if header.request_api_key == ApiKey.METADATA and request.topics[0].name == "bad":
            body = struct.pack(">i", header.correlation_id) + b"\x01"  # truncated body
            return struct.pack(">i", len(body)) + body
        return echo_metadata(header, request)

    async def main() -> None:
        async with ScriptedBroker(handler) as broker:
            conn = BrokerConnection("127.0.0.1", broker.port)
            await conn.connect()
            with pytest.raises(KafkaConnectionError, match="malformed Metadata"):
                await conn.send(ask("bad"))
            assert (await conn.send(ask("good"))).topics[0].name == "good"
            await conn.close()

    asyncio.run(main())


# -- against the real tansu broker ----------------------------------------------------------


def test_tansu_negotiation_and_pipelined_metadata(tansu: str) -> None:
    host, port = tansu.rsplit(":", 1)

    async def main() -> None:
        conn = BrokerConnection(host, int(port))
        await conn.connect()
        for api in (ApiKey.PRODUCE, ApiKey.FETCH, ApiKey.METADATA, ApiKey.LIST_OFFSETS):
            assert conn.api_version_range(api) is not None
        responses = await asyncio.gather(
            *(conn.send(MetadataRequest(topics=None)) for _ in range(100))
        )
        assert len({r.cluster_id for r in responses}) == 1
        assert all(r.brokers[0].port == int(port) for r in responses)
        await conn.close()
        assert conn.closed

    asyncio.run(main())


def test_a_cancelled_request_leaves_the_connection_usable() -> None:
    async def handler(header: RequestHeader, request: Any) -> Any:
        if header.request_api_key == ApiKey.METADATA and request.topics[0].name == "slow":
            await asyncio.sleep(0.1)
        return echo_metadata(header, request)

    async def main() -> None:
        async with ScriptedBroker(handler) as broker:
            conn = BrokerConnection("127.0.0.1", broker.port)
            await conn.connect()
            slow = asyncio.ensure_future(conn.send(ask("slow")))
            await asyncio.sleep(0.01)
            slow.cancel()
            with pytest.raises(asyncio.CancelledError):
                await slow
            await asyncio.sleep(0.15)  # its answer arrives and is dropped
            assert (await conn.send(ask("next"))).topics[0].name == "next"
            assert not conn.closed
            await conn.close()

    asyncio.run(main())


def test_an_answer_to_an_acks_zero_request_is_dropped() -> None:
    # Kafka never answers acks=0; tansu 0.6 does. Neither may break the stream.
    def handler(header: RequestHeader, request: Any) -> Any:
        if header.request_api_key == ApiKey.PRODUCE:
            return ProduceResponse()
        return echo_metadata(header, request)

    versions = {ApiKey.API_VERSIONS: (0, 4), ApiKey.PRODUCE: (3, 9), ApiKey.METADATA: (0, 12)}

    async def main() -> None:
        async with ScriptedBroker(handler, versions) as broker:
            conn = BrokerConnection("127.0.0.1", broker.port)
            await conn.connect()
            request = ProduceRequest(
                acks=0,
                timeout_ms=1000,
                topic_data=[TopicProduceData("t", [PartitionProduceData(0, build_values([b"v"]))])],
            )
            for i in range(3):
                await conn.send_no_response(request)
                assert (await conn.send(ask(f"m{i}"))).topics[0].name == f"m{i}"
            assert not conn.closed
            await conn.close()

    asyncio.run(main())


def test_request_futures_answer_time_out_alone_and_drop_late_or_cancelled_answers() -> None:
    """``request_future`` (the replica fetchers' path: no task per request): the future gets
    its own answer; one that times out fails alone with RequestTimedOutError, as does a
    cancelled one, and their late answers are dropped with the connection kept."""
    async def main() -> None:
        slow_metadata = SlowMetadata(slow_requests=2)
        async with ScriptedBroker(slow_metadata) as broker:
            conn = BrokerConnection("127.0.0.1", broker.port)
            await conn.connect()
            version = conn.pick_version(ApiKey.METADATA)
            slow = conn.request_future(ask("slow"), version, 100)
            dropped = conn.request_future(ask("slow"), version, 30_000)
            dropped.cancel()
            fast = conn.request_future(ask("fast"), version, 30_000)
            with pytest.raises(RequestTimedOutError, match="Metadata"):
                await slow
            assert (await fast).topics[0].name == "fast"
            # Both late answers go out before "after" is asked, and are discarded.
            slow_metadata.release.set()
            await slow_metadata.answered.wait()
            after = conn.request_future(ask("after"), version, 30_000)
            assert (await after).topics[0].name == "after"
            assert not conn.closed
            await conn.close()

    asyncio.run(main())
