"""`TransactionMarkerChannel`: sends a finished transaction's COMMIT or ABORT marker to the
leader of each of its partitions (Kafka's `TransactionMarkerChannelManager`).

Each partition leader answers per partition. A partition is done when its leader wrote the
marker, cannot take one (UNSUPPORTED_FOR_MESSAGE_FORMAT, UNSUPPORTED_VERSION), or when the
metadata cache no longer knows its topic (deleted); a leader change, an unreachable leader, a
leader not hosting the partition yet (UNKNOWN_TOPIC_OR_PARTITION) or a not-yet-enough ISR is
retried after a back-off against the leader the metadata cache names then.
TRANSACTION_COORDINATOR_FENCED (a newer coordinator epoch wrote to the partition),
INVALID_PRODUCER_EPOCH (the producer's epoch moved on) or losing the coordinatorship stops the
delivery: the new coordinator completes the transaction from the log. `deliver` returns True
once every partition has its marker.

`write_markers` is the partition leader's side of WriteTxnMarkers, the same on every driver.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from tidelog.coordinator.offsets import GROUP_METADATA_TOPIC_NAME
from tidelog.coordinator.transaction.driver import (
    CoordinatorAppender,
    MarkerTransport,
    PartitionLeaders,
    TaskRunner,
)
from tidelog.protocol.errors import ErrorCode
from tidelog.protocol.messages import write_txn_markers as m_wtm
from tidelog.protocol.records.builder import build_end_transaction_marker
from tidelog.replication.types import TopicPartition

__all__ = ["TransactionMarkerChannel", "write_markers"]

logger = logging.getLogger(__name__)

E = ErrorCode
_RETRY_BACKOFF_MS = 100
_MAX_RETRY_BACKOFF_MS = 1000
# Partition-level answers meaning "ask again, maybe elsewhere".
_RETRIABLE = frozenset({
    E.NOT_LEADER_OR_FOLLOWER, E.NOT_ENOUGH_REPLICAS, E.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
    E.REQUEST_TIMED_OUT, E.KAFKA_STORAGE_ERROR, E.UNKNOWN_SERVER_ERROR,
    E.COORDINATOR_LOAD_IN_PROGRESS, E.COORDINATOR_NOT_AVAILABLE, E.NOT_COORDINATOR,
    E.LEADER_NOT_AVAILABLE,
    # The broker the metadata names does not host the partition yet (a restart, a new replica
    # before its LeaderAndIsr): retried as Kafka's TransactionMarkerRequestCompletionHandler
    # does. A deleted topic is noticed in the metadata, not in this answer.
    E.UNKNOWN_TOPIC_OR_PARTITION,
})
# Kafka's TransactionMarkerRequestCompletionHandler: written, or a leader that cannot take a
# marker (so the producer could not have written there either: the partition needs none).
_DONE = frozenset({E.NONE, E.UNSUPPORTED_FOR_MESSAGE_FORMAT, E.UNSUPPORTED_VERSION})
# The producer's or the coordinator's epoch moved on: the transaction is no longer this
# delivery's to finish.
_STOP = frozenset({E.TRANSACTION_COORDINATOR_FENCED, E.INVALID_PRODUCER_EPOCH})


class TransactionMarkerChannel:
    def __init__(self, broker_id: int, metadata_cache: PartitionLeaders,
                 transport: MarkerTransport, tasks: TaskRunner) -> None:
        self.broker_id = broker_id
        self.cache = metadata_cache
        self.transport = transport
        self.tasks = tasks
        self.markers_sent = 0

    async def close(self) -> None:
        await self.transport.close()

    async def deliver(self, producer_id: int, producer_epoch: int, commit: bool,
                      coordinator_epoch: int, partitions: set[TopicPartition],
                      still_coordinator: Callable[[], bool]) -> bool:
        """Write the marker to every partition in `partitions` (removing each as it is done).
        False when stopped: deposed, or fenced by a newer coordinator."""
        backoff = _RETRY_BACKOFF_MS
        while partitions:
            if not still_coordinator():
                return False
            by_leader: dict[int, list[TopicPartition]] = defaultdict(list)
            for tp in sorted(partitions):
                if self.cache.partition(tp) is None and not self.cache.contains_topic(tp.topic):
                    partitions.discard(tp)  # the topic was deleted: nothing to mark
                    continue
                leader = self.cache.leader_of(tp)
                if leader is not None and leader >= 0:
                    by_leader[leader].append(tp)
            sends = [self._send(leader, producer_id, producer_epoch, commit, coordinator_epoch,
                                tps) for leader, tps in by_leader.items()]
            fenced = False
            for answer in await self.tasks.gather(sends):
                for tp, error in answer.items():
                    if error in _DONE:
                        partitions.discard(tp)
                    elif error in _STOP:
                        fenced = True
                    elif error not in _RETRIABLE:
                        # Kafka treats any other answer as a bug of the leader; keep trying.
                        logger.error("marker for producer %d on %s: unexpected error %d",
                                     producer_id, tp, error)
            if fenced:
                logger.info("markers of producer %d: fenced (coordinator epoch %d, producer "
                            "epoch %d)", producer_id, coordinator_epoch, producer_epoch)
                return False
            if partitions:
                await self.tasks.sleep(backoff)
                backoff = min(backoff * 2, _MAX_RETRY_BACKOFF_MS)
        return True

    async def _send(self, leader: int, producer_id: int, producer_epoch: int, commit: bool,
                    coordinator_epoch: int, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        by_topic: dict[str, list[int]] = defaultdict(list)
        for tp in tps:
            by_topic[tp.topic].append(tp.partition)
        request = m_wtm.WriteTxnMarkersRequest(markers=[m_wtm.WritableTxnMarker(
            producer_id=producer_id, producer_epoch=producer_epoch, transaction_result=commit,
            topics=[m_wtm.WritableTxnMarkerTopic(name=t, partition_indexes=sorted(ps))
                    for t, ps in sorted(by_topic.items())],
            coordinator_epoch=coordinator_epoch)])
        try:
            response = await self.transport.send(leader, request)
        except Exception as e:
            logger.info("markers to broker %d failed (%s); retrying", leader, e)
            return {tp: int(E.NOT_LEADER_OR_FOLLOWER) for tp in tps}
        self.markers_sent += 1
        out = {tp: int(E.UNKNOWN_SERVER_ERROR) for tp in tps}
        for result in response.markers:
            for topic in result.topics:
                for p in topic.partitions:
                    out[TopicPartition(topic.name, p.partition_index)] = p.error_code
        return out


async def write_markers(
    appender: CoordinatorAppender, tasks: TaskRunner, request: m_wtm.WriteTxnMarkersRequest,
    timeout_ms: int, now_ms: int,
    on_offsets_completed: Callable[[int, set[int], bool], None] | None = None,
) -> m_wtm.WriteTxnMarkersResponse:
    """The partition leader's side of WriteTxnMarkers: each marker appended (acks=all, as the
    coordinator's) to every partition it names, all markers at once; `on_offsets_completed`
    (producer id, offsets partitions, commit) for markers that landed on `__consumer_offsets`."""
    answers = [_write_marker(appender, marker, timeout_ms, now_ms, on_offsets_completed)
               for marker in request.markers]
    return m_wtm.WriteTxnMarkersResponse(markers=list(await tasks.gather(answers)))


async def _write_marker(appender: CoordinatorAppender, marker: m_wtm.WritableTxnMarker,
                        timeout_ms: int, now_ms: int,
                        on_offsets_completed: Callable[[int, set[int], bool], None] | None,
                        ) -> m_wtm.WritableTxnMarkerResult:
    errors: dict[TopicPartition, int] = {}
    entries: dict[TopicPartition, Any] = {}
    for topic in marker.topics:
        for index in topic.partition_indexes:
            tp = TopicPartition(topic.name, index)
            if appender.core.partition(tp) is None:
                errors[tp] = int(E.UNKNOWN_TOPIC_OR_PARTITION)
                continue
            entries[tp] = build_end_transaction_marker(
                commit=marker.transaction_result, producer_id=marker.producer_id,
                producer_epoch=marker.producer_epoch,
                coordinator_epoch=marker.coordinator_epoch, timestamp=now_ms)
    if entries:
        results = await appender.append(entries, timeout_ms)
        for tp in entries:
            r = results.get(tp)
            errors[tp] = int(r.error) if r is not None else int(E.UNKNOWN_SERVER_ERROR)
    offsets_partitions = {tp.partition for tp, e in errors.items()
                          if not e and tp.topic == GROUP_METADATA_TOPIC_NAME}
    if offsets_partitions and on_offsets_completed is not None:
        on_offsets_completed(marker.producer_id, offsets_partitions, marker.transaction_result)
    by_topic: dict[str, list[m_wtm.WritableTxnMarkerPartitionResult]] = defaultdict(list)
    for tp, error in errors.items():
        by_topic[tp.topic].append(m_wtm.WritableTxnMarkerPartitionResult(
            partition_index=tp.partition, error_code=error))
    return m_wtm.WritableTxnMarkerResult(producer_id=marker.producer_id, topics=[
        m_wtm.WritableTxnMarkerTopicResult(name=t, partitions=ps) for t, ps in by_topic.items()])
