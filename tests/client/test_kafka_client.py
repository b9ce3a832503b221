"""KafkaClient: bootstrap failover, metadata, typed data/admin helpers and retries.

Round trips run against the real tansu broker; leader moves and bounded retries against
scripted peers (a real single broker never moves a leader on demand).
"""

from __future__ import annotations

import asyncio

import pytest
from kafka_peer import ScriptedBroker, metadata_answer

from tidelog.client.cluster import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    RESOURCE_TOPIC,
    KafkaClient,
    NewTopic,
    parse_bootstrap_servers,
)
from tidelog.client.errors import BrokerResponseError, NoBrokersAvailableError
from tidelog.client.metadata import TopicPartition
from tidelog.cluster.zookeeper import pick_free_port
from tidelog.protocol.api_keys import ApiKey
from tidelog.protocol.errors import ErrorCode
from tidelog.protocol.messages.fetch import FetchableTopicResponse, FetchResponse, PartitionData
from tidelog.protocol.messages.list_offsets import (
    ListOffsetsPartitionResponse,
    ListOffsetsResponse,
    ListOffsetsTopicResponse,
)
from tidelog.protocol.messages.offset_for_leader_epoch import (
    EpochEndOffset,
    OffsetForLeaderEpochResponse,
    OffsetForLeaderTopicResult,
)
from tidelog.protocol.messages.produce import (
    PartitionProduceResponse,
    ProduceResponse,
    TopicProduceResponse,
)
from tidelog.protocol.records import (
    GZIP,
    LZ4,
    NONE,
    SNAPPY,
    ZSTD,
    Record,
    build_batch,
    build_values,
    iter_batches,
    iter_records,
)


def test_bootstrap_server_lists_parse_and_bad_ones_are_clear_errors() -> None:
    assert parse_bootstrap_servers("a:1, b:2") == [("a", 1), ("b", 2)]
    assert parse_bootstrap_servers(["PLAINTEXT://h:9092", "[::1]:9093"]) == [
        ("h", 9092),
        ("::1", 9093),
    ]
    for bad in ("", "host", "host:", "host:port", "h:70000", ","):
        with pytest.raises(ValueError):
            parse_bootstrap_servers(bad)


def test_bootstrap_fails_over_to_the_next_server(tansu: str) -> None:
    async def main() -> None:
        dead = f"127.0.0.1:{pick_free_port()}"
        async with KafkaClient(f"{dead},{tansu}") as client:
            (broker,) = client.metadata.brokers.values()
            assert f"{broker.host}:{broker.port}" == tansu
            assert client.metadata.controller_id == broker.node_id
            # the bootstrap connection was adopted as that broker's pooled connection
            conn = await client.connection(broker.node_id)
            assert (conn.host, conn.port, conn.node_id) == (
                broker.host,
                broker.port,
                broker.node_id,
            )

    asyncio.run(main())


def test_no_reachable_server_is_a_clear_error() -> None:
    async def main() -> None:
        client = KafkaClient([f"127.0.0.1:{pick_free_port()}", f"127.0.0.1:{pick_free_port()}"], retries=1)
        with pytest.raises(NoBrokersAvailableError, match="cannot connect"):
            await client.start()
        await client.close()

    asyncio.run(main())


def test_create_describe_and_delete_topics(tansu: str, topic_name: str) -> None:
    async def main() -> None:
        async with KafkaClient(tansu, retries=1, retry_backoff_ms=10) as client:
            created = await client.create_topics(
                [NewTopic(topic_name, 3, 1, configs={"retention.ms": "3600000"})]
            )
            assert created == {topic_name: None}
            assert client.metadata.partitions_for(topic_name) == [0, 1, 2]
            leader = client.leader_for(TopicPartition(topic_name, 1))
            assert leader in client.metadata.brokers
            again = await client.create_topics([NewTopic(topic_name, 3, 1)])
            error = again[topic_name]
            assert error is not None and error.code == ErrorCode.TOPIC_ALREADY_EXISTS
            configs = await client.describe_configs([(RESOURCE_TOPIC, topic_name)])
            assert (RESOURCE_TOPIC, topic_name) in configs
            deleted = await client.delete_topics([topic_name])
            assert deleted == {topic_name: None}
            with pytest.raises(BrokerResponseError) as info:
                await client.partitions_for(topic_name, refresh=True)
            assert info.value.code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION

    asyncio.run(main())


