"""The broker's AlterPartition transport to the controller (`broker.alter_partition.
ControllerAlterPartitionTransport`): what goes on the wire. The controller is a small listener
that records the requests and answers them with no partition (a boundary mock: the test is
about the request the broker sends, not the controller's decision)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from tidelog.broker.alter_partition import ControllerAlterPartitionTransport
from tidelog.cluster.zookeeper import pick_free_port
from tidelog.protocol.api_keys import ApiKey, api_spec
from tidelog.protocol.api_versions import api_versions_response
from tidelog.protocol.codec import decode_request, encode_response
from tidelog.protocol.framing import FrameReader
from tidelog.protocol.messages import alter_partition as m_ap
from tidelog.replication.types import ProposeIsr, TopicPartition
from tidelog.shell.alter_partition_manager import AlterPartitionAnswer

OLD_ID, NEW_ID = uuid.UUID(int=1), uuid.UUID(int=2)
TP = TopicPartition("t", 0)


def proposal(isr: tuple[int, ...]) -> ProposeIsr:
    return ProposeIsr(TP, 1, 3, isr, 5, 1, tuple((b, -1) for b in isr))


async def topic_ids_sent(sends: list[tuple[ProposeIsr, uuid.UUID]]) -> list[uuid.UUID]:
    """Send each proposal in turn, the broker's topic id lookup answering the id given with
    it; the topic ids the controller received, in order."""
    received: list[uuid.UUID] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        frames = FrameReader()
        while data := await reader.read(65536):
            for frame in frames.feed(data):
                header, body = decode_request(frame)
                key, version = header.request_api_key, header.request_api_version
                response: Any = api_versions_response()
                if key == ApiKey.ALTER_PARTITION:
                    received.extend(t.topic_id for t in body.topics)
                    response = m_ap.AlterPartitionResponse()
                hv = api_spec(key).response_header_version(version)
                writer.writelines(encode_response(hv, header.correlation_id, response, version))
                await writer.drain()
        writer.close()

    port = pick_free_port()
    server = await asyncio.start_server(serve, "127.0.0.1", port)
    lookup = {"t": OLD_ID}
    transport = ControllerAlterPartitionTransport(
        1, lambda: 0, lambda _b: ("127.0.0.1", port), lambda topic: lookup[topic])
    try:
        for prop, topic_id in sends:
            lookup["t"] = topic_id
            done: asyncio.Future[AlterPartitionAnswer | None] = (
                asyncio.get_running_loop().create_future())
            transport.send(11, [prop], done.set_result)
            assert await asyncio.wait_for(done, 10) is not None
    finally:
        await transport.shutdown()
        server.close()
        await server.wait_closed()
    return received


def test_a_proposal_sent_again_names_the_topic_id_it_was_first_sent_with() -> None:
    """Kafka's AlterPartitionItem keeps the topic id of its submission: a proposal still
    waiting when its topic was deleted and created again is answered UNKNOWN_TOPIC_ID, not
    checked against (and written to) the new topic's partition. A new proposal names the
    topic id the broker knows now."""
    waiting = proposal((1, 2))
    assert asyncio.run(topic_ids_sent([(waiting, OLD_ID), (waiting, NEW_ID),
                                       (proposal((1, 2, 3)), NEW_ID)])) == [
        OLD_ID, OLD_ID, NEW_ID]
