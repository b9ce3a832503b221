"""`TransactionMarkerChannel`: sends a finished transaction's COMMIT or ABORT marker to the
leader of each of its partitions (Kafka's `TransactionMarkerChannelManager`).

Each partition leader answers per partition. A partition is done when its leader wrote the
marker, or when its topic is gone (UNKNOWN_TOPIC_OR_PARTITION); a leader change, an unreachable
leader or a not-yet-enough ISR is retried after a back-off against the leader the metadata
cache names then. TRANSACTION_COORDINATOR_FENCED (a newer coordinator epoch wrote to the
partition) or losing the coordinatorship stops the delivery: the new coordinator completes the
transaction from the log. `deliver` returns True once every partition has its marker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import Any

from tidelog.client.connection import BrokerConnection
from tidelog.protocol.errors import ErrorCode
from tidelog.protocol.messages import write_txn_markers as m_wtm
from tidelog.replication.types import TopicPartition

__all__ = ["LocalMarkerWriter", "TransactionMarkerChannel"]

logger = logging.getLogger(__name__)

E = ErrorCode
_RETRY_BACKOFF_S = 0.1
_MAX_RETRY_BACKOFF_S = 1.0
# Partition-level answers meaning "ask again, maybe elsewhere".
_RETRIABLE = frozenset({
    E.NOT_LEADER_OR_FOLLOWER, E.NOT_ENOUGH_REPLICAS, E.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
    E.REQUEST_TIMED_OUT, E.KAFKA_STORAGE_ERROR, E.UNKNOWN_SERVER_ERROR,
    E.COORDINATOR_LOAD_IN_PROGRESS, E.COORDINATOR_NOT_AVAILABLE, E.NOT_COORDINATOR,
    E.LEADER_NOT_AVAILABLE,
})

# This broker's own WriteTxnMarkers logic, called without a socket.
LocalMarkerWriter = Callable[[m_wtm.WriteTxnMarkersRequest], Awaitable[m_wtm.WriteTxnMarkersResponse]]


class TransactionMarkerChannel:
    def __init__(
        self,
        broker_id: int,
        metadata_cache: Any,
        write_locally: LocalMarkerWriter,
        *,
        request_timeout_ms: int = 30_000,
    ) -> None:
        self.broker_id = broker_id
        self.cache = metadata_cache
        self.write_locally = write_locally
        self.request_timeout_ms = request_timeout_ms
        self._connections: dict[int, BrokerConnection] = {}
        # One connection per broker even when several transactions complete at once.
        self._connecting: dict[int, asyncio.Lock] = {}
        self.markers_sent = 0

    async def close(self) -> None:
        for conn in self._connections.values():
            with contextlib.suppress(Exception):
                await conn.close()
        self._connections.clear()

    async def deliver(self, producer_id: int, producer_epoch: int, commit: bool,
                      coordinator_epoch: int, partitions: set[TopicPartition],
                      still_coordinator: Callable[[], bool]) -> bool:
        """Write the marker to every partition in `partitions` (removing each as it is done).
        False when stopped: deposed, or fenced by a newer coordinator."""
        backoff = _RETRY_BACKOFF_S
        while partitions:
            if not still_coordinator():
                return False
            by_leader: dict[int, list[TopicPartition]] = defaultdict(list)
            for tp in partitions:
                if self.cache.partition(tp) is None and not self.cache.contains_topic(tp.topic):
                    partitions.discard(tp)  # the topic was deleted: nothing to mark
                    continue
                leader = self.cache.leader_of(tp)
                if leader is not None:
                    by_leader[leader].append(tp)
            sends = [self._send(leader, producer_id, producer_epoch, commit, coordinator_epoch,
                                tps) for leader, tps in by_leader.items()]
            fenced = False
            for answer in await asyncio.gather(*sends):
                for tp, error in answer.items():
                    if error in (0, E.UNKNOWN_TOPIC_OR_PARTITION):
                        partitions.discard(tp)
                    elif error == E.TRANSACTION_COORDINATOR_FENCED:
                        fenced = True
                    elif error not in _RETRIABLE:
                        # Kafka treats any other answer as a bug of the leader; keep trying.
                        logger.error("marker for producer %d on %s: unexpected error %d",
                                     producer_id, tp, error)
            if fenced:
                logger.info("markers of producer %d: coordinator epoch %d fenced", producer_id,
                            coordinator_epoch)
                return False
            if partitions:
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, _MAX_RETRY_BACKOFF_S)
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
            if leader == self.broker_id:
                response = await self.write_locally(request)
            else:
                conn = await self._connection(leader)
                response = await conn.send(request)
        except Exception as e:
            logger.info("markers to broker %d failed (%s); retrying", leader, e)
            conn_ = self._connections.pop(leader, None)
            if conn_ is not None:
                with contextlib.suppress(Exception):
                    await conn_.close()
            return {tp: int(E.NOT_LEADER_OR_FOLLOWER) for tp in tps}
        self.markers_sent += 1
        out = {tp: int(E.UNKNOWN_SERVER_ERROR) for tp in tps}
        for result in response.markers:
            for topic in result.topics:
                for p in topic.partitions:
                    out[TopicPartition(topic.name, p.partition_index)] = p.error_code
        return out

    async def _connection(self, broker_id: int) -> BrokerConnection:
        async with self._connecting.setdefault(broker_id, asyncio.Lock()):
            return await self._connect(broker_id)

    async def _connect(self, broker_id: int) -> BrokerConnection:
        conn = self._connections.get(broker_id)
        if conn is not None and not conn.closed:
            return conn
        endpoint = self.cache.endpoint(broker_id)
        if endpoint is None:
            raise ConnectionError(f"broker {broker_id} has no known endpoint")
        conn = BrokerConnection(endpoint.host, endpoint.port,
                                client_id=f"broker-{self.broker_id}-txn-marker-sender",
                                request_timeout_ms=self.request_timeout_ms)
        await conn.connect(timeout_s=self.request_timeout_ms / 1000)
        self._connections[broker_id] = conn
        return conn