@pytest.mark.parametrize("codec", [NONE, GZIP, SNAPPY, LZ4, ZSTD], ids=lambda c: str(c))
def test_produce_and_fetch_round_trip_in_every_compression(
    tansu: str, topic_name: str, codec: int
) -> None:
    records = [
        Record(
            value=f"value-{i}".encode() * (i % 7 + 1), key=f"k{i}".encode(), headers=(("h", b"x"),)
        )
        for i in range(50)
    ] + [Record(value=None, key=b"tombstone"), Record(value=b"", key=None)]

    async def main() -> None:
        async with KafkaClient(tansu) as client:
            await client.create_topics([NewTopic(topic_name, 1, 1)])
            tp = TopicPartition(topic_name, 0)
            first = build_batch(records, compression=codec, now_ms=1_700_000_000_000)
            second = build_values([b"after"], compression=codec)
            assert await client.produce(tp, first) == (ErrorCode.NONE, 0)
            assert await client.produce(tp, second, acks=1) == (ErrorCode.NONE, len(records))
            result = await client.fetch(tp, 0, max_wait_ms=100)
            assert result.error == ErrorCode.NONE
            assert result.high_watermark == len(records) + 1
            (fetched_first, fetched_second) = list(iter_batches(result.records))
            assert fetched_first.compression_type == codec
            got = list(iter_records(result.records))
            assert [r.offset for r in got] == list(range(len(records) + 1))
            assert [(r.key, r.value) for r in got] == [(r.key, r.value) for r in records] + [
                (None, b"after")
            ]
            assert got[0].headers == (("h", b"x"),)
            assert got[0].timestamp == 1_700_000_000_000

    asyncio.run(main())


def test_list_offsets_earliest_and_latest(tansu: str, topic_name: str) -> None:
    async def main() -> None:
        async with KafkaClient(tansu) as client:
            await client.create_topics([NewTopic(topic_name, 2, 1)])
            tp0, tp1 = TopicPartition(topic_name, 0), TopicPartition(topic_name, 1)
            # single-record batches: tansu answers LATEST with the last batch's base offset + 1
            for i in range(4):
                await client.produce(tp0, build_values([b"%d" % i]))
            offsets = await client.list_offsets({tp0: LATEST_TIMESTAMP, tp1: LATEST_TIMESTAMP})
            assert (offsets[tp0].error, offsets[tp0].offset) == (ErrorCode.NONE, 4)
            assert offsets[tp1].offset == 0
            earliest = await client.list_offsets({tp0: EARLIEST_TIMESTAMP})
            assert earliest[tp0].offset == 0

    asyncio.run(main())


def test_unknown_topic_is_returned_after_bounded_retries(tansu: str, topic_name: str) -> None:
    async def main() -> None:
        async with KafkaClient(tansu, retries=2, retry_backoff_ms=10) as client:
            tp = TopicPartition(topic_name, 0)
            code, offset = await client.produce(tp, build_values([b"x"]))
            assert (code, offset) == (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1)
            result = await client.fetch(tp, 0)
            assert result.error == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION

    asyncio.run(main())


# -- scripted peers: leader moves, bounded retries, versions tansu lacks ---------------------


class TwoBrokers:
    """Nodes 1 and 2 on scripted peers sharing one view of who leads ("t", 0)."""

    def __init__(self) -> None:
        self.leader = 1
        self.nodes = {1: ScriptedBroker(self.handler(1)), 2: ScriptedBroker(self.handler(2))}
        self.produce_answer = ErrorCode.NONE

    def handler(self, node: int):  # type: ignore[no-untyped-def]
        def answer(header, request):  # type: ignore[no-untyped-def]
            key = header.request_api_key
            if key == ApiKey.METADATA:
                ports = {n: b.port for n, b in self.nodes.items()}
                return metadata_answer(ports, {("t", 0): self.leader}, leader_epoch=self.leader)
            if key == ApiKey.PRODUCE:
                if node != self.leader:
                    code = ErrorCode.NOT_LEADER_OR_FOLLOWER
                else:
                    code = self.produce_answer
                return ProduceResponse(
                    responses=[
                        TopicProduceResponse(
                            "t", [PartitionProduceResponse(0, code, 100 * node if not code else -1)]
                        )
                    ]
                )
            if key == ApiKey.FETCH:
                code = ErrorCode.NOT_LEADER_OR_FOLLOWER if node != self.leader else 0
                return FetchResponse(
                    responses=[
                        FetchableTopicResponse(
                            "t",
                            partitions=[
                                PartitionData(
                                    0, code, high_watermark=7, records=build_values([b"n%d" % node])
                                )
                            ],
                        )
                    ]
                )
            return None

        return answer

    async def __aenter__(self) -> TwoBrokers:
        for broker in self.nodes.values():
            await broker.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        for broker in self.nodes.values():
            await broker.close()


