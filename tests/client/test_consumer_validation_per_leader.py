"""The consumer validates its positions (KIP-320) as Kafka's Java consumer does: one
OffsetsForLeaderEpoch per leader for all of its partitions to validate, the leaders asked
together (OffsetFetcher.validatePositionsAsync / regroupFetchPositionsByLeader), and the log
truncations one answer shows raised together (LogTruncationException); another leader's
answer's truncations wait for their next validation (the first exception is kept, a later one
dropped: maybeSetOffsetForLeaderException)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from kafka_peer import ScriptedBroker, metadata_answer

from tidelog.client.cluster import KafkaClient
from tidelog.client.consumer import Consumer, LogTruncationError
from tidelog.client.metadata import TopicPartition
from tidelog.protocol.api_keys import ApiKey
from tidelog.protocol.messages.fetch import FetchableTopicResponse, FetchResponse, PartitionData
from tidelog.protocol.messages.offset_for_leader_epoch import (
    EpochEndOffset,
    OffsetForLeaderEpochResponse,
    OffsetForLeaderTopicResult,
)
from tidelog.protocol.records import Record, build_batch

T0, T1, T2 = (TopicPartition("t", p) for p in range(3))


def written(offset: int) -> bytearray | None:
    """The records of a partition from ``offset``: [0, 3), written in leader epoch 0."""
    if offset >= 3:
        return None
    return build_batch([Record(b"%d" % o) for o in range(offset, 3)], base_offset=offset,
                       partition_leader_epoch=0)


class TwoLeaders:
    """Node 0 leads t-0 and t-1, node 1 leads t-2, in ``leader_epoch`` (their metadata); each
    partition holds offsets [0, 3) written in epoch 0. OffsetsForLeaderEpoch(0) answers the
    end offset in ``epoch_0_ends`` (3 for each at first)."""

    def __init__(self) -> None:
        self.leaders = {T0: 0, T1: 0, T2: 1}
        self.leader_epoch = 0
        self.epoch_0_ends = dict.fromkeys(self.leaders, 3)
        self.nodes = {n: ScriptedBroker(self.answer) for n in (0, 1)}

    def validations(self, node: int) -> list[list[TopicPartition]]:
        """The partitions of each OffsetsForLeaderEpoch ``node`` received."""
        return [[TopicPartition(t.topic, p.partition) for t in r.topics for p in t.partitions]
                for _, r in self.nodes[node].received(ApiKey.OFFSET_FOR_LEADER_EPOCH)]

    def answer(self, header: Any, request: Any) -> Any:
        key = header.request_api_key
        if key == ApiKey.METADATA:
            return metadata_answer({n: b.port for n, b in self.nodes.items()},
                                   {(tp.topic, tp.partition): n for tp, n in self.leaders.items()},
                                   leader_epoch=self.leader_epoch)
        if key == ApiKey.OFFSET_FOR_LEADER_EPOCH:
            return OffsetForLeaderEpochResponse(topics=[OffsetForLeaderTopicResult(t.topic, [
                EpochEndOffset(0, p.partition, 0,
                               self.epoch_0_ends[TopicPartition(t.topic, p.partition)])
                for p in t.partitions]) for t in request.topics])
        if key != ApiKey.FETCH:
            return None
        partitions = [PartitionData(p.partition, 0, high_watermark=3,
                                    records=written(p.fetch_offset))
                      for t in request.topics for p in t.partitions]
        return FetchResponse(responses=[FetchableTopicResponse("t", partitions=partitions)]
                             if partitions else [])


def run(script: TwoLeaders, body: Callable[[KafkaClient], Awaitable[None]], **client: Any
        ) -> None:
    async def main() -> None:
        async with script.nodes[0], script.nodes[1], \
                KafkaClient(script.nodes[0].address, retry_backoff_ms=5, **client) as kafka:
            await kafka.refresh_metadata(["t"])
            await body(kafka)

    asyncio.run(main())


async def at_a_new_leader_epoch(kafka: KafkaClient, script: TwoLeaders, auto_offset_reset: str,
                                epoch_0_ends: dict[TopicPartition, int]) -> Consumer:
    """A consumer that read every record (written in leader epoch 0), then the metadata's
    leader epoch 1 everywhere, with ``epoch_0_ends`` where epoch 0 ends on the leaders now."""
    consumer = Consumer(kafka, auto_offset_reset=auto_offset_reset)
    consumer.assign([(tp, 0) for tp in (T0, T1, T2)])
    got = 0
    for _ in range(50):
        got += len(await consumer.poll(timeout_ms=100))
        if got == 9:
            break
    assert got == 9
    script.leader_epoch = 1
    script.epoch_0_ends.update(epoch_0_ends)
    await kafka.refresh_metadata(["t"])
    return consumer


def test_one_validation_request_per_leader() -> None:
    script = TwoLeaders()

    async def body(kafka: KafkaClient) -> None:
        # t-1's epoch 0 ended at 1 on its leader (truncated there)
        consumer = await at_a_new_leader_epoch(kafka, script, "earliest", {T1: 1})
        records = await consumer.poll(timeout_ms=1000)
        assert [(r.partition, r.offset) for r in records] == [(1, 1), (1, 2)]
        assert [sorted(v) for v in script.validations(0)] == [[T0, T1]]
        assert script.validations(1) == [[T2]]

    run(script, body)


def test_every_truncation_an_answer_shows_is_raised_together() -> None:
    script = TwoLeaders()

    async def body(kafka: KafkaClient) -> None:
        consumer = await at_a_new_leader_epoch(kafka, script, "none", {T0: 2, T1: 1})
        with pytest.raises(LogTruncationError) as info:
            await consumer.poll(timeout_ms=1000)
        assert info.value.truncations == {T0: (3, (2, 0)), T1: (3, (1, 0))}
        # t-2 was validated meanwhile: the only partition fetched until the others are sought
        assert consumer.position(T2) == 3 and consumer.position(T0) == 3

    run(script, body)


def test_another_leaders_truncations_are_raised_at_their_next_validation() -> None:
    script = TwoLeaders()

    async def body(kafka: KafkaClient) -> None:
        consumer = await at_a_new_leader_epoch(kafka, script, "none", {T0: 2, T2: 1})
        raised: list[dict[TopicPartition, Any]] = []
        for _ in range(30):  # at least 3 s of polls: past the 300 ms timeout
            try:
                await consumer.poll(timeout_ms=100)
            except LogTruncationError as e:
                raised.append(e.truncations)
                for tp, (_, divergent) in e.truncations.items():
                    consumer.seek(tp, divergent[0])  # as an application would
                if len(raised) == 2:
                    break
        # one leader's answer each time: the other's truncation waited for its next validation
        assert sorted(raised, key=lambda r: min(r)) == [{T0: (3, (2, 0))}, {T2: (3, (1, 0))}]
        assert len(script.validations(0)) + len(script.validations(1)) == 3

    run(script, body, request_timeout_ms=300)
