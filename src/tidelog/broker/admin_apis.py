"""Kafka's partition-lifecycle admin APIs, as its ZooKeeper-mode broker answers them (issue 14).

CreatePartitions (37), as `KafkaApis.handleCreatePartitionsRequest` and
`ZkAdminManager.createPartitions`: any broker validates the request and writes the grown
assignment to /brokers/topics/<t> (the topic id kept); the controller's watch on that znode
creates the new partitions (LeaderAndIsr, UpdateMetadata). The answer waits, as Kafka's
DelayedCreatePartitions, until this broker's metadata has a leader for every new partition, up
to the request's timeout (REQUEST_TIMED_OUT after it; at once for timeout_ms <= 0).
A topic twice in one request is INVALID_REQUEST ("Duplicate topic in request."), a topic queued
for deletion INVALID_TOPIC_EXCEPTION ("The topic is queued for deletion."); the rest are
`AdminZkClient.create_partitions`'s refusals. Nothing is written for a refused topic.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from tidelog.controller.admin import AdminError
from tidelog.protocol.api_keys import ApiKey
from tidelog.protocol.errors import ErrorCode
from tidelog.protocol.messages import create_partitions as m_cp

if TYPE_CHECKING:  # pragma: no cover
    from tidelog.broker.kafka_apis import KafkaApis
    from tidelog.broker.server import BrokerServer
    from tidelog.broker.socket_server import RequestContext

__all__ = ["AdminApis"]

logger = logging.getLogger(__name__)

_POLL_S = 0.02


class AdminApis:
    def __init__(self, server: BrokerServer) -> None:
        self.server = server

    def register(self, apis: KafkaApis) -> None:
        apis.register_handler(ApiKey.CREATE_PARTITIONS, self.handle_create_partitions)

    # ------------------------------------------------------------------ CreatePartitions
    async def handle_create_partitions(
        self, ctx: RequestContext, request: m_cp.CreatePartitionsRequest
    ) -> m_cp.CreatePartitionsResponse:
        names = [t.name for t in request.topics]
        dupes = {n for n in names if names.count(n) > 1}
        results: dict[str, m_cp.CreatePartitionsTopicResult] = {}
        grown: dict[str, int] = {}
        zk = self.server.zk_client
        for t in request.topics:
            if t.name in results:
                continue
            res = m_cp.CreatePartitionsTopicResult(name=t.name, error_message=None)
            results[t.name] = res
            if t.name in dupes:
                res.error_code = ErrorCode.INVALID_REQUEST
                res.error_message = "Duplicate topic in request."
                continue
            if await asyncio.to_thread(zk.is_topic_marked_for_deletion, t.name):
                res.error_code = ErrorCode.INVALID_TOPIC_EXCEPTION
                res.error_message = "The topic is queued for deletion."
                continue
            assignments = (None if t.assignments is None
                           else [a.broker_ids for a in t.assignments])
            try:
                await asyncio.to_thread(self.server.admin.create_partitions, t.name, t.count,
                                        assignments, request.validate_only)
            except AdminError as e:
                res.error_code = e.error_code
                res.error_message = e.message
                continue
            if not request.validate_only:
                grown[t.name] = t.count
        if grown:
            ok = request.timeout_ms > 0 and await self._wait_for_leaders(grown,
                                                                         request.timeout_ms)
            if not ok:
                for name in grown:
                    results[name].error_code = ErrorCode.REQUEST_TIMED_OUT
                    results[name].error_message = None
        return m_cp.CreatePartitionsResponse(results=list(results.values()))

    async def _wait_for_leaders(self, counts: dict[str, int], timeout_ms: int) -> bool:
        """Until every partition below each count has a leader in this broker's metadata."""
        cache = self.server.metadata_cache
        deadline = time.monotonic() + timeout_ms / 1000

        def done() -> bool:
            for topic, count in counts.items():
                parts = cache.topic_partitions(topic)
                if any(p not in parts or parts[p].leader < 0 for p in range(count)):
                    return False
            return True

        while not done():
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(_POLL_S)
        return True