def test_a_moved_leader_is_found_again_after_a_metadata_refresh() -> None:
    async def main() -> None:
        async with TwoBrokers() as cluster:
            async with KafkaClient(cluster.nodes[1].address, retry_backoff_ms=5) as client:
                tp = TopicPartition("t", 0)
                await client.refresh_metadata(["t"])
                assert client.leader_for(tp) == 1
                cluster.leader = 2  # leadership moves; the client's metadata is now stale
                code, offset = await client.produce(tp, build_values([b"x"]))
                assert (code, offset) == (ErrorCode.NONE, 200)
                assert client.leader_for(tp) == 2
                assert len(cluster.nodes[1].received(ApiKey.PRODUCE)) == 1
                assert len(cluster.nodes[2].received(ApiKey.PRODUCE)) == 1
                # fetch: the client's metadata says 2 now, and 2 answers
                result = await client.fetch(tp, 0)
                assert result.error == ErrorCode.NONE
                assert [r.value for r in iter_records(result.records)] == [b"n2"]
                # Fetch is sent at v12 at most (v13+ names topics by id only)
                header, request = cluster.nodes[2].received(ApiKey.FETCH)[0]
                assert header.request_api_version == 12
                assert request.topics[0].partitions[0].current_leader_epoch == 2

    asyncio.run(main())


def test_retriable_errors_are_retried_a_bounded_number_of_times() -> None:
    async def main() -> None:
        async with TwoBrokers() as cluster:
            cluster.produce_answer = ErrorCode.NOT_ENOUGH_REPLICAS
            async with KafkaClient(
                cluster.nodes[1].address, retries=3, retry_backoff_ms=5
            ) as client:
                code, offset = await client.produce(TopicPartition("t", 0), build_values([b"x"]))
                assert (code, offset) == (ErrorCode.NOT_ENOUGH_REPLICAS, -1)
                assert len(cluster.nodes[1].received(ApiKey.PRODUCE)) == 4
            cluster.produce_answer = ErrorCode.MESSAGE_TOO_LARGE  # not retriable: one attempt
            async with KafkaClient(cluster.nodes[1].address, retries=3) as client:
                code, _ = await client.produce(TopicPartition("t", 0), build_values([b"x"]))
                assert code == ErrorCode.MESSAGE_TOO_LARGE
                assert len(cluster.nodes[1].received(ApiKey.PRODUCE)) == 5

    asyncio.run(main())


def test_offsets_for_leader_epoch_asks_the_leader_or_a_given_broker() -> None:
    def handler(header, request):  # type: ignore[no-untyped-def]
        if header.request_api_key == ApiKey.METADATA:
            return metadata_answer({0: broker.port}, {("t", 3): 0}, leader_epoch=9)
        if header.request_api_key == ApiKey.OFFSET_FOR_LEADER_EPOCH:
            asked = request.topics[0].partitions[0]
            return OffsetForLeaderEpochResponse(
                topics=[
                    OffsetForLeaderTopicResult(
                        "t", [EpochEndOffset(0, asked.partition, asked.leader_epoch - 1, 1234)]
                    )
                ]
            )
        return None

    broker = ScriptedBroker(handler)

    async def main() -> None:
        async with broker:
            async with KafkaClient(broker.address) as client:
                tp = TopicPartition("t", 3)
                result = await client.offsets_for_leader_epoch(tp, 5, current_leader_epoch=9)
                assert (result.error, result.leader_epoch, result.offset) == (
                    ErrorCode.NONE,
                    4,
                    1234,
                )
                await client.offsets_for_leader_epoch(tp, 5, replica_id=7, broker_id=0)
                sent = [r for _, r in broker.received(ApiKey.OFFSET_FOR_LEADER_EPOCH)]
                assert [r.replica_id for r in sent] == [-2, 7]
                assert sent[0].topics[0].partitions[0].current_leader_epoch == 9

    asyncio.run(main())


