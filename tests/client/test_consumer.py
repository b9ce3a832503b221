"""Consumer: assignment, positions, seeking, polling limits, offset resets, leader moves."""

from __future__ import annotations

import asyncio
import time

import pytest
from kafka_peer import ScriptedBroker, metadata_answer

from tidelog.client.cluster import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, KafkaClient, NewTopic
from tidelog.client.consumer import (
    OFFSET_BEGINNING,
    OFFSET_END,
    Consumer,
    OffsetOutOfRangeError,
)
from tidelog.client.metadata import TopicPartition
from tidelog.client.producer import Producer
from tidelog.protocol.api_keys import ApiKey
from tidelog.protocol.errors import ErrorCode
from tidelog.protocol.messages.fetch import FetchableTopicResponse, FetchResponse, PartitionData
from tidelog.protocol.messages.list_offsets import (
    ListOffsetsPartitionResponse,
    ListOffsetsResponse,
    ListOffsetsTopicResponse,
)
from tidelog.protocol.records import Record, build_batch


async def poll_until(consumer: Consumer, count: int, timeout_s: float = 10) -> list:
    records: list = []
    deadline = time.monotonic() + timeout_s
    while len(records) < count and time.monotonic() < deadline:
        records += await consumer.poll(max_records=1000, timeout_ms=200)
    return records


