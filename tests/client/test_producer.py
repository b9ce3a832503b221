"""Producer: batching, Kafka's key partitioning, idempotent sequences, retries, acks=0."""

from __future__ import annotations

import asyncio
import time

import pytest
from kafka_peer import NO_ANSWER, ScriptedBroker, metadata_answer

from tidelog.client.cluster import KafkaClient, NewTopic
from tidelog.client.errors import BrokerResponseError, KafkaConnectionError, RequestTimedOutError
from tidelog.client.metadata import TopicPartition
from tidelog.client.partitioner import murmur2, partition_for_key
from tidelog.client.producer import Producer, parse_acks, parse_compression
from tidelog.protocol.api_keys import ApiKey
from tidelog.protocol.errors import ErrorCode
from tidelog.protocol.messages.init_producer_id import InitProducerIdResponse
from tidelog.protocol.messages.produce import (
    PartitionProduceResponse,
    ProduceResponse,
    TopicProduceResponse,
)
from tidelog.protocol.records import RecordBatch, iter_batches, iter_records


async def batches_of(client: KafkaClient, tp: TopicPartition) -> list[RecordBatch]:
    batches: list[RecordBatch] = []
    offset = 0
    for _ in range(100):
        result = await client.fetch(tp, offset, max_wait_ms=10)
        new = [b for b in iter_batches(bytes(result.records)) if b.next_offset > offset]
        if not new:
            return batches
        batches += new
        offset = new[-1].next_offset
    raise AssertionError("fetch did not reach the end")


def test_murmur2_matches_the_java_client() -> None:
    # values from Kafka's UtilsTest.testMurmur2 (as unsigned 32-bit)
    cases = {
        b"21": -973932308,
        b"foobar": -790332482,
        b"a-little-bit-long-string": -985981536,
        b"a-little-bit-longer-string": -1486304829,
        b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
        bytes([ord("a"), ord("b"), ord("c")]): 479470107,
    }
    for data, java in cases.items():
        assert murmur2(data) == java & 0xFFFFFFFF, data
    assert partition_for_key(b"foobar", 7) == (-790332482 & 0x7FFFFFFF) % 7


def test_settings_are_validated() -> None:
    assert parse_acks("all") == -1 and parse_acks(1) == 1 and parse_acks("0") == 0
    with pytest.raises(ValueError):
        parse_acks("2")
    assert parse_compression("LZ4") == 3 and parse_compression(None) == 0
    with pytest.raises(ValueError, match="compression.type"):
        parse_compression("brotli")
    client = KafkaClient("127.0.0.1:9")
    with pytest.raises(ValueError, match="acks=all"):
        Producer(client, acks=1, enable_idempotence=True)
    Producer(client, acks=1, enable_idempotence=False)


def test_idempotent_batches_carry_the_producer_id_and_consecutive_sequences(
    tansu: str, topic_name: str
) -> None:
    async def main() -> None:
        async with KafkaClient(tansu) as client:
            await client.create_topics([NewTopic(topic_name, 2, 1)])
            async with Producer(client, batch_size=400, linger_ms=2) as producer:
                assert producer.producer_id >= 0
                futures = [
                    await producer.send(topic_name, b"value-%03d" % i, partition=i % 2)
                    for i in range(300)
                ]
                await producer.flush()
                acked = [f.result() for f in futures]
            for partition in (0, 1):
                tp = TopicPartition(topic_name, partition)
                batches = await batches_of(client, tp)
                assert len(batches) > 3  # batch.size split them
                sequence = 0
                for batch in batches:
                    assert batch.producer_id == producer.producer_id
                    assert batch.producer_epoch == producer.producer_epoch
                    assert batch.base_sequence == sequence
                    sequence += batch.record_count
                assert sequence == 150
                # each future's offset is where its value landed
                values = {r.offset: r.value for b in batches for r in iter_records(bytes(b.buf))}
                for i, (got_tp, offset) in enumerate(acked):
                    if got_tp == tp:
                        assert values[offset] == b"value-%03d" % i

    asyncio.run(main())


def test_keys_pick_kafkas_partition_and_keyless_records_stick(tansu: str, topic_name: str) -> None:
    async def main() -> None:
        async with KafkaClient(tansu) as client:
            await client.create_topics([NewTopic(topic_name, 5, 1)])
            async with Producer(client, linger_ms=50) as producer:
                keyed = {
                    key: await producer.send(topic_name, b"v", key=key)
                    for key in (b"alpha", b"beta", b"gamma", b"delta", b"k" * 33)
                }
                keyless = [await producer.send(topic_name, b"n") for _ in range(10)]
                await producer.flush()
            for key, future in keyed.items():
                tp, _ = future.result()
                assert tp.partition == partition_for_key(key, 5)
            # keyless records fill one partition's batch before moving on (KIP-480)
            assert len({f.result()[0] for f in keyless}) == 1

    asyncio.run(main())