def test_list_offsets_asks_each_leader_once_and_retries_moved_partitions() -> None:
    leaders = {0: 1, 1: 2}

    def handler(node: int):  # type: ignore[no-untyped-def]
        def answer(header, request):  # type: ignore[no-untyped-def]
            if header.request_api_key == ApiKey.METADATA:
                ports = {n: b.port for n, b in nodes.items()}
                return metadata_answer(ports, {("t", p): n for p, n in leaders.items()})
            if header.request_api_key == ApiKey.LIST_OFFSETS:
                parts = [
                    ListOffsetsPartitionResponse(
                        p.partition_index,
                        0 if leaders[p.partition_index] == node else 6,  # NOT_LEADER
                        offset=100 * node + p.partition_index,
                    )
                    for p in request.topics[0].partitions
                ]
                return ListOffsetsResponse(topics=[ListOffsetsTopicResponse("t", parts)])
            return None

        return answer

    nodes = {1: ScriptedBroker(handler(1)), 2: ScriptedBroker(handler(2))}

    async def main() -> None:
        for broker in nodes.values():
            await broker.start()
        try:
            async with KafkaClient(nodes[1].address, retry_backoff_ms=5) as client:
                tp0, tp1 = TopicPartition("t", 0), TopicPartition("t", 1)
                got = await client.list_offsets({tp0: LATEST_TIMESTAMP, tp1: LATEST_TIMESTAMP})
                assert {tp: r.offset for tp, r in got.items()} == {tp0: 100, tp1: 201}
                assert len(nodes[1].received(ApiKey.LIST_OFFSETS)) == 1
                assert len(nodes[2].received(ApiKey.LIST_OFFSETS)) == 1
                leaders[1] = 1  # partition 1 moves; the client's metadata still says node 2
                got = await client.list_offsets({tp0: LATEST_TIMESTAMP, tp1: LATEST_TIMESTAMP})
                assert {tp: (r.error, r.offset) for tp, r in got.items()} == {
                    tp0: (ErrorCode.NONE, 100),
                    tp1: (ErrorCode.NONE, 101),
                }
                asked_2 = nodes[2].received(ApiKey.LIST_OFFSETS)[-1][1]
                assert [p.partition_index for p in asked_2.topics[0].partitions] == [1]
        finally:
            for broker in nodes.values():
                await broker.close()

    asyncio.run(main())


def test_metadata_older_than_its_max_age_is_refreshed() -> None:
    partitions = [0]

    def handler(header, request):  # type: ignore[no-untyped-def]
        if header.request_api_key == ApiKey.METADATA:
            return metadata_answer({0: broker.port}, {("t", p): 0 for p in partitions})
        return None

    broker = ScriptedBroker(handler)

    async def main() -> None:
        async with broker:
            async with KafkaClient(broker.address, metadata_max_age_ms=100) as client:
                assert await client.partitions_for("t") == [0]
                partitions.append(1)  # a partition is added
                assert await client.partitions_for("t") == [0]  # cached, still fresh
                await asyncio.sleep(0.15)
                assert client.metadata_stale
                assert await client.partitions_for("t") == [0, 1]
                assert not client.metadata_stale

    asyncio.run(main())


def test_produce_with_acks_zero_writes_without_an_answer(tansu: str, topic_name: str) -> None:
    async def main() -> None:
        async with KafkaClient(tansu) as client:
            await client.create_topics([NewTopic(topic_name, 1, 1)])
            tp = TopicPartition(topic_name, 0)
            assert await client.produce(tp, build_values([b"a", b"b"]), acks=0) == (
                ErrorCode.NONE,
                -1,
            )
            # the connection stays in step: the next answered request gets its own answer
            assert await client.produce(tp, build_values([b"c"]), acks=1) == (ErrorCode.NONE, 2)
            result = await client.fetch(tp, 0)
            assert [r.value for r in iter_records(result.records)] == [b"a", b"b", b"c"]

    asyncio.run(main())
