"""`BrokerConnections` (the transaction marker sender's and the transaction verification's
inter-broker client) against a real local socket server: a send that fails drops its own
connection only, never a newer one a concurrent send opened meanwhile."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pytest
from client.kafka_peer import ScriptedBroker

from tidelog.client.errors import RequestTimedOutError, UnsupportedVersionError
from tidelog.coordinator.transaction.asyncio_driver import BrokerConnections
from tidelog.protocol.api_keys import ApiKey
from tidelog.protocol.headers import RequestHeader
from tidelog.protocol.messages import metadata as m_md
from tidelog.protocol.messages import produce as m_produce


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int


class Cache:
    """The metadata cache: broker 2 at the scripted server (the boundary this test is not
    about)."""

    def __init__(self, port: int) -> None:
        self.port = port

    def endpoint(self, broker_id: int) -> Endpoint:
        return Endpoint("127.0.0.1", self.port)


def metadata(topic: str) -> m_md.MetadataRequest:
    return m_md.MetadataRequest(topics=[m_md.MetadataRequestTopic(name=topic)])


async def until(condition: Any, what: str) -> None:
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_send_failing_late_leaves_the_newer_connection_alone() -> None:
    async def go() -> None:
        release = asyncio.Event()

        async def handler(header: RequestHeader, body: Any) -> Any:
            if header.request_api_key != ApiKey.METADATA:
                return None
            if body.topics[0].name == "second":
                await release.wait()
            return m_md.MetadataResponse()

        async with ScriptedBroker(handler) as server:
            conns = BrokerConnections(1, Cache(server.port), "test", request_timeout_ms=8000)
            try:
                await conns.send(2, metadata("warm"))  # connection A
                first = conns._connections[2]
                # The peer stops reading A: a large request stays in A's write buffer, its
                # send waiting to write until its request timeout.
                for writer in server._writers:
                    writer.transport.pause_reading()
                stuck = asyncio.create_task(conns.send(2, m_produce.ProduceRequest(
                    acks=1, timeout_ms=1000, topic_data=[m_produce.TopicProduceData("t", [
                        m_produce.PartitionProduceData(0, bytes(32 << 20))])])))
                await until(lambda: first._transport is not None
                            and first._transport.get_write_buffer_size() > 0, "a full buffer")
                # The sends share the request timeout: the one on B must still have a
                # while to wait when the stuck one gives up (3 s here), and B must be open
                # before that (5 s): margins wide enough for a loaded CI machine.
                await asyncio.sleep(3)
                # Another send fails on A at once: A is dropped and closed (its unsent bytes
                # keep the stuck send waiting).
                with pytest.raises(UnsupportedVersionError):
                    await conns.send(2, metadata("bad"), api_version=999)
                second = asyncio.create_task(conns.send(2, metadata("second")))  # connection B
                await until(lambda: any(b.topics[0].name == "second"
                                        for _, b in server.received(ApiKey.METADATA)),
                            "the second request at the server")
                assert not stuck.done(), "the machine was too slow for this ordering"
                with pytest.raises(RequestTimedOutError):
                    await stuck
                release.set()
                assert isinstance(await second, m_md.MetadataResponse)
                assert conns._connections[2] is not first and not conns._connections[2].closed
            finally:
                await conns.close()

    asyncio.run(asyncio.wait_for(go(), 60))
