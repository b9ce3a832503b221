"""The marker channel's answers from partition leaders (Kafka's
TransactionMarkerRequestCompletionHandler): a leader that does not host the partition yet
(UNKNOWN_TOPIC_OR_PARTITION: a restarted broker, a new replica before its LeaderAndIsr) is asked
again; only a topic gone from the metadata ends a partition's delivery without its marker."""

from __future__ import annotations

import asyncio

from tidelog.coordinator.transaction.asyncio_driver import AsyncioTasks
from tidelog.coordinator.transaction.marker_channel import TransactionMarkerChannel
from tidelog.protocol.errors import ErrorCode as E
from tidelog.protocol.messages import write_txn_markers as m_wtm
from tidelog.replication.types import TopicPartition

TP = TopicPartition("orders", 0)


class _Metadata:
    def __init__(self) -> None:
        self.topics = {"orders"}

    def partition(self, tp: TopicPartition) -> object:
        return object() if tp.topic in self.topics else None

    def contains_topic(self, topic: str) -> bool:
        return topic in self.topics

    def leader_of(self, tp: TopicPartition) -> int:
        return 2


class _Leader:
    """Broker 2, answering each WriteTxnMarkers with the next of `answers`."""

    def __init__(self, answers: list[int]) -> None:
        self.answers = answers
        self.sent = 0

    async def send(self, broker_id: int, request: m_wtm.WriteTxnMarkersRequest
                   ) -> m_wtm.WriteTxnMarkersResponse:
        error = self.answers[min(self.sent, len(self.answers) - 1)]
        self.sent += 1
        return m_wtm.WriteTxnMarkersResponse(markers=[m_wtm.WritableTxnMarkerResult(
            producer_id=request.markers[0].producer_id, topics=[
                m_wtm.WritableTxnMarkerTopicResult(name=TP.topic, partitions=[
                    m_wtm.WritableTxnMarkerPartitionResult(partition_index=TP.partition,
                                                           error_code=error)])])])

    async def close(self) -> None:
        return None


def deliver(channel: TransactionMarkerChannel, partitions: set[TopicPartition]) -> bool:
    async def go() -> bool:
        return await channel.deliver(7, 0, True, 0, partitions, lambda: True)

    return asyncio.run(asyncio.wait_for(go(), 10))


def test_a_leader_not_hosting_the_partition_yet_is_asked_again() -> None:
    leader = _Leader([int(E.UNKNOWN_TOPIC_OR_PARTITION), int(E.UNKNOWN_TOPIC_OR_PARTITION), 0])
    channel = TransactionMarkerChannel(1, _Metadata(), leader, AsyncioTasks())
    partitions = {TP}
    assert deliver(channel, partitions)
    assert leader.sent == 3 and partitions == set()


def test_a_topic_gone_from_the_metadata_needs_no_marker() -> None:
    metadata = _Metadata()
    leader = _Leader([int(E.UNKNOWN_TOPIC_OR_PARTITION)])
    channel = TransactionMarkerChannel(1, metadata, leader, AsyncioTasks())
    partitions = {TP}

    async def go() -> bool:
        task = asyncio.ensure_future(channel.deliver(7, 0, True, 0, partitions, lambda: True))
        while leader.sent < 2:  # asked, refused, asked again
            await asyncio.sleep(0.01)
        metadata.topics.clear()  # deleted
        return await task

    assert asyncio.run(asyncio.wait_for(go(), 10))
    assert partitions == set()


def _deliver_until(channel: TransactionMarkerChannel, leader: _Leader, most_sends: int) -> bool:
    """deliver, deposed after ``most_sends`` sends (so a channel that keeps retrying ends)."""
    async def go() -> bool:
        return await channel.deliver(7, 0, True, 0, {TP}, lambda: leader.sent < most_sends)

    return asyncio.run(asyncio.wait_for(go(), 10))


def test_a_marker_refused_for_an_old_producer_epoch_stops_the_delivery() -> None:
    # Kafka's completion handler: INVALID_PRODUCER_EPOCH, like TRANSACTION_COORDINATOR_FENCED,
    # means the transaction moved on without this coordinator: stop sending, not retry.
    leader = _Leader([int(E.INVALID_PRODUCER_EPOCH)])
    channel = TransactionMarkerChannel(1, _Metadata(), leader, AsyncioTasks())
    assert not _deliver_until(channel, leader, 3)
    assert leader.sent == 1


def test_a_partition_whose_leader_cannot_take_markers_needs_none() -> None:
    # UNSUPPORTED_FOR_MESSAGE_FORMAT / UNSUPPORTED_VERSION: the producer could not have written
    # there either, so Kafka drops the partition from the transaction's marker set.
    for error in (E.UNSUPPORTED_FOR_MESSAGE_FORMAT, E.UNSUPPORTED_VERSION):
        leader = _Leader([int(error)])
        channel = TransactionMarkerChannel(1, _Metadata(), leader, AsyncioTasks())
        assert _deliver_until(channel, leader, 3)
        assert leader.sent == 1