@pytest.mark.parametrize("compression", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_reads_back_what_the_producer_wrote_in_every_compression(
    tansu: str, topic_name: str, compression: str
) -> None:
    async def main() -> None:
        async with KafkaClient(tansu) as client:
            await client.create_topics([NewTopic(topic_name, 3, 1)])
            sent: dict[int, list[tuple[bytes, bytes, tuple]]] = {0: [], 1: [], 2: []}
            async with Producer(client, compression=compression, batch_size=2000) as producer:
                futures = []
                for i in range(300):
                    key, value = b"key-%d" % (i % 17), b"value-%d-" % i + b"x" * (i % 50)
                    headers = (("i", b"%d" % i), ("none", None)) if i % 3 == 0 else ()
                    future = await producer.send(topic_name, value, key=key, headers=headers)
                    futures.append((key, value, headers, future))
                await producer.flush()
            for key, value, headers, future in futures:
                tp, offset = future.result()
                assert offset == len(sent[tp.partition])
                sent[tp.partition].append((key, value, headers))
            consumer = Consumer(client, auto_offset_reset="earliest")
            consumer.assign([TopicPartition(topic_name, p) for p in range(3)])
            records = await poll_until(consumer, 300)
            assert len(records) == 300
            for p in range(3):
                mine = [r for r in records if r.partition == p]
                assert [r.offset for r in mine] == list(range(len(sent[p])))
                assert [(r.key, r.value, r.headers) for r in mine] == sent[p]
                assert consumer.position(TopicPartition(topic_name, p)) == len(sent[p])
            assert await consumer.poll(timeout_ms=100) == []

    asyncio.run(main())


def test_assign_seek_and_positions(tansu: str, topic_name: str) -> None:
    async def main() -> None:
        async with KafkaClient(tansu) as client:
            await client.create_topics([NewTopic(topic_name, 1, 1)])
            tp = TopicPartition(topic_name, 0)
            for i in range(10):  # one record per batch (see tansu's LATEST note in test_cluster)
                await client.produce(tp, build_batch([Record(b"%d" % i)]))
            consumer = Consumer(client)  # auto.offset.reset=latest
            consumer.assign([(tp, 4)])
            assert consumer.assignment() == {tp}
            assert consumer.position(tp) == 4
            first = await consumer.poll(max_records=3)
            assert [r.offset for r in first] == [4, 5, 6]
            assert consumer.position(tp) == 7  # the rest is buffered, not skipped
            rest = await consumer.poll()
            assert [r.value for r in rest] == [b"7", b"8", b"9"]
            consumer.seek(tp, 1)
            assert [r.offset for r in await consumer.poll(max_records=2)] == [1, 2]
            consumer.seek_to_end()
            assert await consumer.poll(timeout_ms=100) == []
            assert consumer.position(tp) == 10
            await client.produce(tp, build_batch([Record(b"new")]))
            assert [r.value for r in await poll_until(consumer, 1)] == [b"new"]
            consumer.seek_to_beginning(tp)
            assert (await consumer.poll(max_records=1))[0].offset == 0
            consumer.assign([tp])  # no offset: auto.offset.reset=latest
            assert await consumer.poll(timeout_ms=50) == []
            assert consumer.position(tp) == 11
            with pytest.raises(ValueError, match="not assigned"):
                consumer.seek(TopicPartition(topic_name, 9), 0)

    asyncio.run(main())


def test_poll_returns_empty_within_its_timeout(tansu: str, topic_name: str) -> None:
    async def main() -> None:
        async with KafkaClient(tansu) as client:
            await client.create_topics([NewTopic(topic_name, 1, 1)])
            consumer = Consumer(client, auto_offset_reset="earliest", fetch_max_wait_ms=100)
            consumer.assign([TopicPartition(topic_name, 0)])
            started = time.monotonic()
            assert await consumer.poll(timeout_ms=300) == []
            assert time.monotonic() - started < 5

    asyncio.run(main())


# -- scripted peers ----------------------------------------------------------------------


class FetchScript:
    """Node 0 leads ("t", 0) holding offsets [log_start, log_end); out-of-range fetches are
    answered OFFSET_OUT_OF_RANGE. ``leader`` may move to node 1 (a second scripted broker)."""

    def __init__(self, log_start: int, log_end: int) -> None:
        self.log_start, self.log_end = log_start, log_end
        self.leader = 0
        self.nodes = {0: ScriptedBroker(self.handler(0)), 1: ScriptedBroker(self.handler(1))}

    def handler(self, node: int):  # type: ignore[no-untyped-def]
        def answer(header, request):  # type: ignore[no-untyped-def]
            key = header.request_api_key
            if key == ApiKey.METADATA:
                ports = {n: b.port for n, b in self.nodes.items()}
                return metadata_answer(ports, {("t", 0): self.leader})
            if key == ApiKey.LIST_OFFSETS:
                ts = request.topics[0].partitions[0].timestamp
                offset = self.log_start if ts == EARLIEST_TIMESTAMP else self.log_end
                return ListOffsetsResponse(
                    topics=[
                        ListOffsetsTopicResponse(
                            "t", [ListOffsetsPartitionResponse(0, 0, offset=offset)]
                        )
                    ]
                )
            if key == ApiKey.FETCH:
                offset = request.topics[0].partitions[0].fetch_offset
                records = None
                if node != self.leader:
                    code = ErrorCode.NOT_LEADER_OR_FOLLOWER
                elif not self.log_start <= offset <= self.log_end:
                    code = ErrorCode.OFFSET_OUT_OF_RANGE
                else:
                    code = ErrorCode.NONE
                    if offset < self.log_end:
                        records = build_batch(
                            [Record(b"n%d-%d" % (node, o)) for o in range(offset, self.log_end)],
                            base_offset=offset,
                        )
                return FetchResponse(
                    responses=[
                        FetchableTopicResponse(
                            "t",
                            partitions=[
                                PartitionData(0, code, high_watermark=self.log_end, records=records)
                            ],
                        )
                    ]
                )
            return None

        return answer

    async def __aenter__(self) -> FetchScript:
        for broker in self.nodes.values():
            await broker.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        for broker in self.nodes.values():
            await broker.close()


@pytest.mark.parametrize(
    ("reset", "expected_offsets"), [("earliest", [10, 11, 12]), ("latest", [])]
)
def test_offset_out_of_range_resets_per_auto_offset_reset(
    reset: str, expected_offsets: list[int]
) -> None:
    async def main() -> None:
        async with FetchScript(10, 13) as script:
            async with KafkaClient(script.nodes[0].address) as client:
                await client.refresh_metadata(["t"])
                consumer = Consumer(client, auto_offset_reset=reset)
                tp = TopicPartition("t", 0)
                consumer.assign([(tp, 500)])
                records = await consumer.poll(timeout_ms=300)
                assert [r.offset for r in records] == expected_offsets
                assert consumer.position(tp) == 13
                asked = [
                    r.topics[0].partitions[0].timestamp
                    for _, r in script.nodes[0].received(ApiKey.LIST_OFFSETS)
                ]
                assert asked == [EARLIEST_TIMESTAMP if reset == "earliest" else LATEST_TIMESTAMP]

    asyncio.run(main())


def test_offset_out_of_range_without_a_reset_policy_is_an_error() -> None:
    async def main() -> None:
        async with FetchScript(10, 13) as script:
            async with KafkaClient(script.nodes[0].address) as client:
                await client.refresh_metadata(["t"])
                consumer = Consumer(client, auto_offset_reset="none")
                tp = TopicPartition("t", 0)
                consumer.assign([(tp, 2)])
                with pytest.raises(OffsetOutOfRangeError) as info:
                    await consumer.poll(timeout_ms=300)
                assert (info.value.topic_partition, info.value.offset) == (tp, 2)
                with pytest.raises(ValueError, match="auto.offset.reset is none"):
                    consumer.assign([tp])
                consumer.assign([(tp, OFFSET_BEGINNING)])
                assert [r.offset for r in await consumer.poll()] == [10, 11, 12]
                consumer.seek(tp, OFFSET_END)
                assert await consumer.poll(timeout_ms=50) == []
                assert consumer.position(tp) == 13

    asyncio.run(main())


def test_the_consumer_follows_a_leader_change() -> None:
    async def main() -> None:
        async with FetchScript(0, 2) as script:
            async with KafkaClient(script.nodes[0].address, retry_backoff_ms=5) as client:
                await client.refresh_metadata(["t"])
                consumer = Consumer(client)
                tp = TopicPartition("t", 0)
                consumer.assign([(tp, 0)])
                assert [r.value for r in await consumer.poll()] == [b"n0-0", b"n0-1"]
                script.leader = 1
                script.log_end = 4
                records = await consumer.poll(timeout_ms=2000)
                assert [r.value for r in records] == [b"n1-2", b"n1-3"]
                assert client.leader_for(tp) == 1
                assert (
                    script.nodes[0]
                    .received(ApiKey.FETCH)[-1][1]
                    .topics[0]
                    .partitions[0]
                    .fetch_offset
                    == 2
                )

    asyncio.run(main())
