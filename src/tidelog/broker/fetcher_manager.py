"""`ReplicaFetcherManager`: the follower side of a broker, as asyncio tasks (seed 002/004).

Kafka runs `num.replica.fetchers` fetcher threads per source broker; a partition goes to fetcher
`abs(31 * topic.hashCode() + partition) % num.replica.fetchers` (`AbstractFetcherManager
.getFetcherId`). Here each (source broker, fetcher id) is one asyncio task driving the pure
`replication.fetcher.ReplicaFetcher` (truncation by OffsetsForLeaderEpoch, fetching, the error
table) over one `client.connection.BrokerConnection`:

    loop: requests = fetcher.poll_requests(now)  -> send each (at most one of a kind in flight)
          response -> fetcher.handle_response(...) ; failure -> fetcher.on_request_failed(...)
          sleep until a response, a partition change, or the fetcher's next wake-up

A fetch response is followed at once by the next fetch from the task that handled it (as
Kafka's fetcher thread loops), so the leader learns of the append one network hop later.

A connection that fails is closed and reopened with a bounded exponential back-off; a request
that fails backs off only its own partitions (`replica.fetch.backoff.ms`), and a partition the
fetcher marks failed (storage error, fencing) stops alone while the others go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from tidelog.client.connection import BrokerConnection
from tidelog.client.errors import KafkaClientError, RequestTimedOutError
from tidelog.protocol.messages.fetch import FetchPartition as WireFetchPartition
from tidelog.protocol.messages.fetch import FetchRequest as WireFetchRequest
from tidelog.protocol.messages.fetch import FetchTopic, ForgottenTopic
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
from tidelog.replication.config import ReplicationConfig
from tidelog.replication.errors import Errors
from tidelog.replication.fetcher import (
    FetcherRequest,
    FetchRequest,
    FetchResponseData,
    OffsetsForLeaderEpochRequest,
    ReplicaFetcher,
)
from tidelog.replication.types import (
    AddFetcher,
    EpochEndOffset,
    FetcherAction,
    FetchPartitionData,
    ListOffsetsPartitionResult,
    RemoveFetcher,
    TopicPartition,
)

__all__ = ["ReplicaFetcherManager", "fetcher_id_for", "java_string_hash"]

logger = logging.getLogger(__name__)

# Endpoint lookup: broker id -> (host, port), or None while unknown.
EndpointLookup = Callable[[int], tuple[str, int] | None]


def java_string_hash(s: str) -> int:
    """Java's `String.hashCode` (UTF-16 code units, 32-bit signed overflow)."""
    h = 0
    data = s.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def fetcher_id_for(tp: TopicPartition, num_fetchers: int) -> int:
    """Kafka's `getFetcherId`: `Utils.abs(31 * topic.hashCode + partition) % numFetchers`."""
    v = (31 * java_string_hash(tp.topic) + tp.partition) & 0xFFFFFFFF
    v = v - (1 << 32) if v >= 1 << 31 else v
    v = 0 if v == -(1 << 31) else abs(v)
    return v % max(1, num_fetchers)


def _now_ms() -> int:
    return int(time.time() * 1000)


def _error(code: int) -> Errors:
    try:
        return Errors(code)
    except ValueError:
        return Errors.UNKNOWN_SERVER_ERROR


def _by_topic(partitions: Iterable[TopicPartition]) -> dict[str, list[TopicPartition]]:
    out: dict[str, list[TopicPartition]] = {}
    for tp in partitions:
        out.setdefault(tp.topic, []).append(tp)
    return out


# ---------------------------------------------------------------- wire translation


