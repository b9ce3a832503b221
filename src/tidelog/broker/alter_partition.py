"""AlterPartition (KIP-497) on the wire, both ends: the broker's transport to the active
controller (`ControllerAlterPartitionTransport`, what the shell's `AlterPartitionManager` sends
through) and the controller broker's handling of the request (`handle_alter_partition`).

Versions as Kafka 3.9 in ZooKeeper mode: v2+ name topics by id (the ids the controller keeps in
the topic znodes), v3 carries each member's broker epoch (KIP-903); a request naming a topic
whose id the broker does not know yet goes as v1, by name (Kafka's canUseTopicIds).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any
from uuid import UUID

from tidelog.broker.fetcher_manager import EndpointLookup, TopicIdLookup
from tidelog.client.connection import BrokerConnection
from tidelog.protocol.api_keys import ApiKey
from tidelog.protocol.errors import ErrorCode
from tidelog.protocol.messages import alter_partition as m_ap
from tidelog.protocol.primitives import ZERO_UUID
from tidelog.replication.types import ProposeIsr, TopicPartition
from tidelog.shell.alter_partition_manager import AlterPartitionAnswer, PartitionAnswer

__all__ = ["ControllerAlterPartitionTransport", "handle_alter_partition"]

logger = logging.getLogger(__name__)

# The last version naming topics by name (v2+: by id).
_BY_NAME_MAX_VERSION = 1


def _to_request(broker_id: int, broker_epoch: int, items: Sequence[ProposeIsr],
                topic_id_of: TopicIdLookup) -> tuple[m_ap.AlterPartitionRequest, dict[UUID, str]]:
    by_topic: dict[str, list[ProposeIsr]] = {}
    for prop in items:
        by_topic.setdefault(prop.tp.topic, []).append(prop)
    names: dict[UUID, str] = {}
    topics = []
    for topic, props in by_topic.items():
        topic_id = topic_id_of(topic)
        names[topic_id] = topic
        topics.append(m_ap.TopicData(topic_name=topic, topic_id=topic_id, partitions=[
            m_ap.PartitionData(
                partition_index=p.tp.partition, leader_epoch=p.leader_epoch,
                new_isr=list(p.new_isr),
                new_isr_with_epochs=[m_ap.BrokerState(b, e) for b, e in (
                    p.isr_with_broker_epochs or tuple((b, -1) for b in p.new_isr))],
                partition_epoch=p.zk_version)
            for p in props]))
    return m_ap.AlterPartitionRequest(broker_id, broker_epoch, topics), names


def _from_response(resp: m_ap.AlterPartitionResponse, version: int,
                   names: dict[UUID, str]) -> AlterPartitionAnswer:
    parts: dict[TopicPartition, PartitionAnswer] = {}
    for t in resp.topics:
        topic = t.topic_name if version <= _BY_NAME_MAX_VERSION else names.get(t.topic_id)
        if not topic:
            logger.error("AlterPartition answer names an unexpected topic %s", t)
            continue
        for p in t.partitions:
            parts[TopicPartition(topic, p.partition_index)] = (
                PartitionAnswer(p.error_code) if p.error_code else PartitionAnswer(
                    0, p.leader_id, p.leader_epoch, tuple(p.isr), p.partition_epoch))
    return AlterPartitionAnswer(resp.error_code, parts)


class ControllerAlterPartitionTransport:
    """One connection to the active controller, found as Kafka's ZooKeeper-mode broker finds
    it (MetadataCacheControllerNodeProvider: the controller id of the last UpdateMetadata, at
    its inter-broker endpoint); looked up again after a failure or NOT_CONTROLLER (Kafka's
    NodeToControllerChannelManager). A new controller's first UpdateMetadata names it."""

    def __init__(self, broker_id: int, controller_id: Callable[[], int | None],
                 endpoint_of: EndpointLookup, topic_id_of: TopicIdLookup,
                 request_timeout_ms: int = 30_000) -> None:
        """``controller_id()``: the active controller's id as this broker knows it."""
        self.broker_id = broker_id
        self.controller_id = controller_id
        self.endpoint_of = endpoint_of
        self.topic_id_of = topic_id_of
        self.request_timeout_ms = request_timeout_ms
        self._conn: BrokerConnection | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self.connections = 0
        # Sees each answer before the manager hands it out (the broker's log and telemetry).
        self.on_answer: Callable[[AlterPartitionAnswer], None] | None = None
        # The proposals of the last request, each with the topic id it was first sent with.
        self._sent_ids: dict[TopicPartition, tuple[ProposeIsr, UUID]] = {}

    def send(self, broker_epoch: int, items: Sequence[ProposeIsr],
             on_done: Callable[[AlterPartitionAnswer | None], None]) -> None:
        topic_ids = self._topic_ids(items)
        task = asyncio.get_running_loop().create_task(
            self._send(broker_epoch, items, topic_ids, on_done))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _topic_ids(self, items: Sequence[ProposeIsr]) -> dict[str, UUID]:
        """Each topic's id as its proposals were first sent with (Kafka's AlterPartitionItem
        keeps the TopicIdPartition of its submission; a topic names the id of its first item):
        a proposal sent again after its topic was deleted and created again names the old id
        (UNKNOWN_TOPIC_ID), not the new topic's, whose partition state it would else be
        checked against and written to."""
        sent, self._sent_ids = self._sent_ids, {}
        by_topic: dict[str, UUID] = {}
        for prop in items:
            first = sent.get(prop.tp)
            topic_id = (first[1] if first is not None and first[0] is prop
                        else self.topic_id_of(prop.tp.topic))
            self._sent_ids[prop.tp] = (prop, topic_id)
            by_topic.setdefault(prop.tp.topic, topic_id)
        return by_topic

    async def _connection(self) -> BrokerConnection | None:
        conn = self._conn
        if conn is not None and not conn.closed:
            return conn
        controller = self.controller_id()
        endpoint = self.endpoint_of(controller) if controller is not None else None
        if endpoint is None:
            return None
        conn = BrokerConnection(endpoint[0], endpoint[1], client_id=f"broker-{self.broker_id}",
                                request_timeout_ms=self.request_timeout_ms)
        await conn.connect(timeout_s=5)
        self.connections += 1
        self._conn = conn
        return conn

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close()

    async def _send(self, broker_epoch: int, items: Sequence[ProposeIsr],
                    topic_ids: dict[str, UUID],
                    on_done: Callable[[AlterPartitionAnswer | None], None]) -> None:
        answer: AlterPartitionAnswer | None = None
        try:
            conn = await self._connection()
            if conn is not None:
                request, names = _to_request(self.broker_id, broker_epoch, items,
                                             topic_ids.__getitem__)
                version = conn.pick_version(ApiKey.ALTER_PARTITION)
                if ZERO_UUID in names:
                    version = conn.pick_version(ApiKey.ALTER_PARTITION,
                                                min(version, _BY_NAME_MAX_VERSION))
                resp = await conn.send(request, version)
                if resp.error_code == ErrorCode.NOT_CONTROLLER:
                    await self._drop()  # the controller moved: found again at the retry
                else:
                    answer = _from_response(resp, version, names)
                    if self.on_answer is not None:
                        self.on_answer(answer)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            logger.info("broker %d: AlterPartition to the controller failed: %s", self.broker_id,
                        str(e) or type(e).__name__)
            await self._drop()
        on_done(answer)

    async def shutdown(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5)
        await self._drop()


