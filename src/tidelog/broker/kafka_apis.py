"""`KafkaApis`: one handler per Kafka API, mapping the generated wire dataclasses to the broker's
replica manager, metadata cache and ZooKeeper (Kafka's `KafkaApis`, ZooKeeper mode).

Every refusal is Kafka's error code for that case. Requests at a version outside the advertised
range close the connection (as Kafka does), except Produce v0-2, which is advertised (librdkafka
needs v0 in the table to compress) and answered with UNSUPPORTED_VERSION per partition.

The consumer group APIs belong to `broker/group_apis.GroupApis` (over `coordinator/`), which `BrokerServer`
plugs in with `register_handler`; without it FindCoordinator answers COORDINATOR_NOT_AVAILABLE.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections.abc import Awaitable, Callable, Container, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from tidelog.broker.alter_partition import handle_alter_partition
from tidelog.broker.fetch_session import (
    FetchContext,
    FetchManager,
    FetchSession,
    FetchSessionCache,
    IncrementalFetchContext,
    PartitionRequest,
    PartitionResponse,
    SessionKey,
    TopicIdPartition,
)
from tidelog.broker.metadata_cache import BrokerEndpoint, PartitionMetadata
from tidelog.broker.replica_manager import now_ms
from tidelog.broker.replica_selector import (
    RackAwareReplicaSelector,
    create_replica_selector,
    find_preferred_read_replica,
)
from tidelog.broker.socket_server import CloseConnection, DeferredResponse, RequestContext
from tidelog.controller.admin import AdminError, validate_topic_name
from tidelog.protocol.api_keys import ApiKey
from tidelog.protocol.api_versions import (
    PRODUCE_MIN_ACCEPTED_VERSION,
    advertised,
    api_versions_response,
)
from tidelog.protocol.errors import ErrorCode
from tidelog.protocol.messages import (
    alter_partition as m_ap,
)
from tidelog.protocol.messages import (
    controlled_shutdown as m_cs,
)
from tidelog.protocol.messages import (
    create_acls as m_ca,
)
from tidelog.protocol.messages import (
    create_topics as m_ct,
)
from tidelog.protocol.messages import (
    delete_acls as m_da,
)
from tidelog.protocol.messages import (
    delete_topics as m_dt,
)
from tidelog.protocol.messages import (
    describe_acls as m_dacl,
)
from tidelog.protocol.messages import (
    describe_configs as m_dc,
)
from tidelog.protocol.messages import (
    fetch as m_fetch,
)
from tidelog.protocol.messages import (
    find_coordinator as m_fc,
)
from tidelog.protocol.messages import (
    init_producer_id as m_ipi,
)
from tidelog.protocol.messages import (
    leader_and_isr as m_lai,
)
from tidelog.protocol.messages import (
    list_offsets as m_lo,
)
from tidelog.protocol.messages import (
    metadata as m_md,
)
from tidelog.protocol.messages import (
    offset_for_leader_epoch as m_ofle,
)
from tidelog.protocol.messages import (
    produce as m_produce,
)
from tidelog.protocol.messages import (
    stop_replica as m_sr,
)
from tidelog.protocol.messages import (
    update_metadata as m_um,
)
from tidelog.protocol.primitives import ZERO_UUID
from tidelog.protocol.records.batch import (
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC_OFFSET,
    is_transactional_at,
)
from tidelog.replication.errors import Errors
from tidelog.replication.types import (
    CONSUMER_REPLICA_ID,
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    FetchPartitionData,
    LeaderAndIsrPartitionState,
    TopicPartition,
)

if TYPE_CHECKING:  # pragma: no cover
    from tidelog.broker.server import BrokerServer

__all__ = ["KafkaApis"]

logger = logging.getLogger(__name__)

# Kafka's debugging replica id: ListOffsets / Fetch allowed on followers, reading to the LEO.
DEBUGGING_REPLICA_ID = -2

# KIP-392 for a consumer's fetch (`KafkaApis._select_read_replicas`): takes the partitions a
# follower is named for out of the dict and answers them.
_SelectReadReplicas = Callable[[dict[TopicPartition, PartitionRequest]],
                               dict[TopicPartition, FetchPartitionData]]
# KIP-951: Fetch v16+ answers these with the leader this broker knows and its endpoint.
_LEADER_HINT_ERRORS = (ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.FENCED_LEADER_EPOCH)

# DescribeConfigs config_source values (Kafka's DescribeConfigsResponse.ConfigSource).
DYNAMIC_TOPIC_CONFIG = 1
DEFAULT_CONFIG = 5
_CONFIG_TYPES = {"boolean": 1, "string": 2, "int": 3, "short": 4, "long": 5, "double": 6,
                 "list": 7, "password": 9}
# The type of the topic keys that have no broker key to fall back to.
_TOPIC_ONLY_KEY_TYPES = {"leader.replication.throttled.replicas": "list",
                         "follower.replication.throttled.replicas": "list"}
# Kafka's internal topics (Topic.INTERNAL_TOPICS).
_INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state"})
# What Metadata reports as authorized when asked, as Kafka does without an authorizer: every
# operation the resource supports (AclOperation codes: READ 3, WRITE 4, CREATE 5, DELETE 6,
# ALTER 7, DESCRIBE 8, CLUSTER_ACTION 9, DESCRIBE_CONFIGS 10, ALTER_CONFIGS 11,
# IDEMPOTENT_WRITE 12), as a bit field.
TOPIC_AUTHORIZED_OPERATIONS = sum(1 << op for op in (3, 4, 5, 6, 7, 8, 10, 11))
CLUSTER_AUTHORIZED_OPERATIONS = sum(1 << op for op in (5, 7, 8, 9, 10, 11, 12))
RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4

_I32 = struct.Struct(">i")

ApiHandler = Callable[[RequestContext, Any], Awaitable[Any | None]]


def _code(error: Any) -> int:
    return int(error)


def _config_str(v: Any) -> str | None:
    if v is None:
        return None
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, list | tuple):
        return ",".join(str(x) for x in v)
    return str(v)


def _validate_single_batch(records: Any) -> int:
    """Produce v3+: exactly one magic-2 batch per partition (Kafka's
    `ProduceRequest.validateRecords`). Returns an error code, 0 when fine."""
    if records is None or len(records) == 0:
        return ErrorCode.INVALID_RECORD
    n = len(records)
    if n < HEADER_SIZE:
        return ErrorCode.CORRUPT_MESSAGE
    size = _I32.unpack_from(records, 8)[0] + LOG_OVERHEAD
    if records[MAGIC_OFFSET] != 2:
        return ErrorCode.INVALID_RECORD
    if size < HEADER_SIZE or size > n:
        return ErrorCode.CORRUPT_MESSAGE
    if size < n:
        return ErrorCode.INVALID_RECORD  # more than one batch
    return 0


def _has_transactional_records(request: m_produce.ProduceRequest) -> bool:
    """Kafka's RequestUtils.hasTransactionalRecords: a magic-2 batch with the transactional
    flag in any partition's records."""
    for t in request.topic_data:
        for p in t.partition_data:
            records, at = p.records, 0
            while records is not None and at + HEADER_SIZE <= len(records):
                if is_transactional_at(records, at):
                    return True
                size = _I32.unpack_from(records, at + 8)[0] + LOG_OVERHEAD
                if size < HEADER_SIZE:
                    break
                at += size
    return False


_TXN_VERIFICATION = "transaction.partition.verification.enable"

# Kafka's SecurityDisabledException message for CreateAcls/DeleteAcls without an authorizer.
NO_AUTHORIZER = "No Authorizer is configured."


