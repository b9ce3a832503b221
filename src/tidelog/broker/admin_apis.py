"""Kafka's partition-lifecycle admin APIs, as its ZooKeeper-mode broker answers them (issue 14).

CreatePartitions (37), as `KafkaApis.handleCreatePartitionsRequest` and
`ZkAdminManager.createPartitions`: the active controller's broker (any other answers
NOT_CONTROLLER, before anything else, as Kafka 3.9) validates the request and writes the grown
assignment to /brokers/topics/<t> (the topic id kept); the controller's watch on that znode
creates the new partitions (LeaderAndIsr, UpdateMetadata). The answer waits, as Kafka's
DelayedCreatePartitions, until this broker's metadata has a leader for every new partition, up
to the request's timeout (REQUEST_TIMED_OUT after it; at once for timeout_ms <= 0).
A topic twice in one request is INVALID_REQUEST ("Duplicate topic in request."), a topic queued
for deletion INVALID_TOPIC_EXCEPTION ("The topic is queued for deletion."); the rest are
`AdminZkClient.create_partitions`'s refusals. Nothing is written for a refused topic.

DeleteRecords (21), as `ReplicaManager.deleteRecords`: the leader moves its log start offset to
the requested offset (-1: the high watermark); an offset beyond the HW (or negative) is
OFFSET_OUT_OF_RANGE, a partition this broker does not lead NOT_LEADER_OR_FOLLOWER, an unknown one
UNKNOWN_TOPIC_OR_PARTITION, an internal topic INVALID_TOPIC_EXCEPTION, a topic without the delete
cleanup policy POLICY_VIOLATION (low_watermark -1 for each). Followers learn the new log start
offset from their fetch responses and send theirs back in their fetch requests; the answer waits,
as Kafka's DelayedDeleteRecords, until the low watermark (the smallest log start offset among the
leader and its followers on live brokers) has reached the requested offset, and carries it;
REQUEST_TIMED_OUT after timeout_ms. Segments wholly below the log start offset go at the next
retention check, as in Kafka.

DeleteGroups (42) and OffsetDelete (47) are the group coordinator's
(`GroupCoordinator.handle_delete_groups` / `handle_delete_offsets`, Kafka's handleDeleteGroups /
handleDeleteOffsets); OffsetDelete answers UNKNOWN_TOPIC_OR_PARTITION for a partition the
metadata does not know, before asking the coordinator, and a group-level error alone.

ElectLeaders (43) is the controller's (`KafkaController.elect_leaders`): NOT_CONTROLLER on any
other broker (clients send it to the controller). The answer waits, as Kafka's
DelayedElectLeader, until this broker's metadata shows each elected leader (REQUEST_TIMED_OUT
after timeout_ms). Asked for every partition (null), it leaves out those that needed no election.

DescribeCluster (60): the cluster id, the controller and the live brokers' endpoints on the
listener the request came in on (as Kafka's handleDescribeCluster); asked for, the cluster's
authorized operations are all those a cluster supports, as Kafka answers without an authorizer.

DescribeLogDirs (35), as `ReplicaManager.describeLogDirs`: per configured log dir (absolute
path) its logs grouped by topic, each requested partition with its size in bytes and offset lag
(max(HW - LEO, 0), -1 when the partition is not hosted online), the file system's total and
usable bytes; an offline dir answers KAFKA_STORAGE_ERROR. A replica moving to another dir shows
its future log there too, with is_future_key and its lag behind the current log's LEO.

AlterReplicaLogDirs (34), as `ReplicaManager.alterReplicaLogDirs`: each partition's replica
moves to the named dir of this broker (`shell.alter_log_dirs`); LOG_DIR_NOT_FOUND for a dir not
in log.dirs, KAFKA_STORAGE_ERROR for an offline dir or partition, REPLICA_NOT_AVAILABLE for a
known partition not hosted here (the dir is remembered for its creation),
UNKNOWN_TOPIC_OR_PARTITION for one the metadata lacks.

DescribeProducers (61), as `Partition.activeProducerState`: the idempotent producers of a
partition hosted here (leader or follower) with their epoch, last sequence and last timestamp
(coordinator epoch and transaction start -1: tidelog has no transactions);
UNKNOWN_TOPIC_OR_PARTITION for a partition the metadata lacks, NOT_LEADER_OR_FOLLOWER for one not
hosted here.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
from typing import TYPE_CHECKING

from tidelog.controller.admin import AdminError
from tidelog.protocol.api_keys import ApiKey
from tidelog.protocol.errors import ErrorCode
from tidelog.protocol.messages import alter_partition_reassignments as m_apr
from tidelog.protocol.messages import alter_replica_log_dirs as m_arld
from tidelog.protocol.messages import create_partitions as m_cp
from tidelog.protocol.messages import delete_groups as m_dg
from tidelog.protocol.messages import delete_records as m_dr
from tidelog.protocol.messages import describe_cluster as m_dcl
from tidelog.protocol.messages import describe_log_dirs as m_dld
from tidelog.protocol.messages import describe_producers as m_dp
from tidelog.protocol.messages import elect_leaders as m_el
from tidelog.protocol.messages import list_partition_reassignments as m_lpr
from tidelog.protocol.messages import offset_delete as m_od
from tidelog.replication.types import TopicPartition
from tidelog.storage.errors import OffsetOutOfRangeError

if TYPE_CHECKING:  # pragma: no cover
    from tidelog.broker.kafka_apis import KafkaApis
    from tidelog.broker.server import BrokerServer
    from tidelog.broker.socket_server import RequestContext

__all__ = ["AdminApis"]

logger = logging.getLogger(__name__)

_POLL_S = 0.02
# DeleteRecordsRequest.HIGH_WATERMARK
HIGH_WATERMARK = -1
# Kafka's Topic.INTERNAL_TOPICS
_INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state"})
# The AclOperations a cluster supports (Kafka's AclEntry.supportedOperations(CLUSTER)): ALTER 7,
# CREATE 5, DESCRIBE 8, CLUSTER_ACTION 9, DESCRIBE_CONFIGS 10, ALTER_CONFIGS 11,
# IDEMPOTENT_WRITE 12, as a bit field (Utils.to32BitField).
_CLUSTER_OPERATIONS = sum(1 << op for op in (5, 7, 8, 9, 10, 11, 12))
_NOT_PROVIDED_OPERATIONS = -(1 << 31)
_ENDPOINT_TYPE_BROKER = 1
_ENDPOINT_TYPE_CONTROLLER = 2


class AdminApis:
    def __init__(self, server: BrokerServer) -> None:
        self.server = server
        # DeleteRecords answers waiting for a low watermark, by partition (Kafka's
        # DelayedDeleteRecords purgatory keys).
        self.delete_records_waiting: dict[TopicPartition, set[DelayedDeleteRecords]] = {}
        server.replica_manager.core.partition_listeners.append(self._partition_changed)

    def _partition_changed(self, tp: TopicPartition) -> None:
        for waiter in list(self.delete_records_waiting.get(tp, ())):
            waiter.partition_changed()

    def register(self, apis: KafkaApis) -> None:
        apis.register_handler(ApiKey.CREATE_PARTITIONS, self.handle_create_partitions)
        apis.register_handler(ApiKey.DELETE_RECORDS, self.handle_delete_records)
        apis.register_handler(ApiKey.DELETE_GROUPS, self.handle_delete_groups)
        apis.register_handler(ApiKey.OFFSET_DELETE, self.handle_offset_delete)
        apis.register_handler(ApiKey.ELECT_LEADERS, self.handle_elect_leaders)
        apis.register_handler(ApiKey.DESCRIBE_CLUSTER, self.handle_describe_cluster)
        apis.register_handler(ApiKey.DESCRIBE_LOG_DIRS, self.handle_describe_log_dirs)
        apis.register_handler(ApiKey.ALTER_REPLICA_LOG_DIRS, self.handle_alter_replica_log_dirs)
        apis.register_handler(ApiKey.DESCRIBE_PRODUCERS, self.handle_describe_producers)
        apis.register_handler(ApiKey.ALTER_PARTITION_REASSIGNMENTS,
                              self.handle_alter_partition_reassignments)
        apis.register_handler(ApiKey.LIST_PARTITION_REASSIGNMENTS,
                              self.handle_list_partition_reassignments)

    # ------------------------------------------------------------------ CreatePartitions
    async def handle_create_partitions(
        self, ctx: RequestContext, request: m_cp.CreatePartitionsRequest
    ) -> m_cp.CreatePartitionsResponse:
        names = [t.name for t in request.topics]
        dupes = {n for n in names if names.count(n) > 1}
        results: dict[str, m_cp.CreatePartitionsTopicResult] = {}
        grown: dict[str, int] = {}
        zk = self.server.zk_client
        controller = self.server.controller
        not_controller = controller is not None and not getattr(controller, "is_active", False)
        for t in request.topics:
            if t.name in results:
                continue
            res = m_cp.CreatePartitionsTopicResult(name=t.name, error_message=None)
            results[t.name] = res
            if not_controller:
                # ZooKeeper mode: only the active controller serves it (checked first, as 3.9).
                res.error_code = ErrorCode.NOT_CONTROLLER
                continue
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

    # ------------------------------------------------------------------ DeleteRecords
    async def handle_delete_records(
        self, ctx: RequestContext, request: m_dr.DeleteRecordsRequest
    ) -> m_dr.DeleteRecordsResponse:
        cache = self.server.metadata_cache
        results: dict[TopicPartition, m_dr.DeleteRecordsPartitionResult] = {}
        required: dict[TopicPartition, int] = {}
        for t in request.topics:
            for rp in t.partitions:
                tp = TopicPartition(t.name, rp.partition_index)
                res = m_dr.DeleteRecordsPartitionResult(partition_index=tp.partition,
                                                        low_watermark=-1)
                results[tp] = res
                if cache.partition(tp) is None:
                    res.error_code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                    continue
                code, offset, low = self._delete_records_on_leader(tp, rp.offset)
                res.error_code, res.low_watermark = code, low
                if code == ErrorCode.NONE and low < offset:
                    required[tp] = offset
        if required:
            await DelayedDeleteRecords(self, required, results).wait(request.timeout_ms)
        topics: dict[str, m_dr.DeleteRecordsTopicResult] = {}
        for tp, res in results.items():
            topics.setdefault(tp.topic, m_dr.DeleteRecordsTopicResult(name=tp.topic)) \
                .partitions.append(res)
        return m_dr.DeleteRecordsResponse(topics=list(topics.values()))

    def _delete_records_on_leader(self, tp: TopicPartition, offset: int) -> tuple[int, int, int]:
        """Kafka's `Partition.deleteRecordsOnLeader`: (error, requested offset, low watermark)."""
        if tp.topic in _INTERNAL_TOPICS:
            return ErrorCode.INVALID_TOPIC_EXCEPTION, offset, -1
        p = self.server.replica_manager.core.partition(tp)
        if p is None:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER, offset, -1
        if not p.is_leader:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER, offset, -1
        if "delete" not in str(p.log.config.cleanup_policy).split(","):
            return ErrorCode.POLICY_VIOLATION, offset, -1
        converted = p.high_watermark if offset == HIGH_WATERMARK else offset
        if converted < 0:
            return ErrorCode.OFFSET_OUT_OF_RANGE, converted, -1
        try:
            p.log.maybe_increment_log_start_offset(converted)
        except OffsetOutOfRangeError:
            return ErrorCode.OFFSET_OUT_OF_RANGE, converted, -1
        # Fetch sessions read only changed partitions: the followers must see the new start;
        # fetches waiting below it answer at once.
        self.server.replica_manager.shell.log_start_moved(tp)
        return ErrorCode.NONE, converted, self.low_watermark_if_leader(tp)

    def low_watermark_if_leader(self, tp: TopicPartition) -> int:
        """Kafka's `Partition.lowWatermarkIfLeader`: the smallest log start offset of the leader
        and of its followers on live brokers (a follower that has not fetched yet counts as -1);
        -1 when this broker no longer leads the partition."""
        p = self.server.replica_manager.core.partition(tp)
        if p is None or not p.is_leader:
            return -1
        cache = self.server.metadata_cache
        low = p.log_start_offset
        for replica in p.remote_replicas.values():
            if cache.is_alive(replica.broker_id) and replica.log_start_offset < low:
                low = replica.log_start_offset
        return low

    # ------------------------------------------------------------------ DeleteGroups / OffsetDelete
    async def handle_delete_groups(
        self, ctx: RequestContext, request: m_dg.DeleteGroupsRequest
    ) -> m_dg.DeleteGroupsResponse:
        group_apis = self.server.group_apis
        if group_apis is None:
            errors = {g: int(ErrorCode.COORDINATOR_NOT_AVAILABLE) for g in request.groups_names}
        else:
            errors = await group_apis.coordinator.handle_delete_groups(
                list(dict.fromkeys(request.groups_names)))
        return m_dg.DeleteGroupsResponse(results=[
            m_dg.DeletableGroupResult(group_id=g, error_code=e) for g, e in errors.items()])

    async def handle_offset_delete(
        self, ctx: RequestContext, request: m_od.OffsetDeleteRequest
    ) -> m_od.OffsetDeleteResponse:
        cache = self.server.metadata_cache
        errors: dict[tuple[str, int], int] = {}
        known: list[tuple[str, int]] = []
        for t in request.topics:
            for rp in t.partitions:
                tp = (t.name, rp.partition_index)
                if cache.partition(TopicPartition(*tp)) is None:
                    errors[tp] = int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
                else:
                    known.append(tp)
        group_apis = self.server.group_apis
        if group_apis is None:
            return m_od.OffsetDeleteResponse(error_code=ErrorCode.COORDINATOR_NOT_AVAILABLE)
        group_error, results = await group_apis.coordinator.handle_delete_offsets(
            request.group_id, known)
        if group_error:
            return m_od.OffsetDeleteResponse(error_code=group_error)
        errors.update(results)
        topics: dict[str, m_od.OffsetDeleteResponseTopic] = {}
        for (topic, partition), code in errors.items():
            topics.setdefault(topic, m_od.OffsetDeleteResponseTopic(name=topic)).partitions.append(
                m_od.OffsetDeleteResponsePartition(partition_index=partition, error_code=code))
        return m_od.OffsetDeleteResponse(topics=list(topics.values()))

    # ------------------------------------------------------------------ ElectLeaders
    async def handle_elect_leaders(
        self, ctx: RequestContext, request: m_el.ElectLeadersRequest
    ) -> m_el.ElectLeadersResponse:
        asked = None if request.topic_partitions is None else [
            TopicPartition(t.topic, p) for t in request.topic_partitions for p in t.partitions]
        controller = self.server.controller
        election_type = request.election_type if ctx.api_version >= 1 else 0
        if controller is None or not getattr(controller, "is_active", False):
            results = {tp: (int(ErrorCode.NOT_CONTROLLER), None, -1) for tp in asked or ()}
        else:
            results = dict(await controller.elect_leaders(asked, election_type))
        expected = {tp: leader for tp, (code, _, leader) in results.items() if code == 0}
        if expected:
            cache = self.server.metadata_cache
            deadline = time.monotonic() + max(request.timeout_ms, 0) / 1000
            while True:
                pending = [tp for tp, leader in expected.items()
                           if (p := cache.partition(tp)) is None or p.leader != leader]
                if not pending:
                    break
                if time.monotonic() >= deadline:
                    for tp in pending:
                        results[tp] = (int(ErrorCode.REQUEST_TIMED_OUT), None, -1)
                    break
                await asyncio.sleep(_POLL_S)
        if asked is None:
            results = {tp: r for tp, r in results.items()
                       if r[0] != ErrorCode.ELECTION_NOT_NEEDED}
        topics: dict[str, m_el.ReplicaElectionResult] = {}
        for tp, (code, message, _) in results.items():
            topics.setdefault(tp.topic, m_el.ReplicaElectionResult(topic=tp.topic)) \
                .partition_result.append(m_el.PartitionResult(
                    partition_id=tp.partition, error_code=code, error_message=message))
        return m_el.ElectLeadersResponse(replica_election_results=list(topics.values()))

    # ------------------------------------------------------------------ reassignments
    async def handle_alter_partition_reassignments(
        self, ctx: RequestContext, request: m_apr.AlterPartitionReassignmentsRequest
    ) -> m_apr.AlterPartitionReassignmentsResponse:
        targets = {TopicPartition(t.name, p.partition_index): p.replicas
                   for t in request.topics for p in t.partitions}
        controller = self.server.controller
        results = None if controller is None else \
            await controller.reassignments.alter_partition_reassignments(targets)
        if results is None:
            return m_apr.AlterPartitionReassignmentsResponse(
                error_code=int(ErrorCode.NOT_CONTROLLER),
                error_message=ErrorCode.NOT_CONTROLLER.message)
        topics: dict[str, m_apr.ReassignableTopicResponse] = {}
        for tp, error in results.items():
            topics.setdefault(tp.topic, m_apr.ReassignableTopicResponse(name=tp.topic)) \
                .partitions.append(m_apr.ReassignablePartitionResponse(
                    partition_index=tp.partition, error_code=error.code,
                    error_message=error.text))
        return m_apr.AlterPartitionReassignmentsResponse(error_message=None,
                                                        responses=list(topics.values()))

    async def handle_list_partition_reassignments(
        self, ctx: RequestContext, request: m_lpr.ListPartitionReassignmentsRequest
    ) -> m_lpr.ListPartitionReassignmentsResponse:
        asked = None if request.topics is None else [
            TopicPartition(t.name, p) for t in request.topics for p in t.partition_indexes]
        controller = self.server.controller
        ongoing = None if controller is None else \
            await controller.reassignments.list_partition_reassignments(asked)
        if ongoing is None:
            return m_lpr.ListPartitionReassignmentsResponse(
                error_code=int(ErrorCode.NOT_CONTROLLER),
                error_message=ErrorCode.NOT_CONTROLLER.message)
        topics: dict[str, m_lpr.OngoingTopicReassignment] = {}
        for tp, a in ongoing.items():
            topics.setdefault(tp.topic, m_lpr.OngoingTopicReassignment(name=tp.topic)) \
                .partitions.append(m_lpr.OngoingPartitionReassignment(
                    partition_index=tp.partition, replicas=list(a.replicas),
                    adding_replicas=list(a.adding_replicas),
                    removing_replicas=list(a.removing_replicas)))
        return m_lpr.ListPartitionReassignmentsResponse(error_message=None,
                                                        topics=list(topics.values()))

    # ------------------------------------------------------------------ DescribeCluster
    async def handle_describe_cluster(
        self, ctx: RequestContext, request: m_dcl.DescribeClusterRequest
    ) -> m_dcl.DescribeClusterResponse:
        if ctx.api_version >= 1 and request.endpoint_type != _ENDPOINT_TYPE_BROKER:
            # Kafka 3.9's AuthHelper (KIP-919): an unknown type first, then a broker listener
            # asked about controllers.
            if request.endpoint_type != _ENDPOINT_TYPE_CONTROLLER:
                return m_dcl.DescribeClusterResponse(
                    error_code=ErrorCode.UNSUPPORTED_ENDPOINT_TYPE,
                    error_message=f"Unsupported endpoint type {request.endpoint_type}")
            return m_dcl.DescribeClusterResponse(
                error_code=ErrorCode.MISMATCHED_ENDPOINT_TYPE,
                error_message="The request was sent to an endpoint of type BROKER, but we"
                              " wanted an endpoint of type CONTROLLER")
        cache = self.server.metadata_cache
        brokers = []
        for broker_id in cache.alive_broker_ids():
            b = cache.brokers[broker_id]
            ep = b.for_listener(ctx.listener_name)
            if ep is not None:
                brokers.append(m_dcl.DescribeClusterBroker(broker_id, ep[0], ep[1], b.rack))
        controller = cache.controller_id
        return m_dcl.DescribeClusterResponse(
            cluster_id=self.server.cluster_id or "",
            controller_id=-1 if controller is None else controller,
            brokers=brokers,
            cluster_authorized_operations=(_CLUSTER_OPERATIONS
                                           if request.include_cluster_authorized_operations
                                           else _NOT_PROVIDED_OPERATIONS))

    # ------------------------------------------------------------------ DescribeLogDirs
    async def handle_describe_log_dirs(
        self, ctx: RequestContext, request: m_dld.DescribeLogDirsRequest
    ) -> m_dld.DescribeLogDirsResponse:
        lm = self.server.log_manager
        if request.topics is None:
            wanted = set(lm.logs)
        else:
            wanted = {(t.topic, p) for t in request.topics for p in t.partitions}
        core = self.server.replica_manager.core
        results = []
        for log_dir in lm.log_dirs:
            path = os.path.abspath(log_dir)
            if log_dir in lm.offline_dirs:
                results.append(m_dld.DescribeLogDirsResult(
                    error_code=ErrorCode.KAFKA_STORAGE_ERROR, log_dir=path))
                continue
            try:
                usage = shutil.disk_usage(path)
            except OSError:
                results.append(m_dld.DescribeLogDirsResult(
                    error_code=ErrorCode.KAFKA_STORAGE_ERROR, log_dir=path))
                continue
            by_topic: dict[str, list[m_dld.DescribeLogDirsPartition]] = {}
            here = [(tp, log, False) for tp, log in lm.logs.items()
                    if lm.log_dir_of.get(tp) == log_dir]
            here += [(tp, log, True) for tp, log in lm.future_logs.items()
                     if lm.future_log_dir_of.get(tp) == log_dir]
            for tp, log, is_future in sorted(here, key=lambda e: e[0]):
                parts = by_topic.setdefault(tp[0], [])
                if tp not in wanted:
                    continue
                p = core.partition(TopicPartition(*tp))
                if p is None:
                    lag = -1  # not hosted online (Kafka's INVALID_OFFSET_LAG)
                elif is_future:
                    lag = p.log_end_offset - log.log_end_offset
                else:
                    lag = max(p.high_watermark - log.log_end_offset, 0)
                parts.append(m_dld.DescribeLogDirsPartition(
                    partition_index=tp[1], partition_size=log.size, offset_lag=lag,
                    is_future_key=is_future))
            results.append(m_dld.DescribeLogDirsResult(
                log_dir=path,
                topics=[m_dld.DescribeLogDirsTopic(name=t, partitions=ps)
                        for t, ps in by_topic.items()],
                total_bytes=usage.total, usable_bytes=usage.free))
        return m_dld.DescribeLogDirsResponse(results=results)

    # ------------------------------------------------------------------ AlterReplicaLogDirs
    async def handle_alter_replica_log_dirs(
        self, ctx: RequestContext, request: m_arld.AlterReplicaLogDirsRequest
    ) -> m_arld.AlterReplicaLogDirsResponse:
        # A partition named under two dirs goes to the last one (Kafka builds a map).
        partition_dirs = {TopicPartition(t.name, p): d.path
                          for d in request.dirs for t in d.topics for p in t.partitions}
        cache = self.server.metadata_cache
        moves = self.server.replica_manager.shell.alter_log_dirs_manager
        results = moves.alter_replica_log_dirs(
            partition_dirs, lambda tp: cache.partition(tp) is not None)
        by_topic: dict[str, m_arld.AlterReplicaLogDirTopicResult] = {}
        for tp, code in results.items():
            by_topic.setdefault(tp.topic, m_arld.AlterReplicaLogDirTopicResult(
                topic_name=tp.topic)).partitions.append(
                m_arld.AlterReplicaLogDirPartitionResult(partition_index=tp.partition,
                                                         error_code=code))
        return m_arld.AlterReplicaLogDirsResponse(results=list(by_topic.values()))

    # ------------------------------------------------------------------ DescribeProducers
    async def handle_describe_producers(
        self, ctx: RequestContext, request: m_dp.DescribeProducersRequest
    ) -> m_dp.DescribeProducersResponse:
        cache = self.server.metadata_cache
        rm = self.server.replica_manager
        topics = []
        for t in request.topics:
            partitions = []
            for index in t.partition_indexes:
                tp = TopicPartition(t.name, index)
                res = m_dp.PartitionResponse(partition_index=index, error_message=None)
                partitions.append(res)
                p = rm.core.partition(tp)
                if cache.partition(tp) is None:
                    res.error_code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                elif p is None:
                    res.error_code = ErrorCode.NOT_LEADER_OR_FOLLOWER
                else:
                    # Any replica answers from its own log's producer state (Kafka's
                    # Partition.activeProducerState), transactional fields included.
                    entries = p.log.producer_state_manager.producers
                    res.active_producers = [
                        m_dp.ProducerState(
                            producer_id=pid, producer_epoch=e.producer_epoch,
                            last_sequence=e.last_seq, last_timestamp=e.last_timestamp,
                            coordinator_epoch=e.coordinator_epoch,
                            current_txn_start_offset=(-1 if e.current_txn_first_offset is None
                                                      else e.current_txn_first_offset))
                        for pid, e in sorted(entries.items())]
            topics.append(m_dp.TopicResponse(name=t.name, partitions=partitions))
        return m_dp.DescribeProducersResponse(topics=topics)


