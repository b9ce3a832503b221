"""The consumer's position validation (KIP-320) against a scripted leader, as Kafka's Java
consumer: a position reset by ListOffsets carries no offset epoch and is not validated at the
next leader change (OffsetFetcherUtils.resetPositionIfNeeded); a validation answered with a
partition error is retried at a later poll, only TOPIC_AUTHORIZATION_FAILED is raised
(OffsetsForLeaderEpochClient.handleResponse)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from kafka_peer import ScriptedBroker, metadata_answer
from waiting import raising_polls

from tidelog.client.cluster import KafkaClient
from tidelog.client.consumer import Consumer, LogTruncationError
from tidelog.client.errors import BrokerResponseError
from tidelog.client.metadata import TopicPartition
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
from tidelog.protocol.records import Record, build_batch

TP = TopicPartition("t", 0)


class Leader:
    """Node 0 leads ("t", 0) in ``leader_epoch`` (its metadata), holding offsets [0, end)
    written in epoch 0, fetched as one batch stamped ``batch_epoch``. ListOffsets answers
    ``end`` with epoch 0; OffsetsForLeaderEpoch answers ``validation`` (error code, epoch, end
    offset)."""

    def __init__(self, end: int) -> None:
        self.end = end
        self.leader_epoch = 0
        self.batch_epoch = 0
        self.validation = (ErrorCode.NONE, 0, end)
        self.validated_at: list[float] = []  # when each OffsetsForLeaderEpoch arrived
        self.node = ScriptedBroker(self.answer)

    def validations(self) -> list[tuple[int, int]]:
        """(current leader epoch, leader epoch) of each OffsetsForLeaderEpoch received."""
        return [(p.current_leader_epoch, p.leader_epoch)
                for _, r in self.node.received(ApiKey.OFFSET_FOR_LEADER_EPOCH)
                for t in r.topics for p in t.partitions]

    def fetch_offsets(self) -> list[int]:
        return [p.fetch_offset for _, r in self.node.received(ApiKey.FETCH)
                for t in r.topics for p in t.partitions]

    def answer(self, header: Any, request: Any) -> Any:
        key = header.request_api_key
        if key == ApiKey.METADATA:
            return metadata_answer({0: self.node.port}, {("t", 0): 0},
                                   leader_epoch=self.leader_epoch)
        if key == ApiKey.LIST_OFFSETS:
            return ListOffsetsResponse(topics=[ListOffsetsTopicResponse("t", [
                ListOffsetsPartitionResponse(0, 0, offset=self.end, leader_epoch=0)])])
        if key == ApiKey.OFFSET_FOR_LEADER_EPOCH:
            self.validated_at.append(time.monotonic())
            error, epoch, end_offset = self.validation
            return OffsetForLeaderEpochResponse(topics=[OffsetForLeaderTopicResult("t", [
                EpochEndOffset(error, 0, epoch, end_offset)])])
        if key == ApiKey.FETCH:
            if not request.topics:
                return FetchResponse(responses=[])
            offset = request.topics[0].partitions[0].fetch_offset
            records = (build_batch([Record(b"v%d" % o) for o in range(offset, self.end)],
                                   base_offset=offset, partition_leader_epoch=self.batch_epoch)
                       if offset < self.end else None)
            return FetchResponse(responses=[FetchableTopicResponse("t", partitions=[
                PartitionData(0, ErrorCode.NONE, high_watermark=self.end, records=records)])])
        return None


async def past_five_records(kafka: KafkaClient, leader: Leader, validation: tuple[int, int, int],
                            auto_offset_reset: str = "earliest") -> Consumer:
    """A consumer that read offsets 0-4 (epoch 0); then the metadata shows leader epoch 1,
    whose OffsetsForLeaderEpoch the leader answers ``validation``."""
    consumer = Consumer(kafka, auto_offset_reset=auto_offset_reset)
    consumer.assign([(TP, 0)])
    assert [r.offset for r in await consumer.poll(timeout_ms=1000)] == [0, 1, 2, 3, 4]
    leader.leader_epoch, leader.validation = 1, validation
    await kafka.refresh_metadata(["t"])
    return consumer


async def reads_on_unvalidated_at_a_leader_change(kafka: KafkaClient, leader: Leader,
                                                  consumer: Consumer) -> None:
    """A new leader epoch whose validation would move the position back to 2, and one more
    record: read next, no OffsetsForLeaderEpoch sent (the position has no offset epoch)."""
    position = consumer.position(TP)
    assert position is not None
    leader.leader_epoch, leader.validation = 1, (ErrorCode.NONE, 0, 2)
    await kafka.refresh_metadata(["t"])
    leader.end = position + 1
    assert [r.offset for r in await consumer.poll(timeout_ms=1000)] == [position]
    assert leader.validations() == []


def run(leader: Leader, body: Callable[[KafkaClient], Awaitable[None]], **client: Any) -> None:
    async def main() -> None:
        async with leader.node, KafkaClient(leader.node.address, retry_backoff_ms=5,
                                            **client) as kafka:
            await kafka.refresh_metadata(["t"])
            await body(kafka)

    asyncio.run(main())


def test_a_position_reset_by_list_offsets_is_not_validated_at_a_leader_change() -> None:
    leader = Leader(end=5)

    async def body(kafka: KafkaClient) -> None:
        consumer = Consumer(kafka, auto_offset_reset="latest")
        consumer.assign([TP])
        assert await consumer.poll(timeout_ms=50) == []
        assert consumer.position(TP) == 5
        await reads_on_unvalidated_at_a_leader_change(kafka, leader, consumer)

    run(leader, body)


def test_a_consumed_position_is_validated_at_a_leader_change() -> None:
    # The counterpart: the epoch of the batches read is the position's, validated once the
    # metadata shows a newer leader epoch, and moved back to the divergence.
    leader = Leader(end=5)

    async def body(kafka: KafkaClient) -> None:
        consumer = await past_five_records(kafka, leader, (ErrorCode.NONE, 0, 2))
        assert [r.offset for r in await consumer.poll(timeout_ms=1000)] == [2, 3, 4]
        assert leader.validations() == [(1, 0)]

    run(leader, body)


def test_a_batch_without_a_leader_epoch_clears_the_positions_epoch() -> None:
    # Kafka's CompletedFetch: lastEpoch = maybeLeaderEpoch(batch.partitionLeaderEpoch()), empty
    # for NO_PARTITION_LEADER_EPOCH: a position read past such a batch has no offset epoch,
    # so it is not validated at the next leader change.
    leader = Leader(end=5)

    async def body(kafka: KafkaClient) -> None:
        consumer = Consumer(kafka, auto_offset_reset="earliest")
        consumer.assign([(TP, 0)])
        assert [r.offset for r in await consumer.poll(timeout_ms=1000)] == [0, 1, 2, 3, 4]
        leader.end, leader.batch_epoch = 7, -1
        assert [r.offset for r in await consumer.poll(timeout_ms=1000)] == [5, 6]
        await reads_on_unvalidated_at_a_leader_change(kafka, leader, consumer)

    run(leader, body)


@pytest.mark.parametrize("error", [ErrorCode.UNKNOWN_SERVER_ERROR, ErrorCode.POLICY_VIOLATION])
def test_a_validation_answered_with_a_partition_error_is_retried(error: ErrorCode) -> None:
    leader = Leader(end=5)

    async def body(kafka: KafkaClient) -> None:
        consumer = await past_five_records(kafka, leader, (error, -1, -1))
        leader.end = 7
        assert await consumer.poll(timeout_ms=100) == []  # not raised, nothing fetched
        assert len(leader.validations()) >= 1
        assert leader.fetch_offsets()[-1] == 0
        leader.validation = (ErrorCode.NONE, 0, 5)
        assert [r.offset for r in await consumer.poll(timeout_ms=1000)] == [5, 6]

    run(leader, body)


def test_a_validation_refused_by_topic_authorization_is_raised() -> None:
    leader = Leader(end=5)

    async def body(kafka: KafkaClient) -> None:
        consumer = await past_five_records(
            kafka, leader, (ErrorCode.TOPIC_AUTHORIZATION_FAILED, -1, -1))
        with pytest.raises(BrokerResponseError) as info:
            await consumer.poll(timeout_ms=100)
        assert info.value.code == ErrorCode.TOPIC_AUTHORIZATION_FAILED

    run(leader, body)


def test_a_truncation_found_is_raised_once_then_again_after_the_request_timeout() -> None:
    # Kafka's validatePositionsAsync sets the partition's next retry at the request's send
    # time + request.timeout.ms; a LogTruncationException leaves it awaiting validation, so
    # the polls until then neither fetch it nor ask again, and the next validation raises
    # again. A newer leader epoch validates at once (maybeValidatePosition). Counts and a lower
    # bound only, so a slow machine cannot fail it: the second validation arrives no sooner
    # than the timeout after the poll that raised the first began.
    leader = Leader(end=5)
    timeout_s = 0.6

    async def body(kafka: KafkaClient) -> None:
        consumer = await past_five_records(kafka, leader, (ErrorCode.NONE, 0, 2), "none")
        fetches = len(leader.fetch_offsets())
        # (the raising poll's start, validations); 30 polls: at least 3 s, past the timeout
        raised_at = await raising_polls(consumer, LogTruncationError, 2, 30, 100,
                                        lambda: len(leader.validations()))
        assert [n for _, n in raised_at] == [1, 2]
        assert leader.validated_at[1] >= raised_at[0][0] + timeout_s
        assert len(leader.fetch_offsets()) == fetches
        leader.leader_epoch = 2
        await kafka.refresh_metadata(["t"])
        with pytest.raises(LogTruncationError):
            await consumer.poll(timeout_ms=100)
        assert leader.validations()[-1] == (2, 0)
        consumer.seek(TP, 2)
        assert [r.offset for r in await consumer.poll(timeout_ms=1000)] == [2, 3, 4]

    run(leader, body, request_timeout_ms=int(timeout_s * 1000))