class KafkaApis:
    def __init__(self, server: BrokerServer) -> None:
        self.server = server
        self.config = server.config
        self.broker_id = server.broker_id
        self.handlers: dict[int, ApiHandler] = {
            ApiKey.API_VERSIONS: self.handle_api_versions,
            ApiKey.METADATA: self.handle_metadata,
            ApiKey.PRODUCE: self.handle_produce,
            ApiKey.FETCH: self.handle_fetch,
            ApiKey.LIST_OFFSETS: self.handle_list_offsets,
            ApiKey.OFFSET_FOR_LEADER_EPOCH: self.handle_offset_for_leader_epoch,
            ApiKey.CREATE_TOPICS: self.handle_create_topics,
            ApiKey.DELETE_TOPICS: self.handle_delete_topics,
            ApiKey.DESCRIBE_CONFIGS: self.handle_describe_configs,
            ApiKey.INIT_PRODUCER_ID: self.handle_init_producer_id,
            ApiKey.LEADER_AND_ISR: self.handle_leader_and_isr,
            ApiKey.UPDATE_METADATA: self.handle_update_metadata,
            ApiKey.STOP_REPLICA: self.handle_stop_replica,
            ApiKey.CONTROLLED_SHUTDOWN: self.handle_controlled_shutdown,
            ApiKey.ALTER_PARTITION: self.handle_alter_partition,
            ApiKey.FIND_COORDINATOR: self.handle_find_coordinator_unavailable,
            ApiKey.DESCRIBE_ACLS: self.handle_describe_acls,
            ApiKey.CREATE_ACLS: self.handle_create_acls,
            ApiKey.DELETE_ACLS: self.handle_delete_acls,
        }
        self.requests_handled = 0
        # KIP-227 fetch sessions (consumers and followers), max.incremental.fetch.session.cache.slots.
        self.fetch_manager = FetchManager(FetchSessionCache(
            self.config.get("max.incremental.fetch.session.cache.slots")))
        # Sessions read only changed partitions: the replica manager says which changed, and
        # the ISR check first records the follower fetches that skipped the unchanged ones.
        server.replica_manager.core.partition_listeners.append(self.fetch_manager.mark_changed)
        server.replica_manager.shell.before_isr_expiration = self._replay_idle_follower_fetches
        # Held follower session fetches, to answer at once when their follower gets a partition
        # here they lack (replication/follower_joins.py): replica id -> session id -> cut.
        self._follower_waits: dict[int, dict[int, tuple[FetchSession, Callable[[], None]]]] = {}
        server.replica_manager.core.on_followers_joining = self._cut_joining_follower_waits
        self._update_metadata_seq = 0
        # KIP-392: replica.selector.class (None: consumers always fetch from the leader).
        self.replica_selector = create_replica_selector(self.config.get("replica.selector.class"))
        # api key -> (min, max) served: the advertised table (Produce v0-2 handled above).
        self._served = advertised(include_controller_apis=True)

    def register_handler(self, api_key: int, handler: ApiHandler) -> None:
        """Plug in a handler (e.g. a group coordinator's) for an advertised API."""
        self.handlers[api_key] = handler

    @property
    def rm(self) -> Any:
        return self.server.replica_manager

    @property
    def cache(self) -> Any:
        return self.server.metadata_cache

    # ------------------------------------------------------------------ dispatch
    async def handle(self, ctx: RequestContext, request: Any) -> Any | None:
        key, version = ctx.header.request_api_key, ctx.api_version
        self.requests_handled += 1
        if key == ApiKey.PRODUCE and version < PRODUCE_MIN_ACCEPTED_VERSION:
            return self._produce_error_response(request, ErrorCode.UNSUPPORTED_VERSION)
        served = self._served.get(key)
        if served is None or not served[0] <= version <= served[1]:
            raise CloseConnection(f"api key {key} version {version} is not served")
        handler = self.handlers.get(key)
        if handler is None:
            raise CloseConnection(f"api key {key} has no handler on this broker")
        return await handler(ctx, request)

    def _known_partition_error(self, tp: TopicPartition, error: int) -> int:
        """A partition this broker does not host: NOT_LEADER_OR_FOLLOWER when the cluster has
        it (the client's metadata is stale), UNKNOWN_TOPIC_OR_PARTITION otherwise (Kafka)."""
        if error == Errors.UNKNOWN_TOPIC_OR_PARTITION and self.cache.partition(tp) is not None:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        return error

    # ------------------------------------------------------------------ ApiVersions
    async def handle_api_versions(self, ctx: RequestContext, request: Any) -> Any:
        return api_versions_response(include_controller_apis=True)

    # ------------------------------------------------------------------ Metadata
    async def handle_metadata(self, ctx: RequestContext, request: m_md.MetadataRequest) -> Any:
        version = ctx.api_version
        cache = self.cache
        if request.topics is None or (version == 0 and not request.topics):
            names: list[str | None] = list(cache.topics())
            explicit = False
        else:
            names = [t.name for t in request.topics]
            explicit = True
        allow_auto = request.allow_auto_topic_creation if version >= 4 else True
        topics: list[m_md.MetadataResponseTopic] = []
        seen: set[str | None] = set()
        for name in names:
            if name in seen:
                continue
            seen.add(name)
            if name is not None and cache.contains_topic(name):
                topics.append(self._topic_metadata(name))
                continue
            error = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            if name is not None and explicit:
                try:
                    validate_topic_name(name)
                except AdminError:
                    error = ErrorCode.INVALID_TOPIC_EXCEPTION
                else:
                    if allow_auto and self.config.get("auto.create.topics.enable"):
                        error = await self._auto_create_topic(name)
            topics.append(m_md.MetadataResponseTopic(error_code=error, name=name or ""))
        # Kafka answers with the endpoints of the listener the request came in on; a broker
        # without that listener is left out.
        brokers = []
        for b in (cache.brokers[i] for i in cache.alive_broker_ids()):
            ep = b.for_listener(ctx.listener_name)
            if ep is not None:
                brokers.append(m_md.MetadataResponseBroker(b.broker_id, ep[0], ep[1], b.rack))
        if not cache.brokers:  # before the first UpdateMetadata: at least this broker is known
            me = self.server.advertised_endpoint_for(ctx.listener_name)
            brokers = [m_md.MetadataResponseBroker(self.broker_id, me[0], me[1],
                                                   self.config.get("broker.rack"))]
        if version >= 8 and request.include_topic_authorized_operations:
            for t in topics:
                t.topic_authorized_operations = TOPIC_AUTHORIZED_OPERATIONS
        response = m_md.MetadataResponse(
            brokers=brokers,
            cluster_id=self.server.cluster_id,
            controller_id=cache.controller_id if cache.controller_id is not None else -1,
            topics=topics,
        )
        if 8 <= version <= 10 and request.include_cluster_authorized_operations:
            response.cluster_authorized_operations = CLUSTER_AUTHORIZED_OPERATIONS
        return response

    def _topic_metadata(self, topic: str) -> m_md.MetadataResponseTopic:
        parts = []
        for index, pm in sorted(self.cache.topic_partitions(topic).items()):
            alive = pm.leader >= 0 and self.cache.is_alive(pm.leader)
            parts.append(m_md.MetadataResponsePartition(
                error_code=ErrorCode.NONE if alive else ErrorCode.LEADER_NOT_AVAILABLE,
                partition_index=index,
                leader_id=pm.leader if alive else -1,
                leader_epoch=pm.leader_epoch,
                replica_nodes=list(pm.replicas),
                isr_nodes=list(pm.isr),
                offline_replicas=list(pm.offline_replicas),
            ))
        return m_md.MetadataResponseTopic(error_code=ErrorCode.NONE, name=topic,
                                          topic_id=self.cache.topic_id(topic),
                                          is_internal=topic in _INTERNAL_TOPICS, partitions=parts)

    async def _auto_create_topic(self, topic: str) -> int:
        partitions = self.config.get("num.partitions")
        rf = self.config.get("default.replication.factor")
        try:
            await asyncio.to_thread(self.server.admin.create_topic, topic, partitions, rf)
            logger.info("auto-created topic %s (%d partitions, RF %d)", topic, partitions, rf)
        except AdminError as e:
            if e.error_code == ErrorCode.TOPIC_ALREADY_EXISTS:
                return ErrorCode.LEADER_NOT_AVAILABLE
            return int(e.error_code)
        except Exception as e:
            logger.warning("auto-creating topic %s failed: %s", topic, e)
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        return ErrorCode.LEADER_NOT_AVAILABLE

    # ------------------------------------------------------------------ Produce
    def _produce_error_response(self, request: Any, error: int) -> m_produce.ProduceResponse:
        return m_produce.ProduceResponse(responses=[
            m_produce.TopicProduceResponse(t.name, [
                m_produce.PartitionProduceResponse(index=p.index, error_code=error, base_offset=-1)
                for p in t.partition_data
            ])
            for t in request.topic_data
        ])

    async def handle_produce(
        self, ctx: RequestContext, request: m_produce.ProduceRequest
    ) -> m_produce.ProduceResponse | DeferredResponse | None:
        acks = request.acks
        if request.transactional_id is None and _has_transactional_records(request):
            # Kafka authorizes transactional records by their transactional id: none, refused
            # whole, before anything is appended.
            if acks == 0:
                raise CloseConnection("acks=0 transactional produce without a transactional id")
            return self._produce_error_response(
                request, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
        order: list[tuple[str, list[int]]] = []
        errors: dict[TopicPartition, int] = {}
        entries: dict[TopicPartition, Any] = {}
        for t in request.topic_data:
            order.append((t.name, [p.index for p in t.partition_data]))
            for p in t.partition_data:
                tp = TopicPartition(t.name, p.index)
                if tp in entries or tp in errors:
                    errors[tp] = ErrorCode.INVALID_REQUEST  # the same partition twice
                    entries.pop(tp, None)
                    continue
                err = _validate_single_batch(p.records)
                if err:
                    errors[tp] = err
                else:
                    entries[tp] = p.records
        if not entries:
            return self._produce_response(acks, order, errors, {})
        guards = None
        txn_apis = self.server.txn_apis
        if request.transactional_id is not None and txn_apis is not None \
                and self.server.dynamic_config.current.get(_TXN_VERIFICATION):
            # KIP-890: a partition the producer's transaction has not added is refused.
            failed, guards = await txn_apis.verifier.verify_produce(
                self.rm.core, request.transactional_id, entries, now_ms())
            if failed:
                errors.update(failed)
                entries = {tp: r for tp, r in entries.items() if tp not in failed}
                if not entries:
                    return self._produce_response(acks, order, errors, {})
        appended = self.rm.append_records(acks, entries, request.timeout_ms,
                                          verification_guards=guards)
        if appended.done():
            return self._produce_response(acks, order, errors, appended.result())
        # acks=all: the append is done; the connection goes on with its next requests while
        # this one waits for the ISR (the response still leaves in request order).
        return DeferredResponse(
            appended, lambda results: self._produce_response(acks, order, errors, results))

    def _produce_response(
        self,
        acks: int,
        order: list[tuple[str, list[int]]],
        errors: dict[TopicPartition, int],
        results: dict[TopicPartition, Any],
    ) -> m_produce.ProduceResponse | None:
        if acks == 0:
            if errors or any(r.error != Errors.NONE for r in results.values()):
                # Kafka closes the connection so that an acks=0 producer learns something failed.
                raise CloseConnection("acks=0 produce failed")
            return None
        responses = []
        for topic, indexes in order:
            parts = []
            for index in indexes:
                tp = TopicPartition(topic, index)
                if tp in errors:
                    parts.append(m_produce.PartitionProduceResponse(
                        index=index, error_code=errors[tp], base_offset=-1))
                    continue
                r = results.get(tp)
                if r is None:
                    continue
                code = self._known_partition_error(tp, _code(r.error))
                parts.append(m_produce.PartitionProduceResponse(
                    index=index, error_code=code, base_offset=r.base_offset,
                    log_append_time_ms=r.log_append_time_ms, log_start_offset=r.log_start_offset,
                ))
            responses.append(m_produce.TopicProduceResponse(topic, parts))
        return m_produce.ProduceResponse(responses=responses)

    # ------------------------------------------------------------------ Fetch
    async def handle_fetch(self, ctx: RequestContext, request: m_fetch.FetchRequest) -> Any:
        version = ctx.api_version
        replica_id, broker_epoch = request.replica_id, None
        if version >= 15:
            # KIP-903: a follower names itself and its broker epoch (its registration's czxid);
            # the leader records the epoch with the fetch, -1 meaning none.
            state = request.replica_state
            replica_id = state.replica_id if state is not None else -1
            if state is not None and state.replica_epoch >= 0:
                broker_epoch = state.replica_epoch
        # v13+ name topics by id (KIP-516) and their sessions are keyed by id; the names come
        # from the metadata cache (Kafka's KafkaApis with topicIdsToNames).
        by_id = version >= 13
        names = self.cache.topic_names_by_id() if by_id else {}
        fetch_data: dict[SessionKey, PartitionRequest] = {}
        for t in request.topics:
            for p in t.partitions:
                key: SessionKey = TopicIdPartition(t.topic_id, p.partition) if by_id \
                    else TopicPartition(t.topic, p.partition)
                fetch_data[key] = (p.fetch_offset, p.current_leader_epoch, p.log_start_offset,
                                   p.partition_max_bytes, p.last_fetched_epoch)
        to_forget: list[SessionKey] = [
            TopicIdPartition(t.topic_id, index) if by_id else TopicPartition(t.topic, index)
            for t in request.forgotten_topics_data for index in t.partitions]
        # Before v7 there are no sessions: the decoder leaves session 0, epoch -1 (sessionless).
        context = self.fetch_manager.new_context(
            request.session_id, request.session_epoch, fetch_data, to_forget,
            replica_id >= 0, now_ms(), replica_id, by_id, names,
        )
        # Kafka's KafkaApis: the response is capped by the broker's fetch.max.bytes.
        max_bytes = min(request.max_bytes, self.config.get("fetch.max.bytes"))
        # KIP-392: from v11 (client metadata) a consumer may fetch from a follower.
        fetch_only_leader = replica_id >= 0 or version < 11
        # The follower each partition's replica selector names for this consumer, if any.
        preferred: dict[TopicPartition, int] = {}
        select = None
        selector = self.replica_selector
        if selector is not None and not fetch_only_leader:
            def select(to_read: dict[TopicPartition, PartitionRequest]
                       ) -> dict[TopicPartition, FetchPartitionData]:
                return self._select_read_replicas(selector, to_read, request.rack_id,
                                                  ctx.listener_name, preferred)
        if isinstance(context, IncrementalFetchContext):
            results, refused = await self._session_fetch(
                context, replica_id, broker_epoch, request.max_wait_ms,
                min(request.min_bytes, max_bytes), max_bytes, request.isolation_level,
                fetch_only_leader, select)
            keys: dict[SessionKey, Any] = context.read
        else:
            keys = context.partitions()
            to_read, refused = self._partitions_to_read(context, keys, replica_id < 0)
            chosen = select(to_read) if select is not None else {}
            results = await self.rm.fetch_messages(
                # Kafka answers at once when it names a preferred read replica.
                replica_id, 0 if chosen else request.max_wait_ms,
                min(request.min_bytes, max_bytes), max_bytes,
                to_read, broker_epoch=broker_epoch, isolation_level=request.isolation_level,
                fetch_only_leader=fetch_only_leader,
            ) if to_read else {}
            if select is not None and not chosen and request.max_wait_ms > 0 and results:
                # Kafka's DelayedFetch completes through readFromLog, which looks for a
                # preferred read replica again: one named now replaces the read's answer.
                chosen = select({tp: to_read[tp] for tp in results if tp in to_read})
            results.update(chosen)
        # Per partition: (error, HW, log start, records, LSO, aborted transactions); only the
        # answered ones become wire objects (an idle incremental fetch answers few of the
        # session's partitions). As Kafka's, an unknown topic id is answered after the reads.
        read: dict[SessionKey, tuple[int, int, int, Any, int, Any]] = {}
        # Fetch v12+ (KIP-320/595): where a fetcher's last fetched epoch diverges from the log.
        diverging: dict[SessionKey, tuple[int, int]] = {}
        unknown: list[SessionKey] = []
        for key in keys:
            code = refused.get(key)
            if code == ErrorCode.UNKNOWN_TOPIC_ID:
                unknown.append(key)
                continue
            tp = context.topic_partition(key)
            r = None if code is not None or tp is None else results.get(tp)
            if code is None:
                if r is None:
                    continue
                code = _code(r.error)
                if tp is not None:  # followers' fetches too (Kafka's getPartitionOrException)
                    code = self._known_partition_error(tp, code)
            if code == ErrorCode.NONE and r is not None:
                if r.diverging_epoch is not None:
                    diverging[key] = r.diverging_epoch
                aborted = r.aborted_transactions
                read[key] = (code, r.high_watermark, r.log_start_offset, r.records,
                             r.last_stable_offset,
                             None if aborted is None else [
                                 m_fetch.AbortedTransaction(producer_id=pid, first_offset=first)
                                 for pid, first in aborted])
            else:
                # Kafka answers an error with -1 for the offsets (its createLogReadResult).
                read[key] = (code, -1, -1, b"", -1, None)
        for key in unknown:
            read[key] = (ErrorCode.UNKNOWN_TOPIC_ID, -1, -1, b"", -1, None)
        error, session_id, answered = context.update_and_generate_response(
            {key: PartitionResponse(code, hw, log_start,
                                    len(records) if records is not None else 0,
                                    preferred.get(context.topic_partition(key), -1),
                                    key in diverging)
             for key, (code, hw, log_start, records, _, _) in read.items()},
            now_ms(),
        )
        # Consecutive partitions of a topic share one topic entry (Kafka's FetchResponse.of).
        responses: list[m_fetch.FetchableTopicResponse] = []
        endpoints: dict[int, m_fetch.NodeEndpoint] = {}
        last_topic: Any = None
        for key in answered:
            code, hw, log_start, records, lso, aborted = read[key]
            tp = context.topic_partition(key)
            topic = key.topic_id if isinstance(key, TopicIdPartition) else key.topic
            if topic != last_topic or not responses:
                last_topic = topic
                responses.append(m_fetch.FetchableTopicResponse(
                    topic=tp.topic if tp is not None else "",
                    topic_id=key.topic_id if isinstance(key, TopicIdPartition) else ZERO_UUID,
                    partitions=[]))
            data = m_fetch.PartitionData(
                partition_index=key.partition, error_code=code, high_watermark=hw,
                last_stable_offset=lso, log_start_offset=log_start,
                aborted_transactions=aborted, records=records,
                preferred_read_replica=preferred.get(tp, -1) if tp is not None else -1,
            )
            if key in diverging:
                epoch, end_offset = diverging[key]
                data.diverging_epoch = m_fetch.EpochEndOffset(epoch=epoch, end_offset=end_offset)
            if version >= 16 and tp is not None and code in _LEADER_HINT_ERRORS:
                data.current_leader = self._current_leader(tp, ctx.listener_name, endpoints)
            responses[-1].partitions.append(data)
        return m_fetch.FetchResponse(
            error_code=error, session_id=session_id if version >= 7 else 0, responses=responses,
            node_endpoints=list(endpoints.values()))

    def _current_leader(self, tp: TopicPartition, listener_name: str,
                        endpoints: dict[int, m_fetch.NodeEndpoint]) -> m_fetch.LeaderIdAndEpoch:
        """KIP-951 (Kafka's getCurrentLeader): the leader this broker knows for ``tp`` — its own
        partition's, else the metadata cache's — and, when that broker is alive, its endpoint
        on the request's listener into ``endpoints``."""
        p = self.rm.core.partitions.get(tp)
        if p is not None:
            leader_id = p.leader_id if p.leader_id is not None else -1
            leader_epoch = p.leader_epoch
        else:
            st = self.cache.partition(tp)
            leader_id, leader_epoch = (st.leader, st.leader_epoch) if st is not None else (-1, -1)
        broker = self.cache.brokers.get(leader_id)
        if broker is not None and leader_id not in endpoints:
            ep = broker.for_listener(listener_name)
            if ep is not None:
                endpoints[leader_id] = m_fetch.NodeEndpoint(
                    node_id=leader_id, host=ep[0], port=ep[1], rack=broker.rack)
        return m_fetch.LeaderIdAndEpoch(leader_id=leader_id, leader_epoch=leader_epoch)

    def _select_read_replicas(
        self, selector: RackAwareReplicaSelector,
        to_read: dict[TopicPartition, PartitionRequest], rack_id: str,
        listener_name: str, preferred: dict[TopicPartition, int],
    ) -> dict[TopicPartition, FetchPartitionData]:
        """KIP-392 at the leader (Kafka's readFromLog with findPreferredReadReplica): takes out
        of ``to_read`` the partitions led here for which the replica selector names a follower
        for a consumer in ``rack_id``, notes the follower in ``preferred`` and answers each with
        no records and the leader's offsets. A fetch with a stale epoch, or one a new leader
        cannot serve yet (its HW not caught up), is left to the read, which answers its error."""
        core = self.rm.core
        racks: dict[int, str | None] = {}
        for broker in self.cache.brokers.values():
            if broker.for_listener(listener_name) is not None:
                racks[broker.broker_id] = broker.rack
        answers: dict[TopicPartition, FetchPartitionData] = {}
        for tp, (fetch_offset, leader_epoch, *_) in list(to_read.items()):
            p = core.partitions.get(tp)
            if (p is None or not p.is_leader
                    or p.check_current_leader_epoch(leader_epoch) != Errors.NONE
                    or (core.config.consumer_hw_guard and not p.high_watermark_caught_up)):
                continue
            replica = find_preferred_read_replica(
                selector, p, rack_id, fetch_offset, now_ms(), racks)
            if replica is not None:
                del to_read[tp]
                preferred[tp] = replica
                answers[tp] = FetchPartitionData(Errors.NONE, p.high_watermark,
                                                 p.log_start_offset, b"", p.last_stable_offset)
        return answers

    def _partitions_to_read(
        self, context: FetchContext, keys: Mapping[SessionKey, PartitionRequest],
        consumer: bool,
    ) -> tuple[dict[TopicPartition, PartitionRequest], dict[SessionKey, int]]:
        """The partitions to read by name, and those answered without a read: a topic id this
        broker does not know (UNKNOWN_TOPIC_ID), for a ``consumer`` a partition the metadata
        cache lacks (UNKNOWN_TOPIC_OR_PARTITION, Kafka's metadataCache.contains check before
        the read, even for a partition hosted here whose UpdateMetadata has not come yet), or,
        for a partition hosted here, an id that is not its topic's — deleted and created again
        under the same name (INCONSISTENT_TOPIC_ID, Kafka's ReplicaManager check against the
        log's topic id)."""
        to_read: dict[TopicPartition, PartitionRequest] = {}
        refused: dict[SessionKey, int] = {}
        cache = self.cache
        hosted_ids = cache.hosted_topic_ids
        hosted = self.rm.core.partitions
        for key, req in keys.items():
            tp = context.topic_partition(key)
            if tp is None:
                refused[key] = ErrorCode.UNKNOWN_TOPIC_ID
            elif consumer and cache.partition(tp) is None:
                # A follower's fetch of a partition hosted here is read even then (Kafka's
                # follower gets UNKNOWN_TOPIC_OR_PARTITION between the leader's LeaderAndIsr
                # and UpdateMetadata, and backs off replica.fetch.backoff.ms); one of a
                # partition not hosted here is answered by the cache after the read.
                refused[key] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            elif (isinstance(key, TopicIdPartition) and tp in hosted
                  and hosted_ids.get(tp.topic, key.topic_id) != key.topic_id):
                refused[key] = ErrorCode.INCONSISTENT_TOPIC_ID
            else:
                to_read[tp] = req
        return to_read, refused

    async def _session_fetch(
        self, context: IncrementalFetchContext, replica_id: int, broker_epoch: int | None,
        max_wait_ms: int, min_bytes: int, max_bytes: int, isolation_level: int,
        fetch_only_leader: bool,
        select: _SelectReadReplicas | None = None,
    ) -> tuple[dict[TopicPartition, Any], dict[SessionKey, int]]:
        """An incremental fetch reads the partitions it lists and those changed since the last
        (broker/fetch_session.py), not every partition of its session. Held for ``min_bytes``,
        it waits for a partition of the session to change and reads just that one: the wait
        of Kafka's DelayedFetch, without its re-reads of every partition. Returns the reads and
        the partitions answered without one (``_partitions_to_read``)."""
        session = context.session
        core = self.rm.core
        loop = self.rm.scheduler.loop  # (get_running_loop: a getpid system call per fetch)
        arrival = loop.time()
        deadline = arrival + max_wait_ms / 1000
        # A follower's wait is cut when it joins a partition its session lacks (below).
        join_checked = replica_id < 0
        # The held fetch's wait: one future, resolved True by a change of the session's
        # partitions, False at the deadline (no task, event or timeout scope per wait).
        waiting: asyncio.Future[bool] | None = None

        def wake(changed: bool) -> None:
            if waiting is not None and not waiting.done():
                waiting.set_result(changed)

        def on_change(keys: tuple[SessionKey, ...]) -> None:
            # Only the partition that changed is looked at (those dirty before were when they
            # changed): an ISR update or UpdateMetadata of n partitions marks n in a row, and
            # looking at every dirty one each time took O(n^2) (~30 s at 3,333 per broker).
            if waiting is not None and not waiting.done():
                if replica_id >= 0 and self._nothing_for_follower(session, keys):
                    return  # only HWs moved: no read, the fetch stays held (Kafka's)
                waiting.set_result(True)

        def cut() -> None:
            nonlocal deadline
            deadline = loop.time()
            wake(False)

        session.waker = on_change
        if replica_id >= 0:
            self._follower_waits.setdefault(replica_id, {})[session.id] = (session, cut)
        results: dict[TopicPartition, Any] = {}
        refused: dict[SessionKey, int] = {}
        read_bytes = 0
        any_error = False
        waited = looked = False  # held at least once; KIP-392 for the unread partitions
        # The partitions read first were unchanged up to the previous fetch of the session,
        # those turning dirty while this one waits up to this one's arrival.
        replay_ms = session.previous_used_ms
        try:
            more, no_read = self._partitions_to_read(context, context.partitions(),
                                                     replica_id < 0)
            while True:
                refused.update(no_read)
                # A read error answers at once, as Kafka's; so does a session with nothing
                # to read at all (Kafka's empty "interesting").
                any_error = any_error or ErrorCode.INCONSISTENT_TOPIC_ID in no_read.values() \
                    or (not more and self._nothing_to_read(session, no_read, replica_id < 0))
                if select is not None and (more or not looked):
                    chosen = select(more) if more else {}
                    if not looked:  # the partitions this fetch does not read, once
                        looked = True
                        chosen.update(self._select_in_session(
                            context, select, {*context.read, *refused}))
                    results.update(chosen)
                    # Kafka answers at once when it names a preferred read replica.
                    any_error = any_error or bool(chosen)
                if more:
                    if replica_id >= 0:
                        core.replay_follower_fetches(replica_id, more, replay_ms)
                    got = await self.rm.fetch_messages(
                        replica_id, 0, 0, max(0, max_bytes - read_bytes), more,
                        broker_epoch=broker_epoch, isolation_level=isolation_level,
                        fetch_only_leader=fetch_only_leader)
                    for tp, r in got.items():
                        old = results.get(tp)
                        if old is not None and old.records is not None:
                            read_bytes -= len(old.records)
                        results[tp] = r
                        read_bytes += len(r.records) if r.records is not None else 0
                        # A diverging epoch is answered at once too (Kafka's hasDivergingEpoch).
                        any_error = (any_error or r.error != Errors.NONE
                                     or r.diverging_epoch is not None)
                replay_ms = session.last_used_ms
                remaining = deadline - loop.time()
                if read_bytes >= min_bytes or any_error or remaining <= 0:
                    break
                if not join_checked:
                    # About to be held: only a slice of the wait while this follower joins a
                    # partition led here that its session lacks (follower_joins.py).
                    join_checked = True
                    wait_ms = core.follower_fetch_wait_ms(replica_id, max_wait_ms,
                                                          session.keys_by_tp, now_ms())
                    deadline = min(deadline, arrival + wait_ms / 1000)
                    if deadline <= loop.time():
                        break
                if not session.dirty or (replica_id >= 0 and self._nothing_for_follower(
                        session, session.dirty)):
                    waited = True
                    waiting = loop.create_future()
                    timer = loop.call_at(deadline, wake, False)
                    try:
                        # At the deadline (or cut), partitions whose HW alone moved meanwhile
                        # are read for this answer, as the reads at each change did before.
                        if not await waiting and not session.dirty:
                            break
                    finally:
                        timer.cancel()
                        waiting = None
                more, no_read = self._partitions_to_read(context, context.more_partitions(),
                                                         replica_id < 0)
            if select is not None and waited:
                # Kafka's DelayedFetch completes through readFromLog, which looks for a
                # preferred read replica again for every partition of the session.
                results.update(self._select_in_session(context, select, refused))
        except BaseException:
            context.abandon()
            raise
        finally:
            session.waker = None
            if replica_id >= 0:
                self._follower_waits.get(replica_id, {}).pop(session.id, None)
        # Not led here (KIP-392 follower reads, moved leadership), throttled, or the fetching
        # follower is out of the ISR: read again. Kafka's leader reads every partition of a
        # fetch and tries maybeExpandIsr each time, so a follower that caught up before it
        # became eligible (live in the metadata, KIP-841) joins at its next fetch.
        quota = core.config.leader_quota
        unsettled = {
            tp for tp in results
            if (p := core.partitions.get(tp)) is None or not p.is_leader
            or (replica_id >= 0 and replica_id not in p.isr)
            or (quota is not None and replica_id >= 0 and quota.is_throttled(tp))}
        if unsettled:
            context.unsettled = [key for key in context.read
                                 if context.topic_partition(key) in unsettled]
        return results, refused

    def _select_in_session(self, context: IncrementalFetchContext,
                           select: _SelectReadReplicas, skip: Container[SessionKey],
                           ) -> dict[TopicPartition, FetchPartitionData]:
        """KIP-392 for the partitions of a consumer's session outside ``skip``: Kafka's
        incremental fetch reads every partition of its session and readFromLog looks for a
        preferred read replica for each, also for one the consumer does not list and that did
        not change (its follower became eligible since: back in the ISR, an endpoint in the
        consumer's rack). The partitions named a follower join the answer. O(session), as
        Kafka's, and only with a ``replica.selector.class``."""
        session = context.session
        cache = self.cache
        keys: dict[TopicPartition, SessionKey] = {}
        wanted: dict[TopicPartition, PartitionRequest] = {}
        for key, cached in session.partitions.items():
            tp = cached.tp
            if tp is not None and key not in skip and cache.partition(tp) is not None:
                keys[tp] = key
                wanted[tp] = cached.req_data
        chosen = select(wanted)
        for tp in chosen:
            key = keys[tp]
            context.read[key] = session.partitions[key].req_data
        return chosen

    def _nothing_to_read(self, session: FetchSession, no_read: Mapping[SessionKey, int],
                         consumer: bool) -> bool:
        """Whether every partition of the session is answered without a read: each topic id
        unknown, or for a ``consumer`` each partition the metadata cache lacks
        (``_partitions_to_read``). Looks at the whole session (its clean partitions may be
        readable) only when this fetch refused one and read none."""
        if len(session.unresolved) == session.size:
            return True
        if not consumer or ErrorCode.UNKNOWN_TOPIC_OR_PARTITION not in no_read.values():
            return False
        cache = self.cache
        return all(cached.tp is None or cache.partition(cached.tp) is None
                   for cached in session.partitions.values())

    def _cut_joining_follower_waits(self, started: Mapping[int, list[TopicPartition]]) -> None:
        """The replica manager came to lead ``started`` ({follower: partitions}): answer now
        each held fetch of those followers whose session lacks one of them, so that their next
        fetch can carry it (the core does the same for the fetches in its purgatory)."""
        for replica_id, tps in started.items():
            for session, cut in list(self._follower_waits.get(replica_id, {}).values()):
                if any(tp not in session.keys_by_tp for tp in tps):
                    cut()

    def _nothing_for_follower(self, session: FetchSession, keys: Iterable[SessionKey]) -> bool:
        """Whether each of ``keys`` (partitions of a follower's session that changed since its
        fetch read them) changed in nothing that answers a held fetch: still led here in the
        fetch's epoch, no records past the fetch offset, the log start it was last answered.
        So only its HW moved (another follower's fetch), which Kafka's DelayedFetch for a
        follower does not count either (bytes past the fetch offset, truncation, leadership):
        the leader need not read it on every acks=all record, only once the fetch is answered."""
        partitions = self.rm.core.partitions
        cached_partitions = session.partitions
        for key in keys:
            cached = cached_partitions.get(key)
            if cached is None or cached.tp is None:
                return False
            p = partitions.get(cached.tp)
            if (p is None or not p.is_leader or p.leader_epoch != cached.leader_epoch
                    or p.log_end_offset != cached.fetch_offset
                    or p.log_start_offset != cached.local_log_start_offset):
                return False
        return True

    def _replay_idle_follower_fetches(self) -> None:
        """Before the ISR check: each follower session's last fetch, for the partitions it did
        not read because they had not changed."""
        core = self.rm.core
        for session in self.fetch_manager.follower_sessions():
            core.replay_follower_fetches(session.replica_id, session.clean_partitions(),
                                         session.last_used_ms)

    # ------------------------------------------------------------------ ListOffsets
    async def handle_list_offsets(
        self, ctx: RequestContext, request: m_lo.ListOffsetsRequest
    ) -> m_lo.ListOffsetsResponse:
        version = ctx.api_version
        replica_id = request.replica_id
        topics = []
        for t in request.topics:
            parts = []
            for p in t.partitions:
                tp = TopicPartition(t.name, p.partition_index)
                error, offset, timestamp, epoch = self._list_offset(
                    replica_id, tp, p.current_leader_epoch, p.timestamp, request.isolation_level
                )
                resp = m_lo.ListOffsetsPartitionResponse(
                    partition_index=p.partition_index, error_code=error,
                    timestamp=timestamp, offset=offset, leader_epoch=epoch,
                )
                if version == 0:
                    resp.old_style_offsets = [offset] if error == 0 and offset >= 0 else []
                parts.append(resp)
            topics.append(m_lo.ListOffsetsTopicResponse(name=t.name, partitions=parts))
        return m_lo.ListOffsetsResponse(topics=topics)

    def _list_offset(
        self, replica_id: int, tp: TopicPartition, current_leader_epoch: int, timestamp: int,
        isolation_level: int,
    ) -> tuple[int, int, int, int]:
        """(error, offset, timestamp, leader epoch) for one partition."""
        core = self.rm.core
        p = core.partition(tp)
        if replica_id == DEBUGGING_REPLICA_ID:
            # Tools (tidelog topics describe) read any replica's log ends, leader or not.
            if p is None:
                return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1, -1, -1
            if timestamp == EARLIEST_TIMESTAMP:
                return 0, p.log_start_offset, -1, p.leader_epoch
            if timestamp == LATEST_TIMESTAMP:
                return 0, p.log_end_offset, -1, p.leader_epoch
        # The core reads the log; a disk error there is the partition's KAFKA_STORAGE_ERROR.
        rid = replica_id if replica_id >= 0 else CONSUMER_REPLICA_ID
        r = core.list_offsets(rid, {tp: (current_leader_epoch, timestamp)}, isolation_level)[tp]
        code = self._known_partition_error(tp, _code(r.error))
        if code != 0:
            return code, -1, -1, -1
        return code, r.offset, r.timestamp, r.leader_epoch

    # ------------------------------------------------------------------ OffsetForLeaderEpoch
    async def handle_offset_for_leader_epoch(
        self, ctx: RequestContext, request: m_ofle.OffsetForLeaderEpochRequest
    ) -> m_ofle.OffsetForLeaderEpochResponse:
        wanted: dict[TopicPartition, tuple[int, int]] = {}
        for t in request.topics:
            for p in t.partitions:
                wanted[TopicPartition(t.topic, p.partition)] = (p.current_leader_epoch, p.leader_epoch)
        results = self.rm.core.last_offset_for_leader_epoch(request.replica_id, wanted)
        topics = []
        for t in request.topics:
            parts = []
            for p in t.partitions:
                tp = TopicPartition(t.topic, p.partition)
                r = results[tp]
                parts.append(m_ofle.EpochEndOffset(
                    error_code=self._known_partition_error(tp, _code(r.error)),
                    partition=p.partition, leader_epoch=r.leader_epoch, end_offset=r.end_offset,
                ))
            topics.append(m_ofle.OffsetForLeaderTopicResult(topic=t.topic, partitions=parts))
        return m_ofle.OffsetForLeaderEpochResponse(topics=topics)

    # ------------------------------------------------------------------ admin
    def _not_controller(self) -> bool:
        """ZooKeeper-mode admin requests go to the active controller (when one runs here)."""
        controller = self.server.controller
        return controller is not None and not getattr(controller, "is_active", False)

    async def _wait_until(self, predicate: Callable[[], bool], timeout_ms: int) -> bool:
        deadline = time.monotonic() + timeout_ms / 1000
        while not predicate():
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.02)
        return True

    async def handle_create_topics(
        self, ctx: RequestContext, request: m_ct.CreateTopicsRequest
    ) -> m_ct.CreateTopicsResponse:
        names = [t.name for t in request.topics]
        dup = {n for n in names if names.count(n) > 1}
        results: list[m_ct.CreatableTopicResult] = []
        created: list[m_ct.CreatableTopicResult] = []
        for t in request.topics:
            res = m_ct.CreatableTopicResult(name=t.name, error_message=None)
            results.append(res)
            if t.name in dup:
                res.error_code = ErrorCode.INVALID_REQUEST
                res.error_message = f"Create topics request from client contains the topic {t.name} more than once"
                continue
            if self._not_controller():
                res.error_code = ErrorCode.NOT_CONTROLLER
                continue
            partitions, rf = t.num_partitions, t.replication_factor
            assignment = None
            if t.assignments:
                if partitions != -1 or rf != -1:
                    res.error_code = ErrorCode.INVALID_REQUEST
                    res.error_message = ("Both numPartitions or replicationFactor and "
                                         "replicasAssignments were set. Both cannot be used at the same time.")
                    continue
                assignment = {a.partition_index: list(a.broker_ids) for a in t.assignments}
            else:
                if partitions == -1:
                    partitions = self.config.get("num.partitions")
                if rf == -1:
                    rf = self.config.get("default.replication.factor")
            configs = {c.name: c.value for c in t.configs if c.value is not None}
            try:
                assigned = await asyncio.to_thread(
                    self.server.admin.create_topic, t.name, partitions, rf, configs, assignment,
                    request.validate_only,
                )
            except AdminError as e:
                res.error_code = int(e.error_code)
                res.error_message = e.message
                continue
            except Exception as e:
                res.error_code = ErrorCode.UNKNOWN_SERVER_ERROR
                res.error_message = str(e)
                continue
            res.num_partitions = len(assigned)
            res.replication_factor = len(next(iter(assigned.values()))) if assigned else -1
            # v5+: every config of the new topic with its source, as DescribeConfigs shows them
            # (Kafka's ZkAdminManager.createTopics); v7: the topic id it was created with.
            res.configs = [m_ct.CreatableTopicConfigs(
                name=e.name, value=e.value, read_only=e.read_only, config_source=e.config_source,
                is_sensitive=e.is_sensitive) for e in self._topic_configs(configs, None)]
            if not request.validate_only:
                res.topic_id = await asyncio.to_thread(
                    self.server.zk_client.get_topic_id, t.name) or ZERO_UUID
                created.append(res)
        if created and request.timeout_ms > 0:
            # Kafka's DelayedCreatePartitions: answer when the controller has elected leaders.
            ok = await self._wait_until(
                lambda: all(self.cache.has_leaders(r.name) for r in created), request.timeout_ms
            )
            if not ok:
                for r in created:
                    if not self.cache.has_leaders(r.name):
                        r.error_code = ErrorCode.REQUEST_TIMED_OUT
                        r.error_message = "Timed out waiting for the topic's leaders to be elected"
        return m_ct.CreateTopicsResponse(topics=results)

    async def handle_delete_topics(
        self, ctx: RequestContext, request: m_dt.DeleteTopicsRequest
    ) -> m_dt.DeleteTopicsResponse:
        if ctx.api_version >= 6:
            names = [t.name for t in request.topics]
        else:
            names = list(request.topic_names)
        results: list[m_dt.DeletableTopicResult] = []
        waiting: list[m_dt.DeletableTopicResult] = []
        for name in names:
            res = m_dt.DeletableTopicResult(name=name)
            results.append(res)
            if name is None:
                res.error_code = ErrorCode.UNKNOWN_TOPIC_ID
                continue
            if not self.config.get("delete.topic.enable"):
                res.error_code = ErrorCode.TOPIC_DELETION_DISABLED
                continue
            if self._not_controller():
                res.error_code = ErrorCode.NOT_CONTROLLER
                continue
            if not self.cache.contains_topic(name):
                # Kafka asks its metadata cache: a topic whose deletion is under way is gone
                # from it (the controller's UpdateMetadata) before its znodes are.
                res.error_code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                continue
            try:
                await asyncio.to_thread(self.server.admin.delete_topic, name)
            except AdminError as e:
                res.error_code = int(e.error_code)
                res.error_message = e.message
                continue
            except Exception as e:
                res.error_code = ErrorCode.UNKNOWN_SERVER_ERROR
                res.error_message = str(e)
                continue
            waiting.append(res)
        if waiting and request.timeout_ms > 0:
            ok = await self._wait_until(
                lambda: not any(self.cache.contains_topic(r.name) for r in waiting),
                request.timeout_ms,
            )
            if not ok:
                for r in waiting:
                    if self.cache.contains_topic(r.name):
                        r.error_code = ErrorCode.REQUEST_TIMED_OUT
        return m_dt.DeleteTopicsResponse(responses=results)

    async def handle_describe_configs(
        self, ctx: RequestContext, request: m_dc.DescribeConfigsRequest
    ) -> m_dc.DescribeConfigsResponse:
        results = []
        for r in request.resources:
            res = m_dc.DescribeConfigsResult(
                error_code=0, error_message=None, resource_type=r.resource_type,
                resource_name=r.resource_name,
            )
            results.append(res)
            keys = set(r.configuration_keys) if r.configuration_keys is not None else None
            if r.resource_type == RESOURCE_TOPIC:
                try:
                    validate_topic_name(r.resource_name)
                    exists = await asyncio.to_thread(self.server.zk_client.topic_exists, r.resource_name)
                    overrides = await asyncio.to_thread(
                        self.server.zk_client.get_topic_config, r.resource_name) if exists else {}
                except AdminError as e:
                    res.error_code, res.error_message = int(e.error_code), e.message
                    continue
                if not exists:
                    res.error_code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                    res.error_message = f"Topic {r.resource_name} does not exist"
                    continue
                res.configs = self._topic_configs(
                    overrides, keys, request.include_synonyms and ctx.api_version >= 1)
            elif r.resource_type == RESOURCE_BROKER:
                if r.resource_name not in ("", str(self.broker_id)):
                    res.error_code = ErrorCode.INVALID_REQUEST
                    res.error_message = f"Unexpected broker id, expected {self.broker_id} but received {r.resource_name}"
                    continue
                res.configs = self._broker_configs(
                    keys, r.resource_name, request.include_synonyms and ctx.api_version >= 1)
            else:
                res.error_code = ErrorCode.INVALID_REQUEST
                res.error_message = f"Unsupported resource type {r.resource_type}"
        return m_dc.DescribeConfigsResponse(results=results)

    def _topic_configs(
        self, overrides: dict[str, str], keys: set[str] | None, synonyms: bool = False
    ) -> list[Any]:
        from tidelog.broker.config import CONFIG_DEFS
        from tidelog.broker.dynamic_config import TOPIC_TO_BROKER_KEY
        from tidelog.storage.log_config import UNSUPPORTED, LogConfig

        dynamic = self.server.dynamic_config
        # Every topic key (Kafka's LogConfig), the broker's log keys in force as the defaults.
        defaults = LogConfig.from_dict(dynamic.current.log_config()).to_dict()
        out = []
        for name in sorted(set(defaults) | set(overrides)):
            if keys is not None and name not in keys:
                continue
            broker_key = TOPIC_TO_BROKER_KEY.get(name)
            broker_synonyms = dynamic.config_synonyms(broker_key) if broker_key else []
            if name in overrides:
                value, source = overrides[name], DYNAMIC_TOPIC_CONFIG
            else:
                value = _config_str(defaults[name])
                source = broker_synonyms[0][2] if broker_synonyms else DEFAULT_CONFIG
            # v3+: the key's type, as the broker key it falls back to is typed (Kafka's LogConfig).
            type_ = (CONFIG_DEFS[broker_key].type if broker_key in CONFIG_DEFS
                     else _TOPIC_ONLY_KEY_TYPES.get(name))
            entry = m_dc.DescribeConfigsResourceResult(
                name=name, value=value, read_only=False, is_default=source == DEFAULT_CONFIG,
                config_source=source, is_sensitive=False, config_type=_CONFIG_TYPES.get(type_, 0),
                documentation=(f"tidelog accepts only the default: {UNSUPPORTED[name]}"
                               if name in UNSUPPORTED else None),
            )
            if synonyms:
                # Kafka's order: the topic override, then the broker's (configSynonyms).
                if name in overrides:
                    entry.synonyms.append(m_dc.DescribeConfigsSynonym(
                        name, overrides[name], DYNAMIC_TOPIC_CONFIG))
                entry.synonyms.extend(m_dc.DescribeConfigsSynonym(n, v, src)
                                      for n, v, src in broker_synonyms)
            out.append(entry)
        return out

    def _broker_configs(self, keys: set[str] | None, resource_name: str,
                        synonyms: bool = False) -> list[Any]:
        """This broker's configs (their values in force, sources, synonyms), or with an empty
        name the cluster-wide dynamic defaults only, as Kafka describes them."""
        from tidelog.broker.config import CONFIG_DEFS
        from tidelog.broker.dynamic_config import DYNAMIC_DEFAULT_BROKER_CONFIG, DYNAMIC_KEYS

        dynamic = self.server.dynamic_config
        out = []
        if resource_name == "":
            for name, value in sorted(dynamic.cluster_default.items()):
                if keys is not None and name not in keys:
                    continue
                entry = m_dc.DescribeConfigsResourceResult(
                    name=name, value=value, read_only=False, is_default=False,
                    config_source=DYNAMIC_DEFAULT_BROKER_CONFIG, is_sensitive=False,
                    documentation=None)
                if synonyms:
                    entry.synonyms.append(m_dc.DescribeConfigsSynonym(
                        name, value, DYNAMIC_DEFAULT_BROKER_CONFIG))
                out.append(entry)
            return out
        for name, value in sorted(dynamic.current.values().items()):
            if keys is not None and name not in keys:
                continue
            spec = CONFIG_DEFS[name]
            sensitive = spec.type == "password"
            source = dynamic.source_of(name)
            entry = m_dc.DescribeConfigsResourceResult(
                name=name, value=None if sensitive else _config_str(value),
                read_only=name not in DYNAMIC_KEYS, is_default=source == DEFAULT_CONFIG,
                config_source=source, is_sensitive=sensitive,
                config_type=_CONFIG_TYPES.get(spec.type, 0), documentation=spec.doc or None,
            )
            if synonyms:
                entry.synonyms.extend(m_dc.DescribeConfigsSynonym(n, None if sensitive else v, src)
                                      for n, v, src in dynamic.config_synonyms(name))
            out.append(entry)
        for name, rate_synonyms in dynamic.broker_rates():
            if keys is not None and name not in keys:
                continue
            _, value, source = rate_synonyms[0]
            entry = m_dc.DescribeConfigsResourceResult(
                name=name, value=value, read_only=False, is_default=False, config_source=source,
                is_sensitive=False, config_type=_CONFIG_TYPES["long"], documentation=None)
            if synonyms:
                entry.synonyms.extend(m_dc.DescribeConfigsSynonym(*s) for s in rate_synonyms)
            out.append(entry)
        return out

    async def handle_init_producer_id(
        self, ctx: RequestContext, request: m_ipi.InitProducerIdRequest
    ) -> m_ipi.InitProducerIdResponse:
        # Transactional ids are the transaction coordinator's (broker/txn_apis.py wraps this).
        try:
            pid = await asyncio.to_thread(self.server.producer_id_manager.generate_producer_id)
        except Exception as e:
            logger.warning("allocating a producer id failed: %s", e)
            return m_ipi.InitProducerIdResponse(error_code=ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
        return m_ipi.InitProducerIdResponse(error_code=0, producer_id=pid, producer_epoch=0)

    async def handle_find_coordinator_unavailable(
        self, ctx: RequestContext, request: m_fc.FindCoordinatorRequest
    ) -> m_fc.FindCoordinatorResponse:
        err = ErrorCode.COORDINATOR_NOT_AVAILABLE
        if ctx.api_version >= 4:
            return m_fc.FindCoordinatorResponse(coordinators=[
                m_fc.Coordinator(key=k, node_id=-1, host="", port=-1, error_code=err,
                                 error_message=None)
                for k in request.coordinator_keys
            ])
        return m_fc.FindCoordinatorResponse(error_code=err, error_message=None, node_id=-1,
                                            host="", port=-1)

    # ------------------------------------------------------------------ ACLs
    # tidelog has no authorizer: as Kafka's AclApis with `authorizer = None`, every ACL request
    # is answered SECURITY_DISABLED (DescribeAcls with its own message, as Kafka's).
    async def handle_describe_acls(
        self, ctx: RequestContext, request: m_dacl.DescribeAclsRequest
    ) -> m_dacl.DescribeAclsResponse:
        return m_dacl.DescribeAclsResponse(error_code=ErrorCode.SECURITY_DISABLED,
                                           error_message="No Authorizer is configured on the broker")

    async def handle_create_acls(
        self, ctx: RequestContext, request: m_ca.CreateAclsRequest
    ) -> m_ca.CreateAclsResponse:
        return m_ca.CreateAclsResponse(results=[
            m_ca.AclCreationResult(error_code=ErrorCode.SECURITY_DISABLED,
                                   error_message=NO_AUTHORIZER) for _ in request.creations])

    async def handle_delete_acls(
        self, ctx: RequestContext, request: m_da.DeleteAclsRequest
    ) -> m_da.DeleteAclsResponse:
        return m_da.DeleteAclsResponse(filter_results=[
            m_da.DeleteAclsFilterResult(error_code=ErrorCode.SECURITY_DISABLED,
                                        error_message=NO_AUTHORIZER) for _ in request.filters])

    # ------------------------------------------------------------------ controller requests
    async def handle_leader_and_isr(
        self, ctx: RequestContext, request: m_lai.LeaderAndIsrRequest
    ) -> m_lai.LeaderAndIsrResponse:
        version = ctx.api_version
        wire_states: list[m_lai.LeaderAndIsrPartitionState] = list(request.ungrouped_partition_states)
        topic_ids: dict[str, Any] = {}
        for ts in request.topic_states:
            topic_ids[ts.topic_name] = ts.topic_id
            for ps in ts.partition_states:
                ps.topic_name = ts.topic_name
                wire_states.append(ps)
        if self.rm.shell.is_stale_broker_epoch(request.broker_epoch):
            logger.info("refusing LeaderAndIsr with stale broker epoch %d (ours %d)",
                        request.broker_epoch, self.server.broker_epoch)
            return self._leader_and_isr_response(version, ErrorCode.STALE_BROKER_EPOCH,
                                                 wire_states, {}, topic_ids)
        for leader in request.live_leaders:
            self.cache.remember_endpoint(BrokerEndpoint(leader.broker_id, leader.host_name, leader.port))
        # The ids of the topics this broker hosts: a fetch naming another id for one of them is
        # INCONSISTENT_TOPIC_ID (a follower's v13+ fetch may come before the UpdateMetadata
        # that names them, e.g. just after this broker restarted).
        self.cache.note_hosted_topic_ids(topic_ids)
        await self.server.ensure_topic_configs({s.topic_name for s in wire_states})
        states = [
            LeaderAndIsrPartitionState(
                s.topic_name, s.partition_index, s.controller_epoch, s.leader, s.leader_epoch,
                tuple(s.isr), s.partition_epoch, tuple(s.replicas), s.is_new,
                tuple(s.adding_replicas), tuple(s.removing_replicas),
            )
            for s in wire_states
        ]
        result = self.rm.become_leader_or_follower(
            request.controller_id, request.controller_epoch, request.broker_epoch, states,
            {lead.broker_id for lead in request.live_leaders},
        )
        errors = {tp: _code(e) for tp, e in result.partition_errors.items()}
        return self._leader_and_isr_response(version, _code(result.error), wire_states, errors,
                                             topic_ids)

    @staticmethod
    def _leader_and_isr_response(
        version: int, error: int, states: list[Any], errors: dict[TopicPartition, int],
        topic_ids: dict[str, Any],
    ) -> m_lai.LeaderAndIsrResponse:
        if error:
            errs = {TopicPartition(s.topic_name, s.partition_index): error for s in states}
            top = error
        else:
            errs, top = errors, 0
        if version < 5:
            return m_lai.LeaderAndIsrResponse(error_code=top, partition_errors=[
                m_lai.LeaderAndIsrPartitionError(s.topic_name, s.partition_index,
                                                 errs.get(TopicPartition(s.topic_name, s.partition_index), 0))
                for s in states
            ])
        by_topic: dict[str, list[Any]] = {}
        for s in states:
            by_topic.setdefault(s.topic_name, []).append(m_lai.LeaderAndIsrPartitionError(
                partition_index=s.partition_index,
                error_code=errs.get(TopicPartition(s.topic_name, s.partition_index), 0)))
        return m_lai.LeaderAndIsrResponse(error_code=top, topics=[
            m_lai.LeaderAndIsrTopicError(topic_id=topic_ids.get(t, ZERO_UUID), partition_errors=pe)
            for t, pe in by_topic.items()
        ])

    async def handle_update_metadata(
        self, ctx: RequestContext, request: m_um.UpdateMetadataRequest
    ) -> m_um.UpdateMetadataResponse:
        if self.rm.shell.is_stale_broker_epoch(request.broker_epoch):
            return m_um.UpdateMetadataResponse(error_code=ErrorCode.STALE_BROKER_EPOCH)
        wire_states = list(request.ungrouped_partition_states)
        for ts in request.topic_states:
            for ps in ts.partition_states:
                ps.topic_name = ts.topic_name
                wire_states.append(ps)
        listener = self.server.inter_broker_listener_name
        brokers = []
        for b in request.live_brokers:
            host, port = b.v0_host, b.v0_port
            listeners: tuple[tuple[str, str, int], ...] = ()
            if b.endpoints:
                ep = next((e for e in b.endpoints if e.listener == listener), None) or next(
                    (e for e in b.endpoints if e.listener in ("", "PLAINTEXT")), b.endpoints[0])
                host, port = ep.host, ep.port
                # UpdateMetadata v0-2 has no listener names: those are PLAINTEXT endpoints.
                listeners = tuple((e.listener or "PLAINTEXT", e.host, e.port) for e in b.endpoints)
            brokers.append(BrokerEndpoint(b.id, host, port, b.rack or None, listeners))
        states = [
            PartitionMetadata(s.topic_name, s.partition_index, s.controller_epoch, s.leader,
                              s.leader_epoch, tuple(s.isr), s.zk_version, tuple(s.replicas),
                              tuple(s.offline_replicas))
            for s in wire_states
        ]
        topic_ids = {ts.topic_name: ts.topic_id for ts in request.topic_states}
        if not self.cache.update(request.controller_id, request.controller_epoch, brokers, states,
                                 topic_ids):
            return m_um.UpdateMetadataResponse(error_code=ErrorCode.STALE_CONTROLLER_EPOCH)
        # KIP-841/903: only live brokers may join an ISR, each from its current registration.
        # UpdateMetadata carries no other broker's epoch: read them from /brokers/ids (the
        # czxid), where the simulator's controller takes those it sends.
        # Liveness applies at once, the registration epochs once read: a follower catching up
        # meanwhile is not kept out (the controller checks its epoch on AlterPartition).
        live = [b.broker_id for b in brokers]
        error = self.rm.shell.update_metadata(request.broker_epoch, dict.fromkeys(live, -1))
        if error != Errors.NONE:
            return m_um.UpdateMetadataResponse(error_code=_code(error))
        self._update_metadata_seq += 1
        seq = self._update_metadata_seq
        eligible = await self._registered_broker_epochs(live)
        if seq == self._update_metadata_seq:  # else a newer one came while reading: it applies
            self.rm.shell.update_metadata(request.broker_epoch, eligible)
        return m_um.UpdateMetadataResponse()

    async def _registered_broker_epochs(self, broker_ids: list[int]) -> dict[int, int]:
        """The live brokers still registered, with their broker epochs; -1 (liveness only)
        for all when ZooKeeper cannot be read."""
        zk = self.server.zk_client

        def read() -> dict[int, int]:
            return {b: r[1] for b in broker_ids if (r := zk.get_broker(b)) is not None}

        if zk is not None:
            try:
                return await asyncio.to_thread(read)
            except Exception as e:
                logger.warning("reading the broker registrations failed: %s", e)
        return dict.fromkeys(broker_ids, -1)

    async def handle_stop_replica(
        self, ctx: RequestContext, request: m_sr.StopReplicaRequest
    ) -> m_sr.StopReplicaResponse:
        version = ctx.api_version
        wanted: dict[TopicPartition, bool] = {}
        if version == 0:
            for p in request.ungrouped_partitions:
                wanted[TopicPartition(p.topic_name, p.partition_index)] = request.delete_partitions
        elif version <= 2:
            for t in request.topics:
                for i in t.partition_indexes:
                    wanted[TopicPartition(t.name, i)] = request.delete_partitions
        else:
            for ts in request.topic_states:
                for ps in ts.partition_states:
                    wanted[TopicPartition(ts.topic_name, ps.partition_index)] = ps.delete_partition
        if self.rm.shell.is_stale_broker_epoch(request.broker_epoch):
            return m_sr.StopReplicaResponse(error_code=ErrorCode.STALE_BROKER_EPOCH)
        if request.controller_epoch < self.rm.core.controller_epoch:
            return m_sr.StopReplicaResponse(error_code=ErrorCode.STALE_CONTROLLER_EPOCH)
        fenced: dict[TopicPartition, int] = {}
        if version >= 3:
            # KIP-570: a StopReplica from an older leader epoch is refused for that partition
            # (-1: no epoch sent; -2: the topic is being deleted, always applied).
            for ts in request.topic_states:
                for ps in ts.partition_states:
                    tp = TopicPartition(ts.topic_name, ps.partition_index)
                    p = self.rm.core.partition(tp)
                    if p is not None and ps.leader_epoch >= 0 and ps.leader_epoch < p.leader_epoch:
                        fenced[tp] = ErrorCode.FENCED_LEADER_EPOCH
                        del wanted[tp]
        result = self.rm.stop_replicas(request.controller_id, request.controller_epoch,
                                       request.broker_epoch, wanted)
        if result.error != Errors.NONE:
            return m_sr.StopReplicaResponse(error_code=_code(result.error))
        errors = {tp: _code(e) for tp, e in result.partition_errors.items()}
        errors.update(fenced)
        return m_sr.StopReplicaResponse(error_code=0, partition_errors=[
            m_sr.StopReplicaPartitionError(tp.topic, tp.partition, errors.get(tp, 0))
            for tp in [*wanted, *fenced]
        ])

    async def handle_alter_partition(
        self, ctx: RequestContext, request: m_ap.AlterPartitionRequest
    ) -> m_ap.AlterPartitionResponse:
        """A leader's ISR change (KIP-497), for this broker's controller (broker/alter_partition.py)."""
        return await handle_alter_partition(self.server.controller, request, ctx.api_version)

    async def handle_controlled_shutdown(
        self, ctx: RequestContext, request: m_cs.ControlledShutdownRequest
    ) -> m_cs.ControlledShutdownResponse:
        controller = self.server.controller
        if controller is None or not getattr(controller, "is_active", False):
            return m_cs.ControlledShutdownResponse(error_code=ErrorCode.NOT_CONTROLLER)
        try:
            error, remaining = await controller.controlled_shutdown(
                request.broker_id, request.broker_epoch)
        except Exception as e:
            logger.warning("controlled shutdown of broker %d failed: %s", request.broker_id, e)
            return m_cs.ControlledShutdownResponse(error_code=ErrorCode.UNKNOWN_SERVER_ERROR)
        return m_cs.ControlledShutdownResponse(error_code=int(error), remaining_partitions=[
            m_cs.RemainingPartition(topic, partition) for topic, partition in remaining
        ])

