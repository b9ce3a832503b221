"""`ControllerChannelManager`: the controller's connections to every live broker.

Kafka's `ControllerChannelManager` keeps one queue and one `RequestSendThread` per broker; here
each broker has an asyncio queue and one sender task over tidelog's `BrokerConnection`. Requests
to one broker go out one at a time, in the order the controller queued them, and requests of the
same kind that are queued back to back are merged into one (Kafka's `ControllerBrokerRequestBatch`
batches the state changes of one event; merging also batches a burst of events). Every request
carries the controller id, the controller epoch and the receiver's broker epoch as the controller
knows it, so a broker refuses requests meant for an earlier incarnation of itself (KIP-380) and
requests from a deposed controller.

A request that fails for lack of a connection is retried (reconnecting with a bounded backoff)
for as long as the broker stays in the channel: `remove_broker` (the broker died) or `shutdown`
(the controller resigned) fails what is left with `BrokerRemovedError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from tidelog.client.connection import BrokerConnection
from tidelog.client.errors import KafkaClientError
from tidelog.controller import core
from tidelog.controller.zk_data import BrokerInfo
from tidelog.protocol.api_keys import ApiKey
from tidelog.protocol.messages import leader_and_isr as lai
from tidelog.protocol.messages import stop_replica as sr
from tidelog.protocol.messages import update_metadata as um
from tidelog.protocol.primitives import ZERO_UUID
from tidelog.replication.types import LeaderAndIsrPartitionState, TopicPartition

__all__ = [
    "BrokerRemovedError",
    "ControllerChannelManager",
    "build_leader_and_isr",
    "build_stop_replica",
    "build_update_metadata",
]

log = logging.getLogger(__name__)

# The versions a ZooKeeper-mode controller of Kafka 2.4-2.7 sends (broker epochs, grouped by
# topic, flexible encodings), and LeaderAndIsr v5 / UpdateMetadata v7 of Kafka 2.8+ with the
# topic ids (the Metadata API returns them; a replica keeps its topic's, and a fetch naming
# another id is INCONSISTENT_TOPIC_ID); lower when the broker serves less.
PREFERRED_VERSIONS: dict[int, int] = {
    ApiKey.LEADER_AND_ISR: 5,
    ApiKey.UPDATE_METADATA: 7,
    ApiKey.STOP_REPLICA: 3,
}
_SECURITY_PROTOCOL_IDS = {"PLAINTEXT": 0, "SSL": 1, "SASL_PLAINTEXT": 2, "SASL_SSL": 3}
# Kafka's LeaderAndIsr.LeaderDuringDelete: a partition of a topic being deleted.
LEADER_DURING_DELETE = -2

RECONNECT_BACKOFF_S = (0.05, 0.1, 0.2, 0.5, 1.0)
# A request answered later than this is logged with its size and how often it was sent (Kafka
# keeps the queue time per broker as a metric, RequestRateAndQueueTimeMs).
SLOW_REQUEST_S = 1.0


class BrokerRemovedError(KafkaClientError):
    """The broker left the channel (died, or the controller resigned) before an answer came."""


# --------------------------------------------------------------------------- request building


def _by_topic(states: Iterable[LeaderAndIsrPartitionState]) -> dict[str, list[LeaderAndIsrPartitionState]]:
    out: dict[str, list[LeaderAndIsrPartitionState]] = {}
    for s in states:
        out.setdefault(s.topic, []).append(s)
    return out


def build_leader_and_isr(
    request: core.LeaderAndIsrRequest, brokers: Mapping[int, BrokerInfo], version: int,
    listener_name: str = "PLAINTEXT", topic_ids: Mapping[str, UUID] | None = None,
) -> lai.LeaderAndIsrRequest:
    def state(s: LeaderAndIsrPartitionState) -> lai.LeaderAndIsrPartitionState:
        return lai.LeaderAndIsrPartitionState(
            topic_name=s.topic, partition_index=s.partition, controller_epoch=s.controller_epoch,
            leader=s.leader, leader_epoch=s.leader_epoch, isr=list(s.isr),
            partition_epoch=s.zk_version, replicas=list(s.replicas),
            adding_replicas=list(s.adding_replicas), removing_replicas=list(s.removing_replicas),
            is_new=s.is_new)

    live_leaders = []
    for b in request.live_leaders:
        info = brokers.get(b)
        ep = info.endpoint(listener_name) if info is not None else None
        if ep is not None:
            live_leaders.append(lai.LeaderAndIsrLiveLeader(b, ep.host, ep.port))
    out = lai.LeaderAndIsrRequest(
        controller_id=request.controller_id, controller_epoch=request.controller_epoch,
        broker_epoch=request.broker_epoch, live_leaders=live_leaders)
    if version < 2:
        out.ungrouped_partition_states = [state(s) for s in request.partition_states]
    else:
        ids = topic_ids or {}
        out.topic_states = [
            lai.LeaderAndIsrTopicState(topic_name=t, topic_id=ids.get(t, ZERO_UUID),
                                       partition_states=[state(s) for s in ss])
            for t, ss in sorted(_by_topic(request.partition_states).items())
        ]
    return out


def build_update_metadata(
    request: core.UpdateMetadataRequest, brokers: Mapping[int, BrokerInfo], version: int,
    listener_name: str = "PLAINTEXT", topic_ids: Mapping[str, UUID] | None = None,
) -> um.UpdateMetadataRequest:
    live = set(b for b, _ in request.live_brokers)
    offline_dirs = dict(request.offline_dir_replicas)

    def state(s: LeaderAndIsrPartitionState) -> um.UpdateMetadataPartitionState:
        # Kafka's offlineReplicas: a dead broker's, or one on a failed log dir
        on_failed_dir = offline_dirs.get(s.tp, ())
        return um.UpdateMetadataPartitionState(
            topic_name=s.topic, partition_index=s.partition, controller_epoch=s.controller_epoch,
            leader=s.leader, leader_epoch=s.leader_epoch, isr=list(s.isr),
            zk_version=s.zk_version, replicas=list(s.replicas),
            offline_replicas=[r for r in s.replicas if r not in live or r in on_failed_dir])

    live_brokers = []
    for b, _epoch in request.live_brokers:
        info = brokers.get(b)
        if info is None:
            continue
        plain = info.endpoint(listener_name) or (info.endpoints[0] if info.endpoints else None)
        live_brokers.append(um.UpdateMetadataBroker(
            id=b,
            v0_host=plain.host if plain else "",
            v0_port=plain.port if plain else -1,
            endpoints=[
                um.UpdateMetadataEndpoint(
                    port=e.port, host=e.host, listener=e.listener_name,
                    security_protocol=_SECURITY_PROTOCOL_IDS.get(e.security_protocol, 0))
                for e in info.endpoints
            ],
            rack=info.rack,
        ))
    out = um.UpdateMetadataRequest(
        controller_id=request.controller_id, controller_epoch=request.controller_epoch,
        broker_epoch=request.broker_epoch, live_brokers=live_brokers)
    if version < 5:
        out.ungrouped_partition_states = [state(s) for s in request.partition_states]
    else:
        ids = topic_ids or {}
        out.topic_states = [
            um.UpdateMetadataTopicState(topic_name=t, topic_id=ids.get(t, ZERO_UUID),
                                        partition_states=[state(s) for s in ss])
            for t, ss in sorted(_by_topic(request.partition_states).items())
        ]
    return out


def leader_and_isr_partition_errors(
    response: Any, topic_names: Mapping[UUID, str],
) -> dict[TopicPartition, int]:
    """Kafka's LeaderAndIsrResponse.partitionErrors: per partition its error code (v5+ name
    topics by id; a topic the controller no longer knows is left out)."""
    out: dict[TopicPartition, int] = {}
    for e in getattr(response, "partition_errors", None) or ():
        out[TopicPartition(e.topic_name, e.partition_index)] = e.error_code
    for t in getattr(response, "topics", None) or ():
        name = topic_names.get(t.topic_id)
        if name is not None:
            for e in t.partition_errors:
                out[TopicPartition(name, e.partition_index)] = e.error_code
    return out


def build_stop_replica(
    request: core.StopReplicaRequest, version: int,
    leader_epochs: Mapping[TopicPartition, int] | None = None,
) -> sr.StopReplicaRequest:
    epochs = leader_epochs or {}
    out = sr.StopReplicaRequest(
        controller_id=request.controller_id, controller_epoch=request.controller_epoch,
        broker_epoch=request.broker_epoch, delete_partitions=request.delete_partitions)
    by_topic: dict[str, list[int]] = {}
    for tp in request.partitions:
        by_topic.setdefault(tp[0], []).append(tp[1])
    if version == 0:
        out.ungrouped_partitions = [sr.StopReplicaPartitionV0(t, p) for t, p in request.partitions]
    elif version < 3:
        out.topics = [sr.StopReplicaTopicV1(t, sorted(ps)) for t, ps in sorted(by_topic.items())]
    else:
        # v3: per partition, the leader epoch (-2 = deletion: Kafka's EpochDuringDelete) and the
        # delete flag.
        out.topic_states = [
            sr.StopReplicaTopicState(t, [
                sr.StopReplicaPartitionState(
                    p,
                    -2 if request.delete_partitions else epochs.get(TopicPartition(t, p), -1),
                    request.delete_partitions)
                for p in sorted(ps)])
            for t, ps in sorted(by_topic.items())
        ]
    return out


def _partition_count(request: core.ControllerRequest) -> int:
    if isinstance(request, core.StopReplicaRequest):
        return len(request.partitions)
    return len(request.partition_states)


def merge_requests(
    first: core.ControllerRequest, second: core.ControllerRequest
) -> core.ControllerRequest | None:
    """One request equivalent to `first` then `second`, or None when they cannot merge."""
    if type(first) is not type(second) or first.controller_epoch != second.controller_epoch \
            or first.broker_epoch != second.broker_epoch:
        return None
    if isinstance(first, core.LeaderAndIsrRequest):
        assert isinstance(second, core.LeaderAndIsrRequest)
        states = {s.tp: s for s in first.partition_states}
        states.update({s.tp: s for s in second.partition_states})
        leaders = tuple(sorted(set(first.live_leaders) | set(second.live_leaders)))
        return core.LeaderAndIsrRequest(second.controller_id, second.controller_epoch,
                                        second.broker_epoch, tuple(states.values()), leaders)
    if isinstance(first, core.UpdateMetadataRequest):
        assert isinstance(second, core.UpdateMetadataRequest)
        states = {s.tp: s for s in first.partition_states}
        states.update({s.tp: s for s in second.partition_states})
        # (the offline-dir replicas: the later request's, a whole map like its live brokers)
        return core.UpdateMetadataRequest(second.controller_id, second.controller_epoch,
                                          second.broker_epoch, tuple(states.values()),
                                          second.live_brokers, second.offline_dir_replicas)
    assert isinstance(first, core.StopReplicaRequest) and isinstance(second, core.StopReplicaRequest)
    if first.delete_partitions != second.delete_partitions:
        return None
    tps = tuple(sorted(set(first.partitions) | set(second.partitions)))
    return core.StopReplicaRequest(second.controller_id, second.controller_epoch,
                                   second.broker_epoch, tps, second.delete_partitions)


# --------------------------------------------------------------------------- the channel


@dataclass
class _Item:
    request: core.ControllerRequest
    futures: list[asyncio.Future[Any]]


class _BrokerChannel:
    def __init__(self, manager: ControllerChannelManager, broker_id: int, info: BrokerInfo) -> None:
        self.manager = manager
        self.broker_id = broker_id
        self.info = info
        self.queue: list[_Item] = []
        self.wakeup = asyncio.Event()
        self.conn: BrokerConnection | None = None
        self.in_flight = False
        self.stopped = False
        self.task = asyncio.get_running_loop().create_task(
            self._run(), name=f"controller-to-broker-{broker_id}-send")

    def put(self, item: _Item) -> None:
        self.queue.append(item)
        self.wakeup.set()

    def _take_batch(self) -> _Item:
        item = self.queue.pop(0)
        while self.queue:
            merged = merge_requests(item.request, self.queue[0].request)
            if merged is None:
                break
            item = _Item(merged, item.futures + self.queue.pop(0).futures)
        return item

    async def _connect(self) -> BrokerConnection:
        attempt = 0
        while True:
            if self.stopped:
                raise BrokerRemovedError(f"broker {self.broker_id} removed from the channel")
            ep = self.info.endpoint(self.manager.listener_name) or self.info.endpoints[0]
            conn = BrokerConnection(ep.host, ep.port, client_id=f"controller-{self.manager.controller_id}",
                                    request_timeout_ms=self.manager.request_timeout_ms)
            try:
                await conn.connect(timeout_s=self.manager.socket_timeout_ms / 1000)
                return conn
            except (KafkaClientError, OSError) as e:
                delay = RECONNECT_BACKOFF_S[min(attempt, len(RECONNECT_BACKOFF_S) - 1)]
                attempt += 1
                if attempt == 1 or attempt % 20 == 0:
                    log.info("controller %d: cannot reach broker %d (%s); retrying",
                             self.manager.controller_id, self.broker_id, e)
                await asyncio.sleep(delay)

    async def _send_one(self, item: _Item) -> Any:
        request = item.request
        started, attempts = time.monotonic(), 0
        while True:
            if self.conn is None or self.conn.closed:
                self.conn = await self._connect()
            attempts += 1
            try:
                if isinstance(request, core.LeaderAndIsrRequest):
                    v = self._version(ApiKey.LEADER_AND_ISR)
                    msg: Any = build_leader_and_isr(request, self.manager.brokers, v,
                                                    self.manager.listener_name,
                                                    self.manager.topic_ids)
                elif isinstance(request, core.UpdateMetadataRequest):
                    v = self._version(ApiKey.UPDATE_METADATA)
                    msg = build_update_metadata(request, self.manager.brokers, v,
                                                self.manager.listener_name,
                                                self.manager.topic_ids)
                else:
                    v = self._version(ApiKey.STOP_REPLICA)
                    msg = build_stop_replica(request, v, self.manager.leader_epochs(request))
                response = await self.conn.send(msg, v)
                took = time.monotonic() - started
                if took >= SLOW_REQUEST_S:
                    log.info("controller %d: %s of %d partitions to broker %d answered after "
                             "%.1f s (%d sends)", self.manager.controller_id,
                             type(request).__name__, _partition_count(request), self.broker_id,
                             took, attempts)
                return response
            except KafkaClientError as e:
                log.info("controller %d: %s to broker %d failed (%s); resending",
                         self.manager.controller_id, type(request).__name__, self.broker_id, e)
                with contextlib.suppress(Exception):
                    await self.conn.close()
                self.conn = None
                await asyncio.sleep(RECONNECT_BACKOFF_S[0])
                if self.stopped:
                    raise BrokerRemovedError(
                        f"broker {self.broker_id} removed from the channel") from None

    def _version(self, api_key: int) -> int:
        assert self.conn is not None
        rng = self.conn.api_version_range(api_key)
        preferred = PREFERRED_VERSIONS[api_key]
        if rng is None:
            return preferred  # the broker will answer with an error; let it say so
        return max(rng[0], min(rng[1], preferred))

    async def _run(self) -> None:
        try:
            while not self.stopped:
                if not self.queue:
                    self.wakeup.clear()
                    await self.wakeup.wait()
                    continue
                item = self._take_batch()
                self.in_flight = True
                try:
                    response = await self._send_one(item)
                except BrokerRemovedError as e:
                    _fail(item.futures, e)
                    break
                except Exception as e:  # a request we could not encode: report, do not loop
                    log.exception("controller %d: cannot send %s to broker %d",
                                  self.manager.controller_id, type(item.request).__name__,
                                  self.broker_id)
                    _fail(item.futures, e)
                    continue
                finally:
                    self.in_flight = False
                self.manager.on_response(self.broker_id, item.request, response)
                for f in item.futures:
                    if not f.done():
                        f.set_result(response)
        finally:
            err = BrokerRemovedError(f"broker {self.broker_id} removed from the channel")
            for item in self.queue:
                _fail(item.futures, err)
            self.queue.clear()
            if self.conn is not None:
                with contextlib.suppress(Exception):
                    await self.conn.close()

    async def stop(self) -> None:
        self.stopped = True
        self.wakeup.set()
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self.task
        err = BrokerRemovedError(f"broker {self.broker_id} removed from the channel")
        for item in self.queue:
            _fail(item.futures, err)
        self.queue.clear()


def _fail(futures: Iterable[asyncio.Future[Any]], error: BaseException) -> None:
    for f in futures:
        if not f.done():
            f.set_exception(error)
            f.exception()  # retrieved: nobody has to wait for it


class ControllerChannelManager:
    """Queues and sender tasks for the brokers the controller knows are alive."""

    def __init__(
        self,
        controller_id: int,
        *,
        socket_timeout_ms: int = 30000,
        request_timeout_ms: int = 30000,
        listener_name: str = "PLAINTEXT",
        leader_epochs: Callable[[TopicPartition], int] | None = None,
        on_response: Callable[[int, core.ControllerRequest, Any], None] | None = None,
        topic_ids: Mapping[str, UUID] | None = None,
    ) -> None:
        self.controller_id = controller_id
        # The controller's live map of topic ids (read when a request is built, not copied).
        self.topic_ids: Mapping[str, UUID] = topic_ids if topic_ids is not None else {}
        # As Kafka's RequestSendThread: controller.socket.timeout.ms bounds the connection's
        # set-up, request.timeout.ms each request; a request that times out is sent again on
        # a new connection (the broker may still be working on the first one).
        self.socket_timeout_ms = socket_timeout_ms
        self.request_timeout_ms = request_timeout_ms
        self.listener_name = listener_name
        self.brokers: dict[int, BrokerInfo] = {}
        self._channels: dict[int, _BrokerChannel] = {}
        self._leader_epoch = leader_epochs
        self._on_response = on_response
        self.sent: dict[str, int] = {}  # request kind -> count, for stats and tests

    def leader_epochs(self, request: core.StopReplicaRequest) -> dict[TopicPartition, int]:
        if self._leader_epoch is None:
            return {}
        return {TopicPartition(*tp): self._leader_epoch(TopicPartition(*tp))
                for tp in request.partitions}

    def on_response(self, broker_id: int, request: core.ControllerRequest, response: Any) -> None:
        kind = type(request).__name__
        self.sent[kind] = self.sent.get(kind, 0) + 1
        code = getattr(response, "error_code", 0)
        if code:
            log.warning("controller %d: broker %d answered %s with error %d",
                        self.controller_id, broker_id, kind, code)
        if self._on_response is not None:
            try:
                self._on_response(broker_id, request, response)
            except Exception:  # noqa: BLE001 - the broker's sender task must go on
                log.exception("controller %d: handling broker %d's answer to %s failed",
                              self.controller_id, broker_id, kind)

    @property
    def broker_ids(self) -> list[int]:
        return sorted(self._channels)

    def add_broker(self, broker_id: int, info: BrokerInfo) -> None:
        """Start a queue and sender for the broker (replacing one to an old endpoint)."""
        old = self._channels.get(broker_id)
        if old is not None and old.info == info:
            return
        if old is not None:
            asyncio.get_running_loop().create_task(old.stop())
        self.brokers[broker_id] = info
        self._channels[broker_id] = _BrokerChannel(self, broker_id, info)

    async def remove_broker(self, broker_id: int) -> None:
        """Stop sending to the broker; queued requests fail with BrokerRemovedError."""
        ch = self._channels.pop(broker_id, None)
        self.brokers.pop(broker_id, None)
        if ch is not None:
            await ch.stop()

    def send(self, broker_id: int, request: core.ControllerRequest) -> asyncio.Future[Any]:
        """Queue a request; the future completes with the broker's response."""
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        ch = self._channels.get(broker_id)
        if ch is None:
            _fail([fut], BrokerRemovedError(f"broker {broker_id} is not in the channel"))
            return fut
        ch.put(_Item(request, [fut]))
        return fut

    def send_all(self, requests: Mapping[int, Iterable[core.ControllerRequest]]) -> list[asyncio.Future[Any]]:
        return [self.send(b, r) for b, rs in sorted(requests.items()) for r in rs]

    @property
    def idle(self) -> bool:
        """No request queued or awaiting its response, to any broker."""
        return not any(ch.queue or ch.in_flight for ch in self._channels.values())

    def queued(self, broker_id: int) -> int:
        ch = self._channels.get(broker_id)
        return len(ch.queue) if ch is not None else 0

    async def shutdown(self) -> None:
        channels, self._channels = self._channels, {}
        self.brokers = {}
        await asyncio.gather(*(ch.stop() for ch in channels.values()), return_exceptions=True)
