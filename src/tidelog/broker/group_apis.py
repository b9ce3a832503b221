"""`GroupApis`: the consumer group APIs of a broker, mapping the wire dataclasses to the
`GroupCoordinator` (Kafka's `KafkaApis.handleFindCoordinatorRequest`, `handleJoinGroupRequest`,
... in ZooKeeper mode), plugged into `KafkaApis` with `register_handler`.

FindCoordinator: the coordinator of a group is the leader of `__consumer_offsets` partition
`abs(java_string_hash(group_id)) % offsets.topic.num.partitions`. The first lookup creates that
topic (`offsets.topic.num.partitions` partitions, `offsets.topic.replication.factor` replicas,
`cleanup.policy=compact`: the log cleaner keeps the latest commit per key, so the topic and the
coordinator's load time after a failover do not grow with every commit). As Kafka does, the
topic is not created while fewer brokers are alive than the replication factor: lookups answer
COORDINATOR_NOT_AVAILABLE (clients retry) until enough brokers registered. Transaction
coordinators (key type 1) are `broker/txn_apis.TxnApis`'s.

Leadership of the offsets partitions drives the coordinator: LeaderAndIsr and StopReplica are
wrapped so that, after the broker applied them, every offsets partition named in the request
is loaded (this broker leads it) or unloaded (it does not any more).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from tidelog.broker.socket_server import RequestContext
from tidelog.controller.admin import AdminError
from tidelog.coordinator.group_coordinator import CoordinatorConfig, GroupCoordinator
from tidelog.coordinator.offsets import GROUP_METADATA_TOPIC_NAME, OffsetAndMetadata
from tidelog.protocol.api_keys import ApiKey
from tidelog.protocol.errors import ErrorCode
from tidelog.protocol.messages import describe_groups as m_dg
from tidelog.protocol.messages import find_coordinator as m_fc
from tidelog.protocol.messages import heartbeat as m_hb
from tidelog.protocol.messages import join_group as m_jg
from tidelog.protocol.messages import leader_and_isr as m_lai
from tidelog.protocol.messages import leave_group as m_lg
from tidelog.protocol.messages import list_groups as m_lg2
from tidelog.protocol.messages import offset_commit as m_oc
from tidelog.protocol.messages import offset_fetch as m_of
from tidelog.protocol.messages import stop_replica as m_sr
from tidelog.protocol.messages import sync_group as m_sg
from tidelog.replication.types import TopicPartition

if TYPE_CHECKING:  # pragma: no cover
    from tidelog.broker.kafka_apis import KafkaApis
    from tidelog.broker.server import BrokerServer

__all__ = ["GroupApis"]

logger = logging.getLogger(__name__)

E = ErrorCode
COORDINATOR_KEY_GROUP = 0
COORDINATOR_KEY_TRANSACTION = 1
# Kafka's AclOperation codes a group supports (READ, DELETE, DESCRIBE): DescribeGroups v3+
# reports them all, as there is no authorizer.
_GROUP_OPERATIONS = (1 << 3) | (1 << 6) | (1 << 8)
_NOT_PROVIDED_OPERATIONS = -(1 << 31)
# Between two attempts to create the offsets topic.
_CREATE_RETRY_S = 1.0


def error_message(error: int) -> str | None:
    """Kafka puts the error's message in FindCoordinator's error_message (None when fine)."""
    if not error:
        return None
    try:
        return ErrorCode(error).message
    except ValueError:
        return None


def coordinator_endpoint(server: BrokerServer, tp: TopicPartition,
                         listener: str) -> tuple[int, int, str, int]:
    """(error, node id, host, port) of the coordinator leading internal partition `tp`, on
    the client's listener; COORDINATOR_NOT_AVAILABLE without a live leader."""
    unavailable = (int(E.COORDINATOR_NOT_AVAILABLE), -1, "", -1)
    cache = server.metadata_cache
    pm = cache.partition(tp)
    if pm is None or pm.leader < 0 or not cache.is_alive(pm.leader):
        return unavailable
    if pm.leader == server.broker_id:
        host, port = server.advertised_endpoint_for(listener)
        return (0, pm.leader, host, port)
    endpoint = cache.endpoint(pm.leader)
    where = endpoint.for_listener(listener) if endpoint is not None else None
    if where is None:
        return unavailable
    return (0, pm.leader, where[0], where[1])