def test_acks_zero_delivers_without_offsets(tansu: str, topic_name: str) -> None:
    async def main() -> None:
        async with KafkaClient(tansu) as client:
            await client.create_topics([NewTopic(topic_name, 1, 1)])
            async with Producer(client, acks=0, enable_idempotence=False) as producer:
                futures = [await producer.send(topic_name, b"%d" % i) for i in range(20)]
                await producer.flush()
            assert [f.result()[1] for f in futures] == [-1] * 20
            tp = TopicPartition(topic_name, 0)
            for _ in range(50):  # unacknowledged: the broker appends when it gets to it
                values = [
                    r.value
                    for b in await batches_of(client, tp)
                    for r in iter_records(bytes(b.buf))
                ]
                if len(values) == 20:
                    break
                await asyncio.sleep(0.02)
            assert values == [b"%d" % i for i in range(20)]

    asyncio.run(main())


def test_sending_to_a_missing_topic_asks_the_broker_to_create_it(
    tansu: str, topic_name: str
) -> None:
    # allow.auto.create.topics defaults to true, as in Kafka's producer; tansu creates it.
    async def main() -> None:
        async with KafkaClient(tansu) as client:
            async with Producer(client) as producer:
                future = await producer.send(topic_name, b"x")
                await producer.flush()
                tp, offset = future.result()
            metadata = await client.refresh_metadata([topic_name])
            assert metadata.topics[topic_name].error == ErrorCode.NONE
            assert (tp.topic, offset) == (topic_name, 0)
            assert tp.partition in metadata.topics[topic_name].partitions

    asyncio.run(main())


def test_sending_to_a_missing_topic_or_partition_fails_at_once(tansu: str, topic_name: str) -> None:
    async def main() -> None:
        async with KafkaClient(tansu, retries=1, retry_backoff_ms=10) as client:
            async with Producer(client, allow_auto_create_topics=False) as producer:
                with pytest.raises(BrokerResponseError, match="UNKNOWN_TOPIC_OR_PARTITION"):
                    await producer.send(topic_name, b"x")
                await client.create_topics([NewTopic(topic_name, 1, 1)])
                with pytest.raises(BrokerResponseError, match="no partition 3"):
                    await producer.send(topic_name, b"x", partition=3)

    asyncio.run(main())


# -- scripted peers: the broker answers we need on demand -----------------------------------


class ProduceScript:
    """One broker (node 0) leading partitions 0..n-1 of "t"; each Produce request is answered
    with the next of ``answers`` for all its partitions (an ErrorCode, or NO_ANSWER to let it
    time out); NONE once they run out."""

    def __init__(self, *answers: object, partitions: int = 1) -> None:
        self.answers = list(answers)
        self.partitions = partitions
        self.next_offset: dict[int, int] = {}
        self.producer_ids = iter(range(42, 100))
        self.broker = ScriptedBroker(self.handle)

    def handle(self, header, request):  # type: ignore[no-untyped-def]
        key = header.request_api_key
        if key == ApiKey.METADATA:
            leaders = {("t", p): 0 for p in range(self.partitions)}
            return metadata_answer({0: self.broker.port}, leaders)
        if key == ApiKey.INIT_PRODUCER_ID:
            return InitProducerIdResponse(
                error_code=0, producer_id=next(self.producer_ids), producer_epoch=3
            )
        if key == ApiKey.PRODUCE:
            answer = self.answers.pop(0) if self.answers else ErrorCode.NONE
            if answer is NO_ANSWER:
                return NO_ANSWER
            parts = []
            for data in request.topic_data[0].partition_data:
                base = -1
                if answer in (ErrorCode.NONE, ErrorCode.DUPLICATE_SEQUENCE_NUMBER):
                    base = self.next_offset.get(data.index, 0)
                    if answer == ErrorCode.NONE:
                        count = RecordBatch(bytes(data.records)).record_count
                        self.next_offset[data.index] = base + count
                parts.append(PartitionProduceResponse(data.index, answer, base))
            return ProduceResponse(responses=[TopicProduceResponse("t", parts)])
        return None

    def requests(self) -> list[list[tuple[int, RecordBatch]]]:
        """Each Produce request as [(partition, batch)]."""
        return [
            [(d.index, RecordBatch(bytes(d.records))) for d in r.topic_data[0].partition_data]
            for _, r in self.broker.received(ApiKey.PRODUCE)
        ]

    def produced(self) -> list[RecordBatch]:
        return [batch for request in self.requests() for _, batch in request]