class DelayedDeleteRecords:
    """Kafka's DelayedDeleteRecords: completes each partition once its low watermark has reached
    the requested offset (NONE and that low watermark), or when the partition is no longer led
    here (NOT_LEADER_OR_FOLLOWER), offline (KAFKA_STORAGE_ERROR) or gone
    (UNKNOWN_TOPIC_OR_PARTITION); at the timeout the partitions still pending are
    REQUEST_TIMED_OUT. Re-checked only when the replica manager reports one of its partitions
    changed (a follower's log start, the leader's, leadership, deletion), as Kafka's purgatory
    keyed by partition: no polling."""

    def __init__(self, apis: AdminApis, required: dict[TopicPartition, int],
                 results: dict[TopicPartition, m_dr.DeleteRecordsPartitionResult]) -> None:
        self.apis = apis
        self.pending = dict(required)
        self.results = results
        self._done: asyncio.Future[None] | None = None

    def try_complete(self) -> bool:
        core = self.apis.server.replica_manager.core
        for tp, offset in list(self.pending.items()):
            p = core.partition(tp)
            res = self.results[tp]
            if p is None and tp in core.offline_partitions:
                res.error_code, res.low_watermark = ErrorCode.KAFKA_STORAGE_ERROR, -1
            elif p is None:
                res.error_code, res.low_watermark = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1
            elif not p.is_leader:
                res.error_code, res.low_watermark = ErrorCode.NOT_LEADER_OR_FOLLOWER, -1
            else:
                low = self.apis.low_watermark_if_leader(tp)
                if low < offset:
                    continue
                res.error_code, res.low_watermark = ErrorCode.NONE, low
            del self.pending[tp]
        return not self.pending

    def _expire(self) -> None:
        if self._done is not None and not self._done.done():
            self._done.set_result(None)

    def partition_changed(self) -> None:
        """One of the pending partitions changed: complete if every one is done."""
        if self._done is not None and not self._done.done() and self.try_complete():
            self._done.set_result(None)

    async def wait(self, timeout_ms: int) -> None:
        if self.try_complete():
            return
        if timeout_ms > 0:
            loop = asyncio.get_running_loop()
            self._done = loop.create_future()
            watched = self.apis.delete_records_waiting
            tps = list(self.pending)
            for tp in tps:
                watched.setdefault(tp, set()).add(self)
            timer = loop.call_later(timeout_ms / 1000, self._expire)
            try:
                await self._done
            finally:
                timer.cancel()
                for tp in tps:
                    waiters = watched.get(tp)
                    if waiters is not None:
                        waiters.discard(self)
                        if not waiters:
                            del watched[tp]
        for tp in self.pending:
            self.results[tp].error_code = ErrorCode.REQUEST_TIMED_OUT