def leader_and_isr_partitions(request: m_lai.LeaderAndIsrRequest) -> list[tuple[str, int]]:
    """Every (topic, partition) a LeaderAndIsr request names, in any of its versions."""
    named = [(s.topic_name, s.partition_index) for s in request.ungrouped_partition_states]
    named += [(ts.topic_name, ps.partition_index)
              for ts in request.topic_states for ps in ts.partition_states]
    return named


def stop_replica_partitions(request: m_sr.StopReplicaRequest) -> list[tuple[str, int]]:
    """Every (topic, partition) a StopReplica request names, in any of its versions."""
    named = [(p.topic_name, p.partition_index) for p in request.ungrouped_partitions]
    named += [(t.name, i) for t in request.topics for i in t.partition_indexes]
    named += [(ts.topic_name, ps.partition_index)
              for ts in request.topic_states for ps in ts.partition_states]
    return named


class InternalTopicCreator:
    """Creates an internal topic at its first lookup, as Kafka's coordinators do: never while
    fewer brokers are alive than its replication factor (lookups answer
    COORDINATOR_NOT_AVAILABLE meanwhile, clients retry), at most one attempt a second."""

    def __init__(self, server: BrokerServer, name: str, partitions: int,
                 replication_factor: int, config: dict[str, str], description: str,
                 replication_key: str) -> None:
        self.server = server
        self.name = name
        self.partitions = partitions
        self.replication_factor = replication_factor
        self.config = config
        self.description = description
        self.replication_key = replication_key
        self._creating: asyncio.Task[None] | None = None
        self._last_attempt = 0.0

    def maybe_create(self) -> None:
        if self._creating is not None and not self._creating.done():
            return
        if time.monotonic() - self._last_attempt < _CREATE_RETRY_S:
            return
        self._last_attempt = time.monotonic()
        self._creating = asyncio.get_running_loop().create_task(self._create())

    def cancel(self) -> None:
        if self._creating is not None:
            self._creating.cancel()

    async def _create(self) -> None:
        alive = len(self.server.metadata_cache.alive_broker_ids())
        if alive < self.replication_factor:
            # Kafka's refusal: an internal topic is never created below its replication factor.
            logger.warning(
                "Number of alive brokers '%d' does not meet the required replication factor "
                "'%d' for %s (configured via '%s'). This error can be ignored if the cluster "
                "is starting up and not all brokers are up yet.", alive,
                self.replication_factor, self.description, self.replication_key)
            return
        try:
            await asyncio.to_thread(self.server.admin.create_topic, self.name, self.partitions,
                                    self.replication_factor, self.config)
            logger.info("created %s %s (%d partitions, RF %d)", self.description, self.name,
                        self.partitions, self.replication_factor)
        except AdminError as e:
            if e.error_code != E.TOPIC_ALREADY_EXISTS:
                logger.warning("creating %s failed: %s", self.name, e)
        except Exception as e:
            logger.warning("creating %s failed: %s", self.name, e)