def test_ready_batches_for_one_leader_share_a_request() -> None:
    script = ProduceScript(partitions=4)

    async def main() -> None:
        async with script.broker:
            async with KafkaClient(script.broker.address) as client:
                async with Producer(client, linger_ms=10_000, max_request_size=300) as producer:
                    futures = [
                        await producer.send("t", b"v" * 60, partition=p) for p in (0, 1, 2, 3, 0)
                    ]
                    await producer.flush()
        # four partitions' batches, split where a request would pass max.request.size
        requests = script.requests()
        assert sorted(p for r in requests for p, _ in r) == [0, 1, 2, 3]
        assert 1 < len(requests) < 4
        for request in requests:
            assert len(request) == 1 or sum(b.size_in_bytes for _, b in request) <= 300
        assert [f.result()[1] for f in futures] == [0, 0, 0, 0, 1]

    asyncio.run(main())


def test_a_retry_resends_the_same_batch_with_the_same_sequence() -> None:
    script = ProduceScript(NO_ANSWER, ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.NONE)

    async def main() -> None:
        async with script.broker:
            async with KafkaClient(script.broker.address, retry_backoff_ms=5) as client:
                producer = Producer(
                    client, request_timeout_ms=150, retry_backoff_ms=5, linger_ms=1000
                )
                async with producer:
                    first = [await producer.send("t", b"a%d" % i) for i in range(3)]
                    await producer.flush()
                    second = await producer.send("t", b"b")
                    await producer.flush()
        attempts = script.produced()
        assert len(attempts) == 4  # timed out, not leader, appended; then the next batch
        assert bytes(attempts[0].buf) == bytes(attempts[1].buf) == bytes(attempts[2].buf)
        assert (attempts[0].producer_id, attempts[0].producer_epoch) == (42, 3)
        assert attempts[0].base_sequence == 0
        assert attempts[3].base_sequence == 3
        assert [f.result()[1] for f in first] == [0, 1, 2]
        assert second.result()[1] == 3

    asyncio.run(main())


def test_a_duplicate_sequence_answer_counts_as_acknowledged() -> None:
    script = ProduceScript(ErrorCode.DUPLICATE_SEQUENCE_NUMBER)

    async def main() -> None:
        async with script.broker:
            async with KafkaClient(script.broker.address) as client:
                async with Producer(client, linger_ms=0) as producer:
                    future = await producer.send("t", b"x")
                    await producer.flush()
                    assert future.result() == (TopicPartition("t", 0), 0)

    asyncio.run(main())


def test_a_sequence_error_fails_the_batch_and_restarts_with_a_new_producer_id() -> None:
    script = ProduceScript(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER)

    async def main() -> None:
        async with script.broker:
            async with KafkaClient(script.broker.address) as client:
                async with Producer(client, linger_ms=0) as producer:
                    lost = await producer.send("t", b"lost")
                    await producer.flush()
                    with pytest.raises(BrokerResponseError, match="OUT_OF_ORDER_SEQUENCE"):
                        lost.result()
                    kept = await producer.send("t", b"kept")
                    await producer.flush()
                    assert kept.result()[1] == 0
                    assert producer.producer_id == 43
        first, second = script.produced()
        assert (first.producer_id, first.base_sequence) == (42, 0)
        assert (second.producer_id, second.base_sequence) == (43, 0)
        assert len(script.broker.received(ApiKey.INIT_PRODUCER_ID)) == 2

    asyncio.run(main())


def test_retries_stop_at_the_delivery_timeout() -> None:
    script = ProduceScript(*[ErrorCode.NOT_ENOUGH_REPLICAS] * 1000)

    async def main() -> None:
        async with script.broker:
            async with KafkaClient(script.broker.address) as client:
                producer = Producer(client, delivery_timeout_ms=300, retry_backoff_ms=20)
                async with producer:
                    started = time.monotonic()
                    future = await producer.send("t", b"x")
                    await producer.flush()
                    assert time.monotonic() - started < 5
                    with pytest.raises(BrokerResponseError, match="NOT_ENOUGH_REPLICAS"):
                        future.result()
        assert 2 <= len(script.produced()) < 100

    asyncio.run(main())


def test_a_full_buffer_blocks_send_for_at_most_max_block_ms() -> None:
    script = ProduceScript(*[NO_ANSWER] * 100)

    async def main() -> None:
        async with script.broker:
            async with KafkaClient(script.broker.address) as client:
                producer = Producer(
                    client,
                    linger_ms=0,
                    buffer_memory=1000,
                    max_block_ms=200,
                    request_timeout_ms=10_000,
                )
                async with producer:
                    first = await producer.send("t", b"x" * 600)
                    started = time.monotonic()
                    with pytest.raises(RequestTimedOutError, match="buffer.memory"):
                        await producer.send("t", b"y" * 600)
                    assert 0.15 < time.monotonic() - started < 5
                    assert not first.done()
                    await producer.close(timeout_s=0.1)
                    with pytest.raises(KafkaConnectionError, match="closed"):
                        first.result()

    asyncio.run(main())