async def handle_alter_partition(controller: Any, request: m_ap.AlterPartitionRequest,
                                 version: int) -> m_ap.AlterPartitionResponse:
    """The controller broker's side (Kafka's KafkaApis.handleAlterPartitionRequest and
    KafkaController.processAlterPartition): NOT_CONTROLLER unless this broker's controller is
    active; topics by name (v0-1) or id (v2+, an unknown id UNKNOWN_TOPIC_ID); a member not
    eligible (KIP-841) INELIGIBLE_REPLICA from v2, OPERATION_NOT_ATTEMPTED before."""
    if controller is None or not getattr(controller, "is_active", False):
        return m_ap.AlterPartitionResponse(error_code=ErrorCode.NOT_CONTROLLER)
    by_id = version > _BY_NAME_MAX_VERSION
    names = {topic_id: name for name, topic_id in controller.topic_ids.items()} if by_id else {}
    proposals: list[ProposeIsr] = []
    unknown_ids: list[m_ap.AlterPartitionResponseTopicData] = []
    for t in request.topics:
        topic = names.get(t.topic_id) if by_id else t.topic_name
        if not topic:
            unknown_ids.append(m_ap.AlterPartitionResponseTopicData(
                topic_id=t.topic_id, partitions=[m_ap.AlterPartitionResponsePartitionData(
                    p.partition_index, ErrorCode.UNKNOWN_TOPIC_ID) for p in t.partitions]))
            continue
        for p in t.partitions:
            members = ([(s.broker_id, s.broker_epoch) for s in p.new_isr_with_epochs]
                       if version >= 3 else [(b, -1) for b in p.new_isr])
            proposals.append(ProposeIsr(
                TopicPartition(topic, p.partition_index), request.broker_id, p.leader_epoch,
                tuple(sorted(b for b, _ in members)), p.partition_epoch, -1,
                tuple(sorted(members))))
    # Through the controller even when no topic is known: it checks the broker epoch first
    # (STALE_BROKER_EPOCH for the whole request, whatever it names).
    outcome = await controller.alter_partition(request.broker_id, request.broker_epoch,
                                               proposals)
    if outcome is None:
        return m_ap.AlterPartitionResponse(error_code=ErrorCode.NOT_CONTROLLER)
    if outcome.error:
        return m_ap.AlterPartitionResponse(error_code=outcome.error)
    topics: dict[str, m_ap.AlterPartitionResponseTopicData] = {}
    for tp, error, s in outcome.partition_answers():
        if error == ErrorCode.INELIGIBLE_REPLICA and version <= _BY_NAME_MAX_VERSION:
            error = int(ErrorCode.OPERATION_NOT_ATTEMPTED)  # v0-1 know no INELIGIBLE_REPLICA
        t = topics.get(tp.topic)
        if t is None:
            t = topics[tp.topic] = (
                m_ap.AlterPartitionResponseTopicData(
                    topic_id=controller.topic_ids.get(tp.topic, ZERO_UUID))
                if by_id else m_ap.AlterPartitionResponseTopicData(topic_name=tp.topic))
        t.partitions.append(
            m_ap.AlterPartitionResponsePartitionData(tp.partition, error) if s is None else
            m_ap.AlterPartitionResponsePartitionData(
                tp.partition, 0, s.leader, s.leader_epoch, list(s.isr), 0, s.zk_version))
    return m_ap.AlterPartitionResponse(topics=[*topics.values(), *unknown_ids])