def to_wire(request: FetcherRequest) -> Any:
    """The core's request dataclass -> the generated protocol request."""
    if isinstance(request, FetchRequest):
        listed = request.listed
        return WireFetchRequest(
            replica_id=request.replica_id,
            max_wait_ms=request.max_wait_ms,
            min_bytes=request.min_bytes,
            max_bytes=request.max_bytes,
            isolation_level=0,
            session_id=request.session_id,
            session_epoch=request.session_epoch,
            topics=[
                FetchTopic(
                    topic=topic,
                    partitions=[
                        WireFetchPartition(
                            partition=tp.partition,
                            current_leader_epoch=listed[tp].current_leader_epoch,
                            fetch_offset=listed[tp].fetch_offset,
                            log_start_offset=listed[tp].log_start_offset,
                            partition_max_bytes=listed[tp].max_bytes,
                        )
                        for tp in tps
                    ],
                )
                for topic, tps in _by_topic(listed).items()
            ],
            forgotten_topics_data=[
                ForgottenTopic(topic=topic, partitions=[tp.partition for tp in tps])
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


def from_wire(request: FetcherRequest, response: Any) -> Any:
    """The generated protocol response -> the core's ``{tp: result}`` (for a fetch, with the
    session fields: ``FetchResponseData``)."""
    out: dict[TopicPartition, Any] = {}
    if isinstance(request, FetchRequest):
        for t in response.responses:
            for p in t.partitions:
                out[TopicPartition(t.topic, p.partition_index)] = FetchPartitionData(
                    _error(p.error_code), p.high_watermark, p.log_start_offset,
                    p.records if p.records is not None else b"", p.last_stable_offset,
                )
        return FetchResponseData(_error(response.error_code), response.session_id, out)
    if isinstance(request, OffsetsForLeaderEpochRequest):
        for t in response.topics:
            for p in t.partitions:
                out[TopicPartition(t.topic, p.partition)] = EpochEndOffset(
                    _error(p.error_code), p.leader_epoch, p.end_offset
                )
    else:
        for t in response.topics:
            for p in t.partitions:
                out[TopicPartition(t.name, p.partition_index)] = ListOffsetsPartitionResult(
                    _error(p.error_code), p.offset, p.leader_epoch
                )
    return out


# ---------------------------------------------------------------- one fetcher task


class FetcherTask:
    """One (source broker, fetcher id): a `ReplicaFetcher` and the task that drives it."""

    def __init__(
        self,
        manager: ReplicaFetcherManager,
        source_broker: int,
        fetcher_id: int,
        fetcher: ReplicaFetcher,
    ) -> None:
        self.manager = manager
        self.source_broker = source_broker
        self.fetcher_id = fetcher_id
        self.fetcher = fetcher
        self.connection: BrokerConnection | None = None
        self.task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._inflight: set[asyncio.Task[None]] = set()
        self._stopping = False
        self.connects = 0
        self.failures = 0

    @property
    def name(self) -> str:
        return f"ReplicaFetcher-{self.fetcher_id}-{self.source_broker}"

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._run(), name=self.name)

    def wake(self) -> None:
        self._wake.set()

    async def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        for t in list(self._inflight):
            t.cancel()
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(BaseException):
                await self.task
        await self._close_connection()

    async def _close_connection(self) -> None:
        conn, self.connection = self.connection, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()

    async def _ensure_connection(self) -> BrokerConnection | None:
        conn = self.connection
        if conn is not None and not conn.closed:
            return conn
        endpoint = self.manager.endpoint_of(self.source_broker)
        if endpoint is None:
            return None
        cfg = self.manager.config
        conn = BrokerConnection(
            endpoint[0], endpoint[1], client_id=f"broker-{self.manager.broker_id}-{self.name}",
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

    async def _run(self) -> None:
        backoff_s = 0.05
        max_backoff_s = max(0.2, self.manager.config.replica_fetch_backoff_ms / 1000)
        while not self._stopping:
            try:
                if len(self.fetcher.partition_states) == 0 and not self._inflight:
                    await self._wait(None)
                    continue
                conn = await self._ensure_connection()
                if conn is None:
                    # Leader unknown or unreachable: back off (bounded) and retry.
                    self._fail_all_inflight()
                    await self._wait(backoff_s)
                    backoff_s = min(max_backoff_s, backoff_s * 2)
                    continue
                backoff_s = 0.05
                self._wake.clear()
                self._send_ready(conn)
                wakeup = self.fetcher.next_wakeup_ms(_now_ms())
                timeout = None if wakeup is None else max(0.005, (wakeup - _now_ms()) / 1000)
                if timeout is None and not self._inflight:
                    timeout = 0.1  # a partition is ready but nothing was sent (should not last)
                await self._wait(timeout)
            except asyncio.CancelledError:
                raise
            except Exception:  # never let one bad response kill the fetcher
                logger.exception("%s: unexpected error; backing off", self.name)
                await asyncio.sleep(max_backoff_s)

    def _fail_all_inflight(self) -> None:
        now = _now_ms()
        for request in self.fetcher.in_flight():
            self.fetcher.on_request_failed(request, now)

    async def _wait(self, timeout_s: float | None) -> None:
        if not self._wake.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=timeout_s)
        self._wake.clear()

    def _send_ready(self, conn: BrokerConnection, keep: type | None = None) -> Any:
        """Start sending every request the fetcher has ready, each in its own task; with
        ``keep``, the first request of that kind is returned for the caller to send instead."""
        kept = None
        for request in self.fetcher.poll_requests(_now_ms()):
            if kept is None and keep is not None and isinstance(request, keep):
                kept = request
                continue
            t = asyncio.get_running_loop().create_task(self._send(conn, request))
            self._inflight.add(t)
            t.add_done_callback(self._inflight.discard)
        return kept

    async def _send(self, conn: BrokerConnection, request: FetcherRequest) -> None:
        while True:
            handled = await self._exchange(conn, request)
            nxt = None
            if (handled and isinstance(request, FetchRequest) and not self._stopping
                    and self.connection is conn and not conn.closed):
                # Kafka's fetcher thread goes straight from processing a fetch response to its
                # next fetch: send it from here, without a round through the run loop (the
                # leader completes an acks=all request only when this next fetch arrives).
                nxt = self._send_ready(conn, keep=FetchRequest)
            self.wake()
            if nxt is None:
                return
            request = nxt

    async def _exchange(self, conn: BrokerConnection, request: FetcherRequest) -> bool:
        """Send one request and apply its response; False if it failed."""
        timeout_ms = self.manager.config.replica_socket_timeout_ms
        if isinstance(request, FetchRequest):
            timeout_ms += request.max_wait_ms
        try:
            response = await conn.send(to_wire(request), timeout_ms=timeout_ms)
            translated = from_wire(request, response)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self.failures += 1
            logger.debug("%s: %s failed: %s", self.name, type(request).__name__, e)
            self.fetcher.on_request_failed(request, _now_ms())
            if not isinstance(e, RequestTimedOutError) and self.connection is conn:
                # a broken connection (a timeout leaves it usable for the others)
                await self._close_connection()
            return False
        try:
            result = self.fetcher.handle_response(request, translated, _now_ms())
        except Exception:
            logger.exception("%s: handling a %s response failed", self.name, type(request).__name__)
            self.fetcher.on_request_failed(request, _now_ms())
            result = None
        if result is not None and result.failed:
            logger.warning("%s: partitions failed: %s", self.name, sorted(map(str, result.failed)))
        self.manager.on_progress()
        return True


# ---------------------------------------------------------------- the manager


class ReplicaFetcherManager:
    def __init__(
        self,
        broker_id: int,
        logs: Callable[[TopicPartition], Any],
        config: ReplicationConfig,
        endpoint_of: EndpointLookup,
        *,
        num_fetchers: int = 1,
        broker_epoch: int = 0,
        on_progress: Callable[[], None] | None = None,
    ) -> None:
        self.broker_id = broker_id
        self.config = config
        self.num_fetchers = max(1, num_fetchers)
        self.broker_epoch = broker_epoch
        self._logs = logs
        self._endpoint_of = endpoint_of
        self._on_progress = on_progress
        self.fetchers: dict[tuple[int, int], FetcherTask] = {}
        self._source_of: dict[TopicPartition, tuple[int, int]] = {}
        self._request_ids = 0

    def endpoint_of(self, broker_id: int) -> tuple[str, int] | None:
        return self._endpoint_of(broker_id)

    def on_progress(self) -> None:
        if self._on_progress is not None:
            self._on_progress()

    def set_broker_epoch(self, broker_epoch: int) -> None:
        self.broker_epoch = broker_epoch
        for task in self.fetchers.values():
            task.fetcher.broker_epoch = broker_epoch

    # ------------------------------------------------------------------ Kafka's API
    def apply(self, actions: Iterable[FetcherAction]) -> None:
        """Carry out the core's AddFetcher / RemoveFetcher actions, in order."""
        for action in actions:
            if isinstance(action, RemoveFetcher):
                self.remove_fetcher_for_partitions([action.tp])
            elif isinstance(action, AddFetcher):
                self.add_fetcher_for_partitions(
                    {action.tp: (action.source_broker, action.fetch_offset, action.leader_epoch)}
                )

    def add_fetcher_for_partitions(
        self, partitions: Mapping[TopicPartition, tuple[int, int, int]]
    ) -> None:
        """``{tp: (source broker, fetch offset, leader epoch)}``: start replicating them."""
        now = _now_ms()
        for tp, (source, fetch_offset, leader_epoch) in partitions.items():
            key = (source, fetcher_id_for(tp, self.num_fetchers))
            old = self._source_of.get(tp)
            if old is not None and old != key:
                self.remove_fetcher_for_partitions([tp])
            task = self.fetchers.get(key)
            if task is None:
                self._request_ids += 1
                fetcher = ReplicaFetcher(
                    self.broker_id, source, self._logs, self.config,
                    broker_epoch=self.broker_epoch, first_request_id=self._request_ids << 32,
                )
                task = FetcherTask(self, source, key[1], fetcher)
                self.fetchers[key] = task
                task.start()
            task.fetcher.add_partitions({tp: (fetch_offset, leader_epoch)}, now)
            self._source_of[tp] = key
            task.wake()

    def remove_fetcher_for_partitions(self, partitions: Iterable[TopicPartition]) -> None:
        for tp in partitions:
            key = self._source_of.pop(tp, None)
            if key is not None and key in self.fetchers:
                self.fetchers[key].fetcher.remove_partitions([tp])
                self.fetchers[key].wake()

    async def shutdown_idle_fetcher_threads(self) -> None:
        for key in [k for k, t in self.fetchers.items() if t.fetcher.is_idle]:
            task = self.fetchers.pop(key)
            await task.stop()

    async def shutdown(self) -> None:
        tasks = list(self.fetchers.values())
        self.fetchers.clear()
        self._source_of.clear()
        for t in tasks:
            await t.stop()

    # ------------------------------------------------------------------ views
    def source_of(self, tp: TopicPartition) -> int | None:
        key = self._source_of.get(tp)
        return None if key is None else key[0]

    def fetch_state(self, tp: TopicPartition) -> Any:
        key = self._source_of.get(tp)
        if key is None or key not in self.fetchers:
            return None
        return self.fetchers[key].fetcher.partition_states.state_value(tp)

    @property
    def failed_partitions(self) -> set[TopicPartition]:
        out: set[TopicPartition] = set()
        for t in self.fetchers.values():
            out |= t.fetcher.failed_partitions
        return out
