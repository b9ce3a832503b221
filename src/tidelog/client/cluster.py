"""A cluster-aware client: bootstrap, metadata, a connection per broker, typed requests.

:class:`KafkaClient` is what the producer, the consumer, the CLI and the Spark connector use.
It bootstraps from any of its servers (trying each in turn), keeps a :class:`ClusterMetadata`
snapshot, holds one pipelined :class:`BrokerConnection` per broker (reopened when it breaks),
and offers typed helpers for the data and admin APIs. A helper that meets a retriable Kafka
error (``ErrorCode.retriable``: NOT_LEADER_OR_FOLLOWER, LEADER_NOT_AVAILABLE, ...) or a broken
connection refreshes the metadata and retries, a bounded number of times with backoff, as
Kafka's clients do; non-retriable errors are returned (data APIs) or raised (admin APIs).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from tidelog.client.connection import DEFAULT_MAX_FRAME_BYTES, BrokerConnection
from tidelog.client.errors import (
    BrokerResponseError,
    KafkaClientError,
    KafkaConnectionError,
    NoBrokersAvailableError,
    RequestTimedOutError,
)
from tidelog.client.metadata import ClusterMetadata, PartitionMetadata, TopicPartition
from tidelog.protocol.api_keys import ApiKey
from tidelog.protocol.errors import ErrorCode
from tidelog.protocol.messages import create_partitions as m_cp
from tidelog.protocol.messages import delete_records as m_dr
from tidelog.protocol.messages import elect_leaders as m_el
from tidelog.protocol.messages.create_topics import (
    CreatableReplicaAssignment,
    CreatableTopic,
    CreatableTopicConfig,
    CreateTopicsRequest,
)
from tidelog.protocol.messages.delete_topics import DeleteTopicsRequest, DeleteTopicState
from tidelog.protocol.messages.describe_configs import (
    DescribeConfigsRequest,
    DescribeConfigsResource,
)
from tidelog.protocol.messages.fetch import (
    FetchPartition,
    FetchRequest,
    FetchTopic,
    ForgottenTopic,
)
from tidelog.protocol.messages.list_offsets import (
    ListOffsetsPartition,
    ListOffsetsRequest,
    ListOffsetsTopic,
)
from tidelog.protocol.messages.metadata import MetadataRequest, MetadataRequestTopic
from tidelog.protocol.messages.offset_for_leader_epoch import (
    OffsetForLeaderEpochRequest,
    OffsetForLeaderPartition,
    OffsetForLeaderTopic,
)
from tidelog.protocol.messages.produce import (
    PartitionProduceData,
    ProduceRequest,
    TopicProduceData,
)

__all__ = [
    "EARLIEST_TIMESTAMP",
    "LATEST_TIMESTAMP",
    "FetchResult",
    "KafkaClient",
    "NewTopic",
    "OffsetAndEpoch",
    "RESOURCE_BROKER",
    "RESOURCE_TOPIC",
    "TopicPartition",
    "parse_bootstrap_servers",
]

# ListOffsets special timestamps (Kafka's ListOffsetsRequest.EARLIEST/LATEST_TIMESTAMP).
LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2
# DescribeConfigs resource types (Kafka's ConfigResource.Type).
RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4

# Highest versions this client sends where newer ones need what it does not track:
# Fetch v13+ addresses topics by id only.
_CLIENT_MAX_VERSIONS: dict[int, int] = {ApiKey.FETCH: 12}

T = TypeVar("T")


def parse_bootstrap_servers(servers: str | Sequence[str]) -> list[tuple[str, int]]:
    """``"h1:9092,h2:9093"`` or a list of ``host:port`` -> [(host, port)]; ValueError if bad."""
    items = servers.split(",") if isinstance(servers, str) else list(servers)
    out: list[tuple[str, int]] = []
    for raw in items:
        item = raw.strip()
        if not item:
            continue
        if "://" in item:
            item = item.split("://", 1)[1]
        host, sep, port_text = item.rpartition(":")
        if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise ValueError(f"bad bootstrap server {raw!r} (expected host:port)")
        out.append((host.strip("[]"), int(port_text)))
    if not out:
        raise ValueError("no bootstrap servers given")
    return out


@dataclass(frozen=True, slots=True)
class NewTopic:
    """A topic to create: either a partition count and replication factor (-1 = the broker's
    defaults) or an explicit replica assignment {partition: [broker ids]}."""

    name: str
    num_partitions: int = -1
    replication_factor: int = -1
    configs: Mapping[str, str | None] = field(default_factory=dict)
    replica_assignment: Mapping[int, Sequence[int]] = field(default_factory=dict)


@dataclass(slots=True)
class FetchResult:
    """One partition of a Fetch response. ``records`` holds raw record batches (the last one
    may be cut short; ``iter_batches`` skips it)."""

    error: ErrorCode | int
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    records: bytes | memoryview = b""
    diverging_epoch: tuple[int, int] | None = None  # (epoch, end_offset), Fetch v12+
    preferred_read_replica: int = -1
    # READ_COMMITTED: (producer id, first offset) of the aborted transactions in the records
    # (see client/read_committed.py); None otherwise
    aborted_transactions: tuple[tuple[int, int], ...] | None = None


@dataclass(frozen=True, slots=True)
class OffsetAndEpoch:
    """A ListOffsets / OffsetForLeaderEpoch answer for one partition."""

    error: ErrorCode | int
    offset: int = -1
    leader_epoch: int = -1
    timestamp: int = -1


def _code(value: int) -> ErrorCode | int:
    try:
        return ErrorCode(value)
    except ValueError:
        return value


def _is_retriable(code: int) -> bool:
    try:
        return ErrorCode(code).retriable
    except ValueError:
        return False


class KafkaClient:
    """A client for a whole cluster. ``await start()`` (or ``async with``) before use."""

    def __init__(
        self,
        bootstrap_servers: str | list[str],
        *,
        client_id: str = "tidelog",
        request_timeout_ms: int = 30000,
        connect_timeout_s: float = 10.0,
        retries: int = 8,
        retry_backoff_ms: int = 100,
        retry_backoff_max_ms: int = 1000,
        metadata_max_age_ms: int = 300000,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    ) -> None:
        self.bootstrap_servers = parse_bootstrap_servers(bootstrap_servers)
        self.client_id = client_id
        self.request_timeout_ms = request_timeout_ms
        self.connect_timeout_s = connect_timeout_s
        self.retries = retries
        self.retry_backoff_ms = retry_backoff_ms
        self.retry_backoff_max_ms = retry_backoff_max_ms
        self.metadata_max_age_ms = metadata_max_age_ms
        self._metadata_at = 0.0  # monotonic time of the last Metadata answer
        self.max_frame_bytes = max_frame_bytes
        self.metadata = ClusterMetadata()
        self._connections: dict[int, BrokerConnection] = {}
        self._connect_locks: dict[int, asyncio.Lock] = {}
        self._bootstrap_conn: BrokerConnection | None = None
        self._metadata_lock = asyncio.Lock()
        self._closed = False

    async def __aenter__(self) -> KafkaClient:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- lifecycle and metadata ------------------------------------------------------------

    async def start(self) -> None:
        """Bootstrap: the cluster's brokers (no topics yet). Raises NoBrokersAvailableError."""
        await self.refresh_metadata([])

    async def close(self) -> None:
        self._closed = True
        conns = list(self._connections.values())
        if self._bootstrap_conn is not None:
            conns.append(self._bootstrap_conn)
        self._connections.clear()
        self._bootstrap_conn = None
        for conn in conns:
            await conn.close()

    def _new_connection(self, host: str, port: int) -> BrokerConnection:
        return BrokerConnection(
            host,
            port,
            client_id=self.client_id,
            request_timeout_ms=self.request_timeout_ms,
            max_frame_bytes=self.max_frame_bytes,
        )

    async def _any_connection(self) -> BrokerConnection:
        """An open connection to some broker: a pooled one, a known broker, or a bootstrap
        server, each tried in turn (failover)."""
        for conn in self._connections.values():
            if not conn.closed:
                return conn
        errors: list[str] = []
        node_ids = list(self.metadata.brokers)
        random.shuffle(node_ids)
        for node_id in node_ids:
            try:
                return await self.connection(node_id)
            except KafkaClientError as exc:
                errors.append(str(exc))
        if self._bootstrap_conn is not None and not self._bootstrap_conn.closed:
            return self._bootstrap_conn
        for host, port in self.bootstrap_servers:
            conn = self._new_connection(host, port)
            try:
                await conn.connect(self.connect_timeout_s)
            except KafkaClientError as exc:
                errors.append(str(exc))
                continue
            self._bootstrap_conn = conn
            return conn
        raise NoBrokersAvailableError(
            "no broker reachable: " + ("; ".join(errors) if errors else "none known")
        )

    async def refresh_metadata(
        self, topics: Iterable[str] | None = None, *, allow_auto_topic_creation: bool = False
    ) -> ClusterMetadata:
        """Ask any broker for metadata. ``topics=None``: every topic; ``[]``: brokers only."""
        wanted = None if topics is None else list(topics)
        request = MetadataRequest(
            topics=None if wanted is None else [MetadataRequestTopic(name=t) for t in wanted],
            allow_auto_topic_creation=allow_auto_topic_creation,
        )
        async with self._metadata_lock:
            last: Exception | None = None
            for attempt in range(max(1, self.retries)):
                if self._closed:
                    raise KafkaConnectionError("client closed")
                conn = await self._any_connection()
                try:
                    version = conn.pick_version(ApiKey.METADATA)
                    if version == 0 and wanted is None:
                        request.topics = []  # v0: an empty list means every topic
                    response = await conn.send(request, version)
                except (KafkaConnectionError, RequestTimedOutError) as exc:
                    last = exc
                    await conn.close()
                    await self._backoff(attempt)
                    continue
                self.metadata.update(response, all_topics=wanted is None)
                self._metadata_at = time.monotonic()
                self._adopt_bootstrap_connection()
                return self.metadata
            raise NoBrokersAvailableError(f"metadata request failed: {last}")

    def _adopt_bootstrap_connection(self) -> None:
        conn = self._bootstrap_conn
        if conn is None:
            return
        self._bootstrap_conn = None
        for broker in self.metadata.brokers.values():
            if (broker.host, broker.port) == (conn.host, conn.port) and (
                broker.node_id not in self._connections or self._connections[broker.node_id].closed
            ):
                conn.node_id = broker.node_id
                self._connections[broker.node_id] = conn
                return
        # The advertised address differs: keep the bootstrap connection only as a fallback.
        self._bootstrap_conn = conn

    @property
    def metadata_stale(self) -> bool:
        """Older than ``metadata.max.age.ms``: refresh even without errors (new partitions,
        leaders moved back by a preferred-leader election)."""
        return time.monotonic() - self._metadata_at > self.metadata_max_age_ms / 1000

    def leader_for(self, tp: TopicPartition) -> int | None:
        """The leader's node id in the cached metadata (None if unknown or leaderless)."""
        return self.metadata.leader_for(tp)

    async def partitions_for(
        self, topic: str, *, refresh: bool = False, allow_auto_topic_creation: bool = False
    ) -> list[int]:
        """Partition ids of ``topic``. A retriable topic error (a topic just created whose
        metadata has not spread yet, LEADER_NOT_AVAILABLE) is retried with backoff up to
        ``retries`` times; then, or for other errors, BrokerResponseError is raised.
        ``allow_auto_topic_creation`` asks the broker to create a missing topic (its
        ``auto.create.topics.enable`` decides), as Kafka's producer does."""
        meta = self.metadata.topics.get(topic)
        if refresh or self.metadata_stale:
            meta = None
        if meta is not None and meta.error == ErrorCode.NONE:
            return sorted(meta.partitions)
        code: int = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        for attempt in range(self.retries + 1):
            if attempt:
                await self._backoff(attempt - 1)
            await self.refresh_metadata(
                [topic], allow_auto_topic_creation=allow_auto_topic_creation
            )
            meta = self.metadata.topics.get(topic)
            code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION if meta is None else meta.error
            if code == ErrorCode.NONE and meta is not None and meta.partitions:
                return sorted(meta.partitions)
            if code == ErrorCode.NONE:
                code = ErrorCode.LEADER_NOT_AVAILABLE  # listed without partitions yet
            if not _is_retriable(code):
                break
        raise BrokerResponseError(code, topic)

    async def _leader(self, tp: TopicPartition) -> PartitionMetadata:
        """The partition's metadata, refreshed if its leader is not known."""
        part = self.metadata.partition(tp)
        if part is None or part.leader < 0 or self.metadata_stale:
            await self.refresh_metadata([tp.topic])
            part = self.metadata.partition(tp)
        if part is None:
            topic = self.metadata.topics.get(tp.topic)
            code = (
                topic.error
                if topic is not None and topic.error
                else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            )
            raise BrokerResponseError(code, str(tp))
        if part.leader < 0:
            raise BrokerResponseError(ErrorCode.LEADER_NOT_AVAILABLE, str(tp))
        return part

    # -- connections ----------------------------------------------------------------------

    async def connection(self, broker_id: int) -> BrokerConnection:
        """The pooled connection to ``broker_id``, opened (again) if needed."""
        conn = self._connections.get(broker_id)
        if conn is not None and not conn.closed:
            return conn
        lock = self._connect_locks.setdefault(broker_id, asyncio.Lock())
        async with lock:
            conn = self._connections.get(broker_id)
            if conn is not None and not conn.closed:
                return conn
            if self._closed:
                raise KafkaConnectionError("client closed")
            broker = self.metadata.brokers.get(broker_id)
            if broker is None:
                raise KafkaConnectionError(f"broker {broker_id} is not in the cluster metadata")
            conn = self._new_connection(broker.host, broker.port)
            conn.node_id = broker_id
            await conn.connect(self.connect_timeout_s)
            self._connections[broker_id] = conn
            return conn

    async def send(
        self,
        broker_id: int,
        request: Any,
        api_version: int | None = None,
        *,
        timeout_ms: int | None = None,
    ) -> Any:
        """Send one request to one broker (no retries); the version is negotiated if None."""
        conn = await self.connection(broker_id)
        if api_version is None:
            api_version = self._version(conn, request.API_KEY)
        return await conn.send(request, api_version, timeout_ms=timeout_ms)

    async def send_no_response(self, broker_id: int, request: Any) -> None:
        conn = await self.connection(broker_id)
        await conn.send_no_response(request, self._version(conn, request.API_KEY))

    @staticmethod
    def _version(conn: BrokerConnection, api_key: int) -> int:
        version = conn.pick_version(api_key)
        cap = _CLIENT_MAX_VERSIONS.get(api_key)
        if cap is not None and version > cap:
            rng = conn.api_version_range(api_key)
            assert rng is not None
            version = max(rng[0], cap)
        return version

    async def _backoff(self, attempt: int) -> None:
        delay = min(self.retry_backoff_max_ms, self.retry_backoff_ms * (2**attempt))
        # jitter (as Kafka's KIP-580) so that many clients do not retry in lockstep
        await asyncio.sleep(delay * random.uniform(0.8, 1.2) / 1000)

    async def _with_retries(
        self,
        topics: Iterable[str],
        attempt_fn: Callable[[], Awaitable[tuple[int, T]]],
    ) -> tuple[int, T]:
        """Run ``attempt_fn`` (returning (error code, result)) until it succeeds, returns a
        non-retriable error, or the retries run out; refresh metadata between attempts."""
        topic_list = list(topics)
        code: int = ErrorCode.NONE
        result: Any = None
        for attempt in range(self.retries + 1):
            try:
                code, result = await attempt_fn()
            except (KafkaConnectionError, RequestTimedOutError) as exc:
                code = (
                    ErrorCode.REQUEST_TIMED_OUT
                    if isinstance(exc, RequestTimedOutError)
                    else ErrorCode.NETWORK_EXCEPTION
                )
                result = None
            except BrokerResponseError as exc:  # no leader / unknown topic from metadata
                code, result = exc.code_value, None
            if code == ErrorCode.NONE or not _is_retriable(code) or attempt == self.retries:
                break
            await self._backoff(attempt)
            try:
                await self.refresh_metadata(topic_list)
            except NoBrokersAvailableError:
                pass
        return code, result

    # -- data APIs ------------------------------------------------------------------------

    async def produce(
        self,
        tp: TopicPartition,
        records: bytes | bytearray | memoryview,
        acks: int = -1,
        timeout_ms: int = 30000,
        *,
        transactional_id: str | None = None,
    ) -> tuple[ErrorCode | int, int]:
        """Write record batches to one partition: (error, base_offset). acks=0 returns
        (NONE, -1) once the bytes are written; retriable errors are retried."""
        if acks not in (-1, 0, 1):
            raise ValueError(f"acks must be -1 (all), 0 or 1, not {acks}")
        request = ProduceRequest(
            transactional_id=transactional_id,
            acks=acks,
            timeout_ms=timeout_ms,
            topic_data=[TopicProduceData(tp.topic, [PartitionProduceData(tp.partition, records)])],
        )

        async def attempt() -> tuple[int, int]:
            leader = (await self._leader(tp)).leader
            if acks == 0:
                await self.send_no_response(leader, request)
                return ErrorCode.NONE, -1
            response = await self.send(
                leader, request, timeout_ms=timeout_ms + self.request_timeout_ms
            )
            part = response.responses[0].partition_responses[0]
            return part.error_code, part.base_offset

        code, base_offset = await self._with_retries([tp.topic], attempt)
        return _code(code), -1 if base_offset is None else base_offset

    async def fetch(
        self,
        tp: TopicPartition,
        offset: int,
        *,
        max_bytes: int = 1048576,
        max_wait_ms: int = 500,
        min_bytes: int = 1,
        isolation_level: int = 0,
        current_leader_epoch: int | None = None,
        last_fetched_epoch: int = -1,
        replica_id: int = -1,
    ) -> FetchResult:
        """Fetch one partition from its leader (retrying leader moves and network errors).
        OFFSET_OUT_OF_RANGE and other non-retriable errors are returned in the result.
        ``current_leader_epoch`` None: the epoch in the metadata (KIP-320 fencing)."""

        async def attempt() -> tuple[int, FetchResult]:
            part = await self._leader(tp)
            leader = part.leader
            epoch = part.leader_epoch if current_leader_epoch is None else current_leader_epoch
            _, _, results = await self.fetch_from(
                leader,
                {tp: (offset, epoch, last_fetched_epoch)},
                max_bytes=max_bytes,
                partition_max_bytes=max_bytes,
                max_wait_ms=max_wait_ms,
                min_bytes=min_bytes,
                isolation_level=isolation_level,
                replica_id=replica_id,
            )
            result = results.get(tp)
            if result is None:
                return ErrorCode.UNKNOWN_SERVER_ERROR, FetchResult(ErrorCode.UNKNOWN_SERVER_ERROR)
            return result.error, result

        code, result = await self._with_retries([tp.topic], attempt)
        return result if result is not None else FetchResult(_code(code))

    async def fetch_from(
        self,
        broker_id: int,
        partitions: Mapping[TopicPartition, tuple[int, int, int] | int],
        *,
        session_id: int = 0,
        session_epoch: int = -1,
        forgotten: Iterable[TopicPartition] = (),
        max_bytes: int = 52428800,
        partition_max_bytes: int = 1048576,
        max_wait_ms: int = 500,
        min_bytes: int = 1,
        isolation_level: int = 0,
        replica_id: int = -1,
        rack_id: str = "",
    ) -> tuple[int, int, dict[TopicPartition, FetchResult]]:
        """One Fetch request to one broker for several partitions; returns (top-level error, the
        response's session id, each partition's result).

        ``partitions`` maps each partition to its fetch offset or to (fetch offset, current
        leader epoch, last fetched epoch). ``session_epoch`` -1 fetches outside a session
        (KIP-227); 0 is a full fetch opening one, and the session's next epoch an incremental
        fetch listing ``partitions`` and forgetting ``forgotten``. ``rack_id``: a consumer's
        ``client.rack`` (Fetch v11+, KIP-392). Raises connection errors;
        a top-level error is copied into the result of every partition it left unanswered.
        """
        topics: dict[str, list[FetchPartition]] = {}
        for tp, spec in partitions.items():
            offset, epoch, last_epoch = (spec, -1, -1) if isinstance(spec, int) else spec
            topics.setdefault(tp.topic, []).append(
                FetchPartition(
                    partition=tp.partition,
                    current_leader_epoch=epoch,
                    fetch_offset=offset,
                    last_fetched_epoch=last_epoch,
                    log_start_offset=-1,
                    partition_max_bytes=partition_max_bytes,
                )
            )
        request = FetchRequest(
            replica_id=replica_id,
            max_wait_ms=max_wait_ms,
            min_bytes=min_bytes,
            max_bytes=max_bytes,
            isolation_level=isolation_level,
            session_id=session_id,
            session_epoch=session_epoch,
            rack_id=rack_id,
            topics=[FetchTopic(topic=t, partitions=ps) for t, ps in topics.items()],
            forgotten_topics_data=[
                ForgottenTopic(topic=t, partitions=[tp.partition for tp in forgotten
                                                    if tp.topic == t])
                for t in dict.fromkeys(tp.topic for tp in forgotten)],
        )
        response = await self.send(
            broker_id, request, timeout_ms=max_wait_ms + self.request_timeout_ms
        )
        out: dict[TopicPartition, FetchResult] = {}
        for topic in response.responses:
            for p in topic.partitions:
                diverging = None
                de = p.diverging_epoch  # None when absent (newer generated codecs)
                if de is not None and de.epoch >= 0:
                    diverging = (de.epoch, de.end_offset)
                out[TopicPartition(topic.topic, p.partition_index)] = FetchResult(
                    _code(p.error_code or response.error_code),
                    p.high_watermark,
                    p.last_stable_offset,
                    p.log_start_offset,
                    p.records if p.records is not None else b"",
                    diverging,
                    p.preferred_read_replica,
                    None if p.aborted_transactions is None else tuple(
                        (a.producer_id, a.first_offset) for a in p.aborted_transactions),
                )
        if response.error_code:
            for tp in partitions:
                out.setdefault(tp, FetchResult(_code(response.error_code)))
        return response.error_code, response.session_id, out

    async def list_offsets(
        self,
        partitions: Mapping[TopicPartition, int],
        *,
        isolation_level: int = 0,
    ) -> dict[TopicPartition, OffsetAndEpoch]:
        """The offset for each partition's timestamp (LATEST_TIMESTAMP = the high watermark,
        EARLIEST_TIMESTAMP = the log start offset, or a time in ms): one request per leader,
        all leaders at once; partitions with retriable errors are asked again after a
        metadata refresh (bounded). Errors are in the results."""
        wanted = dict(partitions)
        results: dict[TopicPartition, OffsetAndEpoch] = {}
        pending = dict(wanted)
        unknown = sorted({tp.topic for tp in pending if self.leader_for(tp) is None})
        if unknown:
            await self._refresh_quietly(unknown)
        for attempt in range(self.retries + 1):
            if attempt:
                await self._backoff(attempt - 1)
                await self._refresh_quietly(sorted({tp.topic for tp in pending}))
            groups: dict[int, dict[TopicPartition, tuple[int, int]]] = {}
            for tp, timestamp in pending.items():
                part = self.metadata.partition(tp)
                if part is None or part.leader < 0:
                    code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                    if part is not None:
                        code = ErrorCode.LEADER_NOT_AVAILABLE
                    results[tp] = OffsetAndEpoch(code)
                    continue
                groups.setdefault(part.leader, {})[tp] = (timestamp, part.leader_epoch)
            leaders = list(groups)
            answers = await asyncio.gather(
                *(self._list_offsets_from(n, groups[n], isolation_level) for n in leaders),
                return_exceptions=True,
            )
            for leader, answer in zip(leaders, answers, strict=True):
                if isinstance(answer, (KafkaConnectionError, RequestTimedOutError)):
                    code = (
                        ErrorCode.REQUEST_TIMED_OUT
                        if isinstance(answer, RequestTimedOutError)
                        else ErrorCode.NETWORK_EXCEPTION
                    )
                    results.update({tp: OffsetAndEpoch(code) for tp in groups[leader]})
                elif isinstance(answer, BaseException):
                    raise answer
                else:
                    results.update(answer)
            pending = {tp: ts for tp, ts in pending.items() if _is_retriable(results[tp].error)}
            if not pending:
                break
        return {tp: results[tp] for tp in wanted}

    async def _list_offsets_from(
        self,
        broker_id: int,
        partitions: Mapping[TopicPartition, tuple[int, int]],
        isolation_level: int,
    ) -> dict[TopicPartition, OffsetAndEpoch]:
        """One ListOffsets request: {partition: (timestamp, current leader epoch)}."""
        conn = await self.connection(broker_id)
        version = self._version(conn, ApiKey.LIST_OFFSETS)
        topics: dict[str, list[ListOffsetsPartition]] = {}
        for tp, (timestamp, epoch) in partitions.items():
            topics.setdefault(tp.topic, []).append(
                ListOffsetsPartition(tp.partition, epoch, timestamp, max_num_offsets=1)
            )
        request = ListOffsetsRequest(
            replica_id=-1,
            isolation_level=isolation_level,
            topics=[ListOffsetsTopic(name, parts) for name, parts in topics.items()],
            timeout_ms=self.request_timeout_ms,
        )
        response = await conn.send(request, version)
        out = {tp: OffsetAndEpoch(ErrorCode.UNKNOWN_SERVER_ERROR) for tp in partitions}
        for topic in response.topics:
            for p in topic.partitions:
                tp = TopicPartition(topic.name, p.partition_index)
                if tp not in out:
                    continue
                offset = p.offset
                if version == 0:  # v0 answers a list of offsets
                    offset = p.old_style_offsets[0] if p.old_style_offsets else -1
                out[tp] = OffsetAndEpoch(_code(p.error_code), offset, p.leader_epoch, p.timestamp)
        return out

    async def offsets_for_leader_epoch(
        self,
        tp: TopicPartition,
        leader_epoch: int,
        *,
        current_leader_epoch: int = -1,
        replica_id: int = -2,
        broker_id: int | None = None,
    ) -> OffsetAndEpoch:
        """The end offset of ``leader_epoch`` on the leader (KIP-101/279): (error, end offset,
        the largest epoch <= the one asked). ``broker_id`` overrides the leader (followers ask
        their source broker); replica_id -2 is a consumer, a follower passes its broker id."""

        async def attempt() -> tuple[int, OffsetAndEpoch]:
            target = broker_id if broker_id is not None else (await self._leader(tp)).leader
            request = OffsetForLeaderEpochRequest(
                replica_id=replica_id,
                topics=[
                    OffsetForLeaderTopic(
                        tp.topic,
                        [
                            OffsetForLeaderPartition(
                                tp.partition, current_leader_epoch, leader_epoch
                            )
                        ],
                    )
                ],
            )
            response = await self.send(target, request)
            p = response.topics[0].partitions[0]
            return p.error_code, OffsetAndEpoch(_code(p.error_code), p.end_offset, p.leader_epoch)

        code, result = await self._with_retries([tp.topic], attempt)
        return result if result is not None else OffsetAndEpoch(_code(code))

    async def init_producer_id(
        self, *, transactional_id: str | None = None, transaction_timeout_ms: int = 60000
    ) -> tuple[int, int]:
        """A new producer id and epoch from any broker (idempotent producer)."""
        from tidelog.protocol.messages.init_producer_id import InitProducerIdRequest

        request = InitProducerIdRequest(
            transactional_id=transactional_id,
            transaction_timeout_ms=transaction_timeout_ms,
            producer_id=-1,
            producer_epoch=-1,
        )

        async def attempt() -> tuple[int, tuple[int, int]]:
            conn = await self._any_connection()
            response = await conn.send(request, self._version(conn, ApiKey.INIT_PRODUCER_ID))
            return response.error_code, (response.producer_id, response.producer_epoch)

        code, result = await self._with_retries([], attempt)
        if code != ErrorCode.NONE or result is None:
            raise BrokerResponseError(code, "InitProducerId failed")
        return result

    # -- admin APIs -----------------------------------------------------------------------

    async def _controller(self) -> int:
        if (
            self.metadata.controller_id < 0
            or self.metadata.controller_id not in self.metadata.brokers
        ):
            await self.refresh_metadata([])
        if self.metadata.controller_id < 0:
            raise BrokerResponseError(ErrorCode.NOT_CONTROLLER, "no controller is known")
        return self.metadata.controller_id

    async def create_topics(
        self,
        topics: Sequence[NewTopic],
        *,
        timeout_ms: int = 30000,
        validate_only: bool = False,
    ) -> dict[str, BrokerResponseError | None]:
        """Create topics on the controller: {name: None on success, else the error}.
        NOT_CONTROLLER is retried after a metadata refresh."""
        request = CreateTopicsRequest(
            topics=[
                CreatableTopic(
                    name=t.name,
                    num_partitions=-1 if t.replica_assignment else t.num_partitions,
                    replication_factor=-1 if t.replica_assignment else t.replication_factor,
                    assignments=[
                        CreatableReplicaAssignment(p, list(ids))
                        for p, ids in sorted(t.replica_assignment.items())
                    ],
                    configs=[CreatableTopicConfig(k, v) for k, v in t.configs.items()],
                )
                for t in topics
            ],
            timeout_ms=timeout_ms,
            validate_only=validate_only,
        )

        async def attempt() -> tuple[int, Any]:
            response = await self.send(
                await self._controller(), request, timeout_ms=timeout_ms + self.request_timeout_ms
            )
            if any(r.error_code == ErrorCode.NOT_CONTROLLER for r in response.topics):
                return ErrorCode.NOT_CONTROLLER, response
            return ErrorCode.NONE, response

        code, response = await self._with_retries([], attempt)
        if response is None:
            raise BrokerResponseError(code, "CreateTopics failed")
        out = {
            r.name: BrokerResponseError(r.error_code, r.error_message or "")
            if r.error_code
            else None
            for r in response.topics
        }
        await self._refresh_quietly([t.name for t in topics])
        return out

    async def create_partitions(
        self,
        counts: Mapping[str, int],
        *,
        assignments: Mapping[str, Sequence[Sequence[int]]] | None = None,
        timeout_ms: int = 30000,
        validate_only: bool = False,
    ) -> dict[str, BrokerResponseError | None]:
        """Grow topics to `counts` partitions (the new ones placed as `assignments` says, else by
        the broker): {name: None on success, else the error}."""
        request = m_cp.CreatePartitionsRequest(
            topics=[m_cp.CreatePartitionsTopic(
                name, count,
                None if assignments is None or name not in assignments
                else [m_cp.CreatePartitionsAssignment(list(r)) for r in assignments[name]])
                for name, count in counts.items()],
            timeout_ms=timeout_ms, validate_only=validate_only)

        async def attempt() -> tuple[int, Any]:
            response = await self.send(
                await self._controller(), request, timeout_ms=timeout_ms + self.request_timeout_ms
            )
            return ErrorCode.NONE, response

        code, response = await self._with_retries([], attempt)
        if response is None:
            raise BrokerResponseError(code, "CreatePartitions failed")
        await self._refresh_quietly(list(counts))
        return {r.name: BrokerResponseError(r.error_code, r.error_message or "")
                if r.error_code else None for r in response.results}

    async def delete_records(
        self, offsets: Mapping[TopicPartition, int], *, timeout_ms: int = 30000
    ) -> dict[TopicPartition, int | BrokerResponseError]:
        """DeleteRecords at each partition's leader (offset -1: its high watermark): {partition:
        the low watermark once every replica has moved, else the error}. NOT_LEADER_OR_FOLLOWER
        is retried after a metadata refresh."""
        out: dict[TopicPartition, int | BrokerResponseError] = {}

        async def one(tp: TopicPartition, offset: int) -> None:
            request = m_dr.DeleteRecordsRequest(
                topics=[m_dr.DeleteRecordsTopic(tp.topic, [m_dr.DeleteRecordsPartition(
                    tp.partition, offset)])], timeout_ms=timeout_ms)

            async def attempt() -> tuple[int, Any]:
                leader = (await self._leader(tp)).leader
                response = await self.send(leader, request,
                                           timeout_ms=timeout_ms + self.request_timeout_ms)
                p = response.topics[0].partitions[0]
                return p.error_code, p

            code, p = await self._with_retries([tp.topic], attempt)
            out[tp] = p.low_watermark if code == ErrorCode.NONE else BrokerResponseError(code)

        await asyncio.gather(*(one(tp, o) for tp, o in offsets.items()))
        return out

    async def elect_leaders(
        self,
        partitions: Sequence[TopicPartition] | None,
        *,
        unclean: bool = False,
        timeout_ms: int = 30000,
    ) -> dict[TopicPartition, BrokerResponseError | None]:
        """ElectLeaders on the controller (None: every partition): {partition: None when
        elected, else the error (ELECTION_NOT_NEEDED, ...)}."""
        by_topic: dict[str, list[int]] = {}
        for tp in partitions or ():
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        request = m_el.ElectLeadersRequest(
            election_type=1 if unclean else 0,
            topic_partitions=None if partitions is None else [
                m_el.TopicPartitions(t, ps) for t, ps in by_topic.items()],
            timeout_ms=timeout_ms)

        async def attempt() -> tuple[int, Any]:
            response = await self.send(
                await self._controller(), request, timeout_ms=timeout_ms + self.request_timeout_ms
            )
            if any(p.error_code == ErrorCode.NOT_CONTROLLER
                   for r in response.replica_election_results for p in r.partition_result):
                return ErrorCode.NOT_CONTROLLER, response
            return ErrorCode.NONE, response

        code, response = await self._with_retries([], attempt)
        if response is None:
            raise BrokerResponseError(code, "ElectLeaders failed")
        return {TopicPartition(r.topic, p.partition_id):
                BrokerResponseError(p.error_code, p.error_message or "") if p.error_code else None
                for r in response.replica_election_results for p in r.partition_result}

    async def delete_topics(
        self, names: Sequence[str], *, timeout_ms: int = 30000
    ) -> dict[str, BrokerResponseError | None]:
        """Delete topics on the controller: {name: None on success, else the error}."""
        request = DeleteTopicsRequest(
            topics=[DeleteTopicState(name=n) for n in names],
            topic_names=list(names),
            timeout_ms=timeout_ms,
        )

        async def attempt() -> tuple[int, Any]:
            response = await self.send(
                await self._controller(), request, timeout_ms=timeout_ms + self.request_timeout_ms
            )
            if any(r.error_code == ErrorCode.NOT_CONTROLLER for r in response.responses):
                return ErrorCode.NOT_CONTROLLER, response
            return ErrorCode.NONE, response

        code, response = await self._with_retries([], attempt)
        if response is None:
            raise BrokerResponseError(code, "DeleteTopics failed")
        out = {
            (r.name or ""): BrokerResponseError(r.error_code, r.error_message or "")
            if r.error_code
            else None
            for r in response.responses
        }
        for name in names:
            if out.get(name) is None:
                self.metadata.topics.pop(name, None)
        return out

    async def describe_configs(
        self,
        resources: Sequence[tuple[int, str]],
        *,
        keys: Sequence[str] | None = None,
    ) -> dict[tuple[int, str], dict[str, str | None]]:
        """Configs of topics (RESOURCE_TOPIC, name) and brokers (RESOURCE_BROKER, "id"): a
        broker resource goes to that broker, topics to any. Raises on a resource's error."""
        by_target: dict[int | None, list[tuple[int, str]]] = {}
        for rtype, name in resources:
            target = int(name) if rtype == RESOURCE_BROKER else None
            by_target.setdefault(target, []).append((rtype, name))
        out: dict[tuple[int, str], dict[str, str | None]] = {}
        for target, items in by_target.items():
            request = DescribeConfigsRequest(
                resources=[
                    DescribeConfigsResource(rtype, name, None if keys is None else list(keys))
                    for rtype, name in items
                ]
            )

            async def attempt(
                target: int | None = target, request: DescribeConfigsRequest = request
            ) -> tuple[int, Any]:
                if target is None:
                    conn = await self._any_connection()
                    return ErrorCode.NONE, await conn.send(
                        request, self._version(conn, ApiKey.DESCRIBE_CONFIGS)
                    )
                return ErrorCode.NONE, await self.send(target, request)

            code, response = await self._with_retries([], attempt)
            if response is None:
                raise BrokerResponseError(code, "DescribeConfigs failed")
            for result in response.results:
                if result.error_code:
                    raise BrokerResponseError(
                        result.error_code, result.error_message or result.resource_name
                    )
                out[(result.resource_type, result.resource_name)] = {
                    c.name: c.value for c in result.configs
                }
        return out

    async def _refresh_quietly(self, topics: list[str]) -> None:
        try:
            await self.refresh_metadata(topics)
        except KafkaClientError:
            pass