class GroupApis:
    def __init__(self, server: BrokerServer) -> None:
        self.server = server
        self.config = CoordinatorConfig.from_kafka_config(server.config)
        self.coordinator = GroupCoordinator(server.broker_id, server.replica_manager, self.config)
        self._orig_leader_and_isr: Any = None
        self._orig_stop_replica: Any = None
        cfg = self.config
        self.offsets_topic = InternalTopicCreator(
            server, GROUP_METADATA_TOPIC_NAME, cfg.offsets_topic_num_partitions,
            cfg.offsets_topic_replication_factor, {
                "cleanup.policy": "compact",
                "segment.bytes": str(cfg.offsets_topic_segment_bytes),
                "compression.type": "producer",
            }, "the offsets topic", "offsets.topic.replication.factor")

    # ------------------------------------------------------------------ wiring
    def register(self, apis: KafkaApis) -> None:
        """Plug the group APIs into `apis` and start the coordinator (on the running loop)."""
        self._orig_leader_and_isr = apis.handlers[ApiKey.LEADER_AND_ISR]
        self._orig_stop_replica = apis.handlers[ApiKey.STOP_REPLICA]
        for key, handler in {
            ApiKey.FIND_COORDINATOR: self.handle_find_coordinator,
            ApiKey.JOIN_GROUP: self.handle_join_group,
            ApiKey.SYNC_GROUP: self.handle_sync_group,
            ApiKey.HEARTBEAT: self.handle_heartbeat,
            ApiKey.LEAVE_GROUP: self.handle_leave_group,
            ApiKey.OFFSET_COMMIT: self.handle_offset_commit,
            ApiKey.OFFSET_FETCH: self.handle_offset_fetch,
            ApiKey.LIST_GROUPS: self.handle_list_groups,
            ApiKey.DESCRIBE_GROUPS: self.handle_describe_groups,
            ApiKey.LEADER_AND_ISR: self.handle_leader_and_isr,
            ApiKey.STOP_REPLICA: self.handle_stop_replica,
        }.items():
            apis.register_handler(key, handler)
        self.coordinator.startup()

    async def shutdown(self) -> None:
        self.offsets_topic.cancel()
        await self.coordinator.shutdown()

    @property
    def cache(self) -> Any:
        return self.server.metadata_cache

    # ------------------------------------------------------------------ leadership
    def _offsets_partitions(self, states: list[tuple[str, int]]) -> list[int]:
        return [p for t, p in states if t == GROUP_METADATA_TOPIC_NAME]

    def _sync_offsets_partitions(self, partitions: list[int]) -> None:
        core = self.server.replica_manager.core
        for partition in partitions:
            p = core.partition(TopicPartition(GROUP_METADATA_TOPIC_NAME, partition))
            if p is not None and p.is_leader:
                self.coordinator.on_election(partition, p.leader_epoch)
            else:
                self.coordinator.on_resignation(partition)

    async def handle_leader_and_isr(
        self, ctx: RequestContext, request: m_lai.LeaderAndIsrRequest
    ) -> Any:
        named = leader_and_isr_partitions(request)
        response = await self._orig_leader_and_isr(ctx, request)
        self._sync_offsets_partitions(self._offsets_partitions(named))
        return response

    async def handle_stop_replica(self, ctx: RequestContext, request: m_sr.StopReplicaRequest) -> Any:
        named = stop_replica_partitions(request)
        response = await self._orig_stop_replica(ctx, request)
        self._sync_offsets_partitions(self._offsets_partitions(named))
        return response

    # ------------------------------------------------------------------ FindCoordinator
    async def handle_find_coordinator(
        self, ctx: RequestContext, request: m_fc.FindCoordinatorRequest
    ) -> m_fc.FindCoordinatorResponse:
        version = ctx.api_version
        key_type = request.key_type if version >= 1 else COORDINATOR_KEY_GROUP
        keys = list(request.coordinator_keys) if version >= 4 else [request.key]
        found = [await self._find(key, key_type, ctx.listener_name) for key in keys]
        if version >= 4:
            return m_fc.FindCoordinatorResponse(coordinators=[
                m_fc.Coordinator(key=k, node_id=n, host=h, port=p, error_code=e,
                                 error_message=error_message(e))
                for k, (e, n, h, p) in zip(keys, found, strict=True)
            ])
        e, n, h, p = found[0]
        return m_fc.FindCoordinatorResponse(error_code=e, error_message=error_message(e), node_id=n,
                                            host=h, port=p)

    async def _find(self, key: str, key_type: int, listener: str) -> tuple[int, int, str, int]:
        if key_type == COORDINATOR_KEY_TRANSACTION and self.server.txn_apis is not None:
            return self.server.txn_apis.find_coordinator(key, listener)
        if key_type != COORDINATOR_KEY_GROUP:
            return (int(E.INVALID_REQUEST), -1, "", -1)
        if not self.cache.contains_topic(GROUP_METADATA_TOPIC_NAME):
            self.offsets_topic.maybe_create()
            return (int(E.COORDINATOR_NOT_AVAILABLE), -1, "", -1)
        tp = TopicPartition(GROUP_METADATA_TOPIC_NAME, self.coordinator.partition_for(key))
        return coordinator_endpoint(self.server, tp, listener)

    # ------------------------------------------------------------------ JoinGroup / SyncGroup
    async def handle_join_group(
        self, ctx: RequestContext, request: m_jg.JoinGroupRequest
    ) -> m_jg.JoinGroupResponse:
        version = ctx.api_version
        r = await self.coordinator.handle_join_group(
            request.group_id,
            request.member_id,
            request.group_instance_id if version >= 5 else None,
            version >= 4,  # KIP-394: a new member first gets its id with MEMBER_ID_REQUIRED
            ctx.header.client_id or "",
            "/" + ctx.client_host,  # as Kafka's InetAddress.toString
            request.rebalance_timeout_ms if version >= 1 else request.session_timeout_ms,
            request.session_timeout_ms,
            request.protocol_type,
            [(p.name, p.metadata) for p in request.protocols],
        )
        return m_jg.JoinGroupResponse(
            error_code=r.error,
            generation_id=r.generation_id,
            protocol_type=r.protocol_type,
            protocol_name=r.protocol_name if r.protocol_name is not None or version >= 7 else "",
            leader=r.leader_id,
            member_id=r.member_id,
            members=[m_jg.JoinGroupResponseMember(member_id=mid, group_instance_id=inst,
                                                  metadata=meta)
                     for mid, inst, meta in r.members],
        )

    async def handle_sync_group(
        self, ctx: RequestContext, request: m_sg.SyncGroupRequest
    ) -> m_sg.SyncGroupResponse:
        version = ctx.api_version
        r = await self.coordinator.handle_sync_group(
            request.group_id, request.generation_id, request.member_id,
            request.protocol_type if version >= 5 else None,
            request.protocol_name if version >= 5 else None,
            {a.member_id: a.assignment for a in request.assignments},
            request.group_instance_id if version >= 3 else None,
        )
        return m_sg.SyncGroupResponse(error_code=r.error, assignment=r.assignment,
                                      protocol_type=r.protocol_type,
                                      protocol_name=r.protocol_name)

    # ------------------------------------------------------------------ Heartbeat / LeaveGroup
    async def handle_heartbeat(
        self, ctx: RequestContext, request: m_hb.HeartbeatRequest
    ) -> m_hb.HeartbeatResponse:
        return m_hb.HeartbeatResponse(error_code=self.coordinator.handle_heartbeat(
            request.group_id, request.member_id, request.generation_id,
            request.group_instance_id if ctx.api_version >= 3 else None))

    async def handle_leave_group(
        self, ctx: RequestContext, request: m_lg.LeaveGroupRequest
    ) -> m_lg.LeaveGroupResponse:
        version = ctx.api_version
        if version >= 3:
            identities = [(m.member_id, m.group_instance_id) for m in request.members]
        else:
            identities = [(request.member_id, None)]
        error, per_member = self.coordinator.handle_leave_group(request.group_id, identities)
        if version >= 3:
            return m_lg.LeaveGroupResponse(error_code=error, members=[
                m_lg.MemberResponse(member_id=mid, group_instance_id=inst, error_code=code)
                for (mid, inst), code in zip(identities, per_member, strict=True)
            ] if not error else [])
        return m_lg.LeaveGroupResponse(error_code=error or per_member[0])

    # ------------------------------------------------------------------ OffsetCommit
    async def handle_offset_commit(
        self, ctx: RequestContext, request: m_oc.OffsetCommitRequest
    ) -> m_oc.OffsetCommitResponse:
        version = ctx.api_version
        now = int(time.time() * 1000)
        generation = request.generation_id_or_member_epoch if version >= 1 else -1
        member_id = request.member_id if version >= 1 else ""
        retention = request.retention_time_ms if 2 <= version <= 4 else -1
        errors: dict[tuple[str, int], int] = {}
        offsets: dict[tuple[str, int], OffsetAndMetadata] = {}
        for t in request.topics:
            for p in t.partitions:
                key = (t.name, p.partition_index)
                if self.cache.partition(TopicPartition(t.name, p.partition_index)) is None:
                    errors[key] = int(E.UNKNOWN_TOPIC_OR_PARTITION)
                    continue
                commit_ts = p.commit_timestamp if version == 1 and p.commit_timestamp >= 0 else now
                offsets[key] = OffsetAndMetadata(
                    offset=p.committed_offset,
                    leader_epoch=p.committed_leader_epoch if version >= 6 else -1,
                    metadata=p.committed_metadata or "",
                    commit_timestamp_ms=commit_ts,
                    expire_timestamp_ms=commit_ts + retention if retention >= 0 else None,
                )
        if offsets:
            errors.update(await self.coordinator.handle_commit_offsets(
                request.group_id, member_id, generation, offsets,
                request.group_instance_id if version >= 7 else None))
        return m_oc.OffsetCommitResponse(topics=[
            m_oc.OffsetCommitResponseTopic(name=t.name, partitions=[
                m_oc.OffsetCommitResponsePartition(
                    partition_index=p.partition_index,
                    error_code=errors.get((t.name, p.partition_index), 0))
                for p in t.partitions
            ])
            for t in request.topics
        ])

    # ------------------------------------------------------------------ OffsetFetch
    async def handle_offset_fetch(
        self, ctx: RequestContext, request: m_of.OffsetFetchRequest
    ) -> m_of.OffsetFetchResponse:
        version = ctx.api_version
        wanted: list[tuple[str, int]] | None
        if request.topics is None and version >= 2:
            wanted = None
        else:
            wanted = [(t.name, i) for t in request.topics or [] for i in t.partition_indexes]
        error, found = self.coordinator.handle_fetch_offsets(request.group_id, wanted)
        if error and version >= 2:
            return m_of.OffsetFetchResponse(error_code=error, topics=[])
        by_topic: dict[str, list[m_of.OffsetFetchResponsePartition]] = {}
        items = [(tp, None) for tp in wanted or []] if error else sorted(
            found.items(), key=lambda kv: kv[0])
        # v7 require_stable (KIP-447): an offset an open transaction is committing is answered
        # UNSTABLE_OFFSET_COMMIT (retriable) until the transaction ends.
        pending = self.coordinator.pending_txn
        for (topic, partition), om in items:
            if (not error and request.require_stable
                    and pending.has_pending(request.group_id, (topic, partition))):
                by_topic.setdefault(topic, []).append(m_of.OffsetFetchResponsePartition(
                    partition_index=partition, committed_offset=-1, committed_leader_epoch=-1,
                    metadata="", error_code=ErrorCode.UNSTABLE_OFFSET_COMMIT))
                continue
            by_topic.setdefault(topic, []).append(m_of.OffsetFetchResponsePartition(
                partition_index=partition,
                committed_offset=om.offset if om is not None else -1,
                committed_leader_epoch=om.leader_epoch if om is not None else -1,
                metadata=om.metadata if om is not None else "",
                error_code=error,
            ))
        return m_of.OffsetFetchResponse(error_code=error, topics=[
            m_of.OffsetFetchResponseTopic(name=topic, partitions=parts)
            for topic, parts in by_topic.items()
        ])

    # ------------------------------------------------------------------ ListGroups / DescribeGroups
    async def handle_list_groups(
        self, ctx: RequestContext, request: m_lg2.ListGroupsRequest
    ) -> m_lg2.ListGroupsResponse:
        error, groups = self.coordinator.handle_list_groups()
        states = set(request.states_filter) if ctx.api_version >= 4 else set()
        return m_lg2.ListGroupsResponse(error_code=error, groups=[
            m_lg2.ListedGroup(group_id=g, protocol_type=pt, group_state=state)
            for g, pt, state in groups if not states or state in states
        ])

    async def handle_describe_groups(
        self, ctx: RequestContext, request: m_dg.DescribeGroupsRequest
    ) -> m_dg.DescribeGroupsResponse:
        ops = (_GROUP_OPERATIONS if ctx.api_version >= 3 and request.include_authorized_operations
               else _NOT_PROVIDED_OPERATIONS)
        out = []
        for group_id in request.groups:
            error, (state, protocol_type, protocol, members) = \
                self.coordinator.handle_describe_group(group_id)
            out.append(m_dg.DescribedGroup(
                error_code=error, group_id=group_id, group_state=state,
                protocol_type=protocol_type, protocol_data=protocol,
                members=[m_dg.DescribedGroupMember(
                    member_id=m.member_id, group_instance_id=m.group_instance_id,
                    client_id=m.client_id, client_host=m.client_host,
                    member_metadata=m.metadata, member_assignment=m.assignment)
                    for m in members],
                authorized_operations=ops,
            ))
        return m_dg.DescribeGroupsResponse(groups=out)
