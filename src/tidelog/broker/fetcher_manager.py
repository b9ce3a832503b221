"""The asyncio broker's transport for the shared `shell.ReplicaFetcherManager`: one
`BrokerLeaderEndPoint` per (source broker, fetcher id), a `client.connection.BrokerConnection`
to the leader, and the translation between the core's fetcher requests and the wire messages
(Fetch, OffsetsForLeaderEpoch, ListOffsets).

A request that cannot be sent (leader unknown or unreachable) or whose answer does not come
fails, and the fetcher backs its partitions off (`replica.fetch.backoff.ms`); a broken
connection is closed and opened again for the next request.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any
from uuid import UUID

from tidelog.client.connection import BrokerConnection
from tidelog.client.errors import KafkaClientError, RequestTimedOutError
from tidelog.protocol.api_keys import ApiKey
from tidelog.protocol.messages.fetch import FetchPartition as WireFetchPartition
from tidelog.protocol.messages.fetch import FetchRequest as WireFetchRequest
from tidelog.protocol.messages.fetch import FetchTopic, ForgottenTopic, ReplicaState
from tidelog.protocol.messages.list_offsets import (
    ListOffsetsPartition,
    ListOffsetsTopic,
)
from tidelog.protocol.messages.list_offsets import ListOffsetsRequest as WireListOffsetsRequest
from tidelog.protocol.messages.offset_for_leader_epoch import (
    OffsetForLeaderEpochRequest,
    OffsetForLeaderPartition,
    OffsetForLeaderTopic,
)
from tidelog.protocol.primitives import ZERO_UUID
from tidelog.replication.config import ReplicationConfig
from tidelog.replication.errors import Errors
from tidelog.replication.fetcher import (
    FetcherRequest,
    FetchRequest,
    FetchResponseData,
    OffsetsForLeaderEpochRequest,
)
from tidelog.replication.types import (
    EpochEndOffset,
    FetchPartitionData,
    ListOffsetsPartitionResult,
    TopicPartition,
)

__all__ = ["BrokerLeaderEndPoint", "from_wire", "to_wire"]

logger = logging.getLogger(__name__)

# Endpoint lookup: broker id -> (host, port), or None while unknown.
EndpointLookup = Callable[[int], tuple[str, int] | None]
# Topic id lookup (the metadata cache's): the zero id while unknown.
TopicIdLookup = Callable[[str], UUID]
# The last Fetch version that names topics (v13+ name them by id only, KIP-516).
_FETCH_BY_NAME_MAX_VERSION = 12


def _no_topic_id(_topic: str) -> UUID:
    return ZERO_UUID


# An answer's error codes to the core's Errors by a table: Errors(code) (the enum's call, ~1 us)
# for each partition of an answer was most of reading a 10,000-partition answer.
# (looked up inline, an unknown code is UNKNOWN_SERVER_ERROR)
_ERRORS: dict[int, Errors] = {e.value: e for e in Errors}
_UNKNOWN = Errors.UNKNOWN_SERVER_ERROR


def _by_topic(partitions: Iterable[TopicPartition]) -> dict[str, list[TopicPartition]]:
    out: dict[str, list[TopicPartition]] = {}
    for tp in partitions:
        out.setdefault(tp.topic, []).append(tp)
    return out


# ---------------------------------------------------------------- wire translation


def to_wire(request: FetcherRequest, topic_id_of: TopicIdLookup = _no_topic_id,
            forgotten_id_of: TopicIdLookup | None = None) -> Any:
    """The core's request dataclass -> the generated protocol request. A fetch names its topics
    by id too when ``topic_id_of`` knows them all (then it goes as v13+, and from v15 carries this
    broker's epoch in its ReplicaState, as Kafka's ReplicaFetcherThread sends it); its forgotten
    partitions by ``forgotten_id_of`` (default ``topic_id_of``): the id the session holds them
    under."""
    if isinstance(request, FetchRequest):
        forgotten_id_of = forgotten_id_of or topic_id_of
        listed = request.listed
        return WireFetchRequest(
            replica_id=request.replica_id,
            replica_state=ReplicaState(request.replica_id, request.broker_epoch),
            max_wait_ms=request.max_wait_ms,
            min_bytes=request.min_bytes,
            max_bytes=request.max_bytes,
            isolation_level=0,
            session_id=request.session_id,
            session_epoch=request.session_epoch,
            topics=[
                FetchTopic(
                    topic=topic,
                    topic_id=topic_id_of(topic),
                    partitions=[
                        WireFetchPartition(
                            partition=tp.partition,
                            current_leader_epoch=listed[tp].current_leader_epoch,
                            fetch_offset=listed[tp].fetch_offset,
                            log_start_offset=listed[tp].log_start_offset,
                            partition_max_bytes=listed[tp].max_bytes,
                            last_fetched_epoch=listed[tp].last_fetched_epoch,
                        )
                        for tp in tps
                    ],
                )
                for topic, tps in _by_topic(listed).items()
            ],
            forgotten_topics_data=[
                ForgottenTopic(topic=topic, topic_id=forgotten_id_of(topic),
                               partitions=[tp.partition for tp in tps])
                for topic, tps in _by_topic(request.to_forget).items()
            ],
        )
    if isinstance(request, OffsetsForLeaderEpochRequest):
        return OffsetForLeaderEpochRequest(
            replica_id=request.replica_id,
            topics=[
                OffsetForLeaderTopic(
                    topic=topic,
                    partitions=[
                        OffsetForLeaderPartition(
                            partition=tp.partition,
                            current_leader_epoch=request.partitions[tp][0],
                            leader_epoch=request.partitions[tp][1],
                        )
                        for tp in tps
                    ],
                )
                for topic, tps in _by_topic(request.partitions).items()
            ],
        )
    return WireListOffsetsRequest(
        replica_id=request.replica_id,
        topics=[
            ListOffsetsTopic(
                name=topic,
                partitions=[
                    ListOffsetsPartition(
                        partition_index=tp.partition,
                        current_leader_epoch=request.partitions[tp][0],
                        timestamp=request.partitions[tp][1],
                    )
                    for tp in tps
                ],
            )
            for topic, tps in _by_topic(request.partitions).items()
        ],
    )


def from_wire(request: FetcherRequest, response: Any,
              topic_names: Mapping[UUID, str] | None = None) -> Any:
    """The generated protocol response -> the core's ``{tp: result}`` (for a fetch, with the
    session fields: ``FetchResponseData``). ``topic_names``: the topic ids this fetcher named (a
    v13+ answer names topics by id only)."""
    out: dict[TopicPartition, Any] = {}
    error = _ERRORS.get
    if isinstance(request, FetchRequest):
        for t in response.responses:
            topic = t.topic or (topic_names or {}).get(t.topic_id)
            if topic is None:
                continue  # an id this fetch did not name
            for p in t.partitions:
                de = p.diverging_epoch  # v12+; None or epoch -1: none
                out[TopicPartition(topic, p.partition_index)] = FetchPartitionData(
                    error(p.error_code, _UNKNOWN), p.high_watermark, p.log_start_offset,
                    p.records if p.records is not None else b"", p.last_stable_offset,
                    diverging_epoch=(None if de is None or de.epoch < 0
                                     else (de.epoch, de.end_offset)),
                )
        return FetchResponseData(error(response.error_code, _UNKNOWN), response.session_id, out)
    if isinstance(request, OffsetsForLeaderEpochRequest):
        for t in response.topics:
            for p in t.partitions:
                out[TopicPartition(t.topic, p.partition)] = EpochEndOffset(
                    error(p.error_code, _UNKNOWN), p.leader_epoch, p.end_offset
                )
    else:
        for t in response.topics:
            for p in t.partitions:
                out[TopicPartition(t.name, p.partition_index)] = ListOffsetsPartitionResult(
                    error(p.error_code, _UNKNOWN), p.offset, p.leader_epoch
                )
    return out


# ---------------------------------------------------------------- the endpoint


class SessionTopicIds:
    """The topic id each topic of a fetcher's session is held under at the leader (Kafka's
    FetchSessionHandler keeps it with each partition). The leader keys a v13+ session by id, so
    a topic deleted and created again under the same name while the session holds it is
    swapped: its partitions forgotten under the old id and listed under the new one; and a
    partition leaving the session is forgotten under the id it was held under."""

    def __init__(self, topic_id_of: TopicIdLookup) -> None:
        self._topic_id_of = topic_id_of
        self.held: dict[str, UUID] = {}

    def plan(self, request: FetchRequest, topics: dict[str, UUID]
             ) -> tuple[FetchRequest, TopicIdLookup]:
        """The request to send (with the swapped partitions) and the ids to forget under;
        ``topics``: the current id of each topic ``request`` wants. Remembers the ids the
        request holds its topics under."""
        held = self.held
        if request.session_epoch <= 0:  # a full fetch opens a new session
            held.clear()
        else:
            swapped = {t for t, new in topics.items()
                       if new != ZERO_UUID and held.get(t, new) != new}
            if swapped:
                moved = {tp: data for tp, data in request.partitions.items()
                         if tp.topic in swapped}
                request = replace(request, to_send={**request.listed, **moved},
                                  to_forget=(*request.to_forget, *moved))
        forgotten = {tp.topic: held.get(tp.topic, self._topic_id_of(tp.topic))
                     for tp in request.to_forget}
        for tp in request.listed:
            if (topic_id := topics.get(tp.topic, ZERO_UUID)) != ZERO_UUID:
                held[tp.topic] = topic_id
        for topic in [t for t in held if t not in topics]:
            del held[topic]
        return request, lambda topic: forgotten.get(topic, ZERO_UUID)


class BrokerLeaderEndPoint:
    """One fetcher's connection to its leader (Kafka's `RemoteLeaderEndPoint`)."""

    def __init__(self, broker_id: int, source_broker: int, fetcher_id: int,
                 config: ReplicationConfig, endpoint_of: EndpointLookup,
                 topic_id_of: TopicIdLookup | None = None) -> None:
        self.broker_id = broker_id
        self._topic_id_of = topic_id_of or _no_topic_id
        self._topic_names: dict[UUID, str] = {}
        self._session_ids = SessionTopicIds(self._topic_id_of)
        self.source_broker = source_broker
        self.fetcher_id = fetcher_id
        self.config = config
        self._endpoint_of = endpoint_of
        self.connection: BrokerConnection | None = None
        self._connecting = asyncio.Lock()
        self._inflight: set[asyncio.Task[None]] = set()  # connecting before a send
        self._answers: set[asyncio.Future[Any]] = set()  # requests awaiting their answer
        self._closing: set[asyncio.Task[None]] = set()
        self.connects = 0
        self.failures = 0

    @property
    def name(self) -> str:
        return f"ReplicaFetcher-{self.fetcher_id}-{self.source_broker}"

    def send(self, request: FetcherRequest, on_done: Callable[[Any | None], None]) -> None:
        """Send ``request``; ``on_done`` gets the translated response, or None, in a later turn.
        On an open connection the request is written at once and answered from its future's
        callback (Kafka's fetcher thread goes from one response to the next request: no task
        per round trip); otherwise a task connects first."""
        conn = self.connection
        if conn is not None and not conn.closed:
            self._start(conn, request, on_done)
            return
        task = asyncio.get_running_loop().create_task(self._connect_and_start(request, on_done))
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)

    def close(self) -> None:
        for t in list(self._inflight):
            t.cancel()
        for f in list(self._answers):
            f.cancel()  # abandoned: its on_done is not called, as for a cancelled task
        conn, self.connection = self.connection, None
        if conn is not None:
            asyncio.get_running_loop().create_task(conn.close())

    async def _ensure_connection(self) -> BrokerConnection | None:
        async with self._connecting:
            conn = self.connection
            if conn is not None and not conn.closed:
                return conn
            endpoint = self._endpoint_of(self.source_broker)
            if endpoint is None:
                return None
            cfg = self.config
            conn = BrokerConnection(
                endpoint[0], endpoint[1], client_id=f"broker-{self.broker_id}-{self.name}",
                request_timeout_ms=cfg.replica_socket_timeout_ms,
            )
            try:
                await conn.connect(timeout_s=max(1.0, cfg.replica_socket_timeout_ms / 1000))
            except (KafkaClientError, OSError) as e:
                logger.info("%s: cannot connect to broker %d at %s:%d: %s", self.name,
                            self.source_broker, endpoint[0], endpoint[1], e)
                return None
            self.connects += 1
            self.connection = conn
            return conn

    async def _connect_and_start(self, request: FetcherRequest,
                                 on_done: Callable[[Any | None], None]) -> None:
        conn = await self._ensure_connection()
        if conn is None:
            on_done(None)
            return
        self._start(conn, request, on_done)

    def _start(self, conn: BrokerConnection, request: FetcherRequest,
               on_done: Callable[[Any | None], None]) -> None:
        timeout_ms = self.config.replica_socket_timeout_ms
        try:
            version: int | None = None
            if isinstance(request, FetchRequest):
                timeout_ms += request.max_wait_ms
                # Kafka's RemoteLeaderEndPoint: v13+ (topic ids; v15+ this broker's epoch) when
                # every partition of the fetch has a topic id, else v12 (by name).
                ids = {tp.topic: self._topic_id_of(tp.topic)
                       for tp in (*request.partitions, *request.to_forget)}
                by_id = all(i != ZERO_UUID for i in ids.values())
                version = conn.pick_version(ApiKey.FETCH,
                                            None if by_id else _FETCH_BY_NAME_MAX_VERSION)
                # An incremental fetch's answer names the session's topics by id, also those
                # this request did not list.
                self._topic_names.update((i, t) for t, i in ids.items() if i != ZERO_UUID)
                # The ids the session holds its topics under (a re-created topic swapped).
                sent, forgotten_id_of = self._session_ids.plan(
                    request, {tp.topic: ids[tp.topic] for tp in request.partitions})
                wire = to_wire(sent, self._topic_id_of, forgotten_id_of)
            else:
                wire = to_wire(request, self._topic_id_of)
                version = conn.pick_version(wire.API_KEY)
            answer = conn.request_future(wire, version, timeout_ms)
        except Exception as e:
            # (never on_done from inside send: the fetcher is still building its requests)
            asyncio.get_running_loop().call_soon(self._failed, conn, request, e, on_done)
            return
        self._answers.add(answer)
        answer.add_done_callback(lambda f: self._answered(conn, request, f, on_done))

    def _answered(self, conn: BrokerConnection, request: FetcherRequest,
                  answer: asyncio.Future[Any], on_done: Callable[[Any | None], None]) -> None:
        self._answers.discard(answer)
        if answer.cancelled():
            return  # closed (a fetcher removed or stopped)
        error = answer.exception()
        if error is None:
            try:
                translated = from_wire(request, answer.result(), self._topic_names)
            except Exception as e:
                self._failed(conn, request, e, on_done)
                return
            on_done(translated)
        else:
            self._failed(conn, request, error, on_done)

    def _failed(self, conn: BrokerConnection, request: FetcherRequest, error: BaseException,
                on_done: Callable[[Any | None], None]) -> None:
        self.failures += 1
        logger.debug("%s: %s failed: %s", self.name, type(request).__name__, error)
        if not isinstance(error, RequestTimedOutError) and self.connection is conn:
            # a broken connection (a timeout leaves it usable for the others)
            self.connection = None
            closing = asyncio.get_running_loop().create_task(conn.close())
            self._closing.add(closing)
            closing.add_done_callback(self._closing.discard)
        on_done(None)
