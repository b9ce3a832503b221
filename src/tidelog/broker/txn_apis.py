"""`TxnApis`: the transaction APIs of a broker, mapping the wire dataclasses to the
`TransactionCoordinator` (Kafka's `KafkaApis.handleInitProducerIdRequest`,
`handleAddPartitionToTxnRequest`, `handleAddOffsetsToTxnRequest`, `handleEndTxnRequest`,
`handleWriteTxnMarkersRequest`, `handleTxnOffsetCommitRequest`,
`handleDescribeTransactionsRequest`, `handleListTransactionsRequest`), plugged into `KafkaApis`
with `register_handler`.

FindCoordinator with key type 1 names the leader of `__transaction_state` partition
`abs(java_string_hash(transactional.id)) % transaction.state.log.num.partitions`; the first
lookup creates that topic (compacted, `transaction.state.log.min.isr`, uncompressed, unclean
election off), not while fewer brokers are alive than its replication factor. Leadership of its
partitions drives the coordinator as the offsets topic's drives the group coordinator.

WriteTxnMarkers is the partition leaders' side: each named partition gets a control batch with
the COMMIT/ABORT marker, appended with acks=all as the coordinator's (AppendOrigin.COORDINATOR);
markers that landed on `__consumer_offsets` complete the group coordinator's transactional
offsets. Before the version that introduced PRODUCER_FENCED, an API answers
INVALID_PRODUCER_EPOCH instead, as Kafka does.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from tidelog.broker.group_apis import (
    InternalTopicCreator,
    coordinator_endpoint,
    leader_and_isr_partitions,
    stop_replica_partitions,
)
from tidelog.broker.replica_manager import AsyncioScheduler
from tidelog.broker.socket_server import RequestContext
from tidelog.coordinator.group_coordinator import TransactionVerifier
from tidelog.coordinator.offsets import GROUP_METADATA_TOPIC_NAME, OffsetAndMetadata
from tidelog.coordinator.transaction.add_partitions_to_txn_manager import (
    VERIFY_VERSION,
    AddPartitionsToTxnManager,
    topic_results,
    unknown_partition_errors,
)
from tidelog.coordinator.transaction.asyncio_driver import (
    AsyncioTasks,
    ConnectionMarkerTransport,
    ConnectionTransport,
    ReplicaManagerAppender,
)
from tidelog.coordinator.transaction.coordinator import TransactionCoordinator
from tidelog.coordinator.transaction.log import TRANSACTION_STATE_TOPIC_NAME
from tidelog.coordinator.transaction.marker_channel import write_markers
from tidelog.coordinator.transaction.metadata import NO_PRODUCER_EPOCH, NO_PRODUCER_ID
from tidelog.coordinator.transaction.metadata import TransactionState as TxnState
from tidelog.coordinator.transaction.state_manager import TransactionConfig
from tidelog.protocol.api_keys import ApiKey
from tidelog.protocol.errors import ErrorCode
from tidelog.protocol.messages import add_offsets_to_txn as m_aot
from tidelog.protocol.messages import add_partitions_to_txn as m_apt
from tidelog.protocol.messages import describe_transactions as m_dtx
from tidelog.protocol.messages import end_txn as m_et
from tidelog.protocol.messages import init_producer_id as m_ipi
from tidelog.protocol.messages import leader_and_isr as m_lai
from tidelog.protocol.messages import list_transactions as m_ltx
from tidelog.protocol.messages import stop_replica as m_sr
from tidelog.protocol.messages import txn_offset_commit as m_toc
from tidelog.protocol.messages import write_txn_markers as m_wtm
from tidelog.replication.types import TopicPartition
from tidelog.storage.producer_state_manager import VerificationGuard

if TYPE_CHECKING:  # pragma: no cover
    from tidelog.broker.kafka_apis import KafkaApis
    from tidelog.broker.server import BrokerServer

__all__ = ["TxnApis", "write_txn_markers"]

logger = logging.getLogger(__name__)

E = ErrorCode
# The first version of each API whose clients understand PRODUCER_FENCED (KIP-588).
_PRODUCER_FENCED_SINCE = {
    ApiKey.INIT_PRODUCER_ID: 4,
    ApiKey.ADD_PARTITIONS_TO_TXN: 2,
    ApiKey.ADD_OFFSETS_TO_TXN: 2,
    ApiKey.END_TXN: 2,
}


def _client_error(api_key: int, version: int, error: int) -> int:
    if error == E.PRODUCER_FENCED and version < _PRODUCER_FENCED_SINCE[api_key]:
        return int(E.INVALID_PRODUCER_EPOCH)
    return error


class TxnApis:
    def __init__(self, server: BrokerServer) -> None:
        self.server = server
        self.config = TransactionConfig.from_kafka_config(server.config)
        self.tasks = AsyncioTasks()
        clock = AsyncioScheduler()
        self.coordinator = TransactionCoordinator(
            server.broker_id, ReplicaManagerAppender(server.replica_manager),
            server.metadata_cache,
            ConnectionMarkerTransport(server.broker_id, server.metadata_cache,
                                      self.write_markers,
                                      request_timeout_ms=self.config.request_timeout_ms),
            self._generate_producer_id, self.config, time=clock, scheduler=clock,
            tasks=self.tasks)
        # KIP-890: this broker's partitions verify transactional produces with the coordinators
        self.verifier_tasks = AsyncioTasks()
        self.verifier = AddPartitionsToTxnManager(
            server.metadata_cache, self.coordinator.state.partition_for,
            ConnectionTransport(
                server.broker_id, server.metadata_cache,
                lambda request: self.add_partitions_batch(request, VERIFY_VERSION),
                f"broker-{server.broker_id}-add-partitions-to-txn", api_version=VERIFY_VERSION,
                request_timeout_ms=self.config.request_timeout_ms),
            self.verifier_tasks)
        self._orig: dict[int, Any] = {}
        cfg = self.config
        self.topic = InternalTopicCreator(
            server, TRANSACTION_STATE_TOPIC_NAME, cfg.num_partitions, cfg.replication_factor, {
                # Kafka's TransactionLog.DefaultTopicConfigs
                "cleanup.policy": "compact",
                "min.insync.replicas": str(cfg.min_isr),
                "segment.bytes": str(cfg.segment_bytes),
                "unclean.leader.election.enable": "false",
                "compression.type": "uncompressed",
            }, "the transactions state topic", "transaction.state.log.replication.factor")

    async def _generate_producer_id(self) -> int:
        return await asyncio.to_thread(self.server.producer_id_manager.generate_producer_id)

    # ------------------------------------------------------------------ wiring
    def register(self, apis: KafkaApis) -> None:
        """Plug the transaction APIs into `apis` (after the group APIs: InitProducerId,
        LeaderAndIsr and StopReplica wrap the handlers there) and start."""
        for key in (ApiKey.INIT_PRODUCER_ID, ApiKey.LEADER_AND_ISR, ApiKey.STOP_REPLICA):
            self._orig[key] = apis.handlers[key]
        for key, handler in {
            ApiKey.INIT_PRODUCER_ID: self.handle_init_producer_id,
            ApiKey.LEADER_AND_ISR: self.handle_leader_and_isr,
            ApiKey.STOP_REPLICA: self.handle_stop_replica,
            ApiKey.ADD_PARTITIONS_TO_TXN: self.handle_add_partitions_to_txn,
            ApiKey.ADD_OFFSETS_TO_TXN: self.handle_add_offsets_to_txn,
            ApiKey.END_TXN: self.handle_end_txn,
            ApiKey.WRITE_TXN_MARKERS: self.handle_write_txn_markers,
            ApiKey.TXN_OFFSET_COMMIT: self.handle_txn_offset_commit,
            ApiKey.DESCRIBE_TRANSACTIONS: self.handle_describe_transactions,
            ApiKey.LIST_TRANSACTIONS: self.handle_list_transactions,
        }.items():
            apis.register_handler(key, handler)
        self.coordinator.startup()

    async def shutdown(self) -> None:
        self.topic.cancel()
        await self.verifier_tasks.cancel_all()
        await self.verifier.shutdown()
        await self.coordinator.shutdown()
        await self.tasks.cancel_all()

    @property
    def cache(self) -> Any:
        return self.server.metadata_cache

    # ------------------------------------------------------------------ leadership
    def _sync(self, named: list[tuple[str, int]]) -> None:
        core = self.server.replica_manager.core
        for topic, partition in named:
            if topic != TRANSACTION_STATE_TOPIC_NAME:
                continue
            p = core.partition(TopicPartition(topic, partition))
            if p is not None and p.is_leader:
                self.coordinator.state.on_election(partition, p.leader_epoch)
            else:
                self.coordinator.state.on_resignation(partition)

    async def handle_leader_and_isr(self, ctx: RequestContext,
                                    request: m_lai.LeaderAndIsrRequest) -> Any:
        response = await self._orig[ApiKey.LEADER_AND_ISR](ctx, request)
        self._sync(leader_and_isr_partitions(request))
        return response

    async def handle_stop_replica(self, ctx: RequestContext,
                                  request: m_sr.StopReplicaRequest) -> Any:
        response = await self._orig[ApiKey.STOP_REPLICA](ctx, request)
        self._sync(stop_replica_partitions(request))
        return response

    # ------------------------------------------------------------------ FindCoordinator
    def find_coordinator(self, transactional_id: str, listener: str
                         ) -> tuple[int, int, str, int]:
        """FindCoordinator key type 1 (GroupApis answers the request): (error, node id, host,
        port) of the transactional id's coordinator on the client's listener."""
        # An empty id is looked up like any other (Kafka 3.9 answers its coordinator too).
        if not self.cache.contains_topic(TRANSACTION_STATE_TOPIC_NAME):
            self.topic.maybe_create()
            return (int(E.COORDINATOR_NOT_AVAILABLE), -1, "", -1)
        tp = TopicPartition(TRANSACTION_STATE_TOPIC_NAME,
                            self.coordinator.state.partition_for(transactional_id))
        return coordinator_endpoint(self.server, tp, listener)

    # ------------------------------------------------------------------ InitProducerId
    async def handle_init_producer_id(self, ctx: RequestContext,
                                      request: m_ipi.InitProducerIdRequest) -> Any:
        if not request.transactional_id:
            if request.transactional_id == "":
                # Kafka: an empty transactional id is invalid (null means idempotence only).
                return m_ipi.InitProducerIdResponse(error_code=E.INVALID_REQUEST)
            return await self._orig[ApiKey.INIT_PRODUCER_ID](ctx, request)
        pid, epoch = request.producer_id, request.producer_epoch
        if (pid == NO_PRODUCER_ID) != (epoch == NO_PRODUCER_EPOCH):
            return m_ipi.InitProducerIdResponse(error_code=E.INVALID_REQUEST)
        expected = None if pid == NO_PRODUCER_ID else (pid, epoch)
        r = await self.coordinator.handle_init_producer_id(
            request.transactional_id, request.transaction_timeout_ms, expected)
        error = _client_error(ApiKey.INIT_PRODUCER_ID, ctx.api_version, r.error)
        if error:
            return m_ipi.InitProducerIdResponse(error_code=error)
        return m_ipi.InitProducerIdResponse(error_code=0, producer_id=r.producer_id,
                                            producer_epoch=r.producer_epoch)

    # ------------------------------------------------------------------ AddPartitionsToTxn
    async def handle_add_partitions_to_txn(self, ctx: RequestContext,
                                           request: m_apt.AddPartitionsToTxnRequest) -> Any:
        """v0-v3: a client's one transaction. v4 (KIP-890, from brokers): a batch of
        transactions, each added or, `verify_only`, checked (a partition leader verifying a
        transactional produce); one result per transaction."""
        if ctx.api_version < 4:
            errors = await self._add_partitions(
                ctx.api_version, request.v3_and_below_transactional_id,
                request.v3_and_below_producer_id, request.v3_and_below_producer_epoch, False,
                [TopicPartition(t.name, p) for t in request.v3_and_below_topics
                 for p in t.partitions])
            return m_apt.AddPartitionsToTxnResponse(
                results_by_topic_v3_and_below=topic_results(errors))
        return await self.add_partitions_batch(request, ctx.api_version)

    async def add_partitions_batch(self, request: m_apt.AddPartitionsToTxnRequest,
                                   version: int) -> m_apt.AddPartitionsToTxnResponse:
        """AddPartitionsToTxn v4+ (the verifier calls it without a socket for this broker's
        own coordinator)."""
        answers = await asyncio.gather(*(
            self._add_partitions(version, t.transactional_id, t.producer_id,
                                 t.producer_epoch, t.verify_only,
                                 [TopicPartition(tp.name, p) for tp in t.topics
                                  for p in tp.partitions])
            for t in request.transactions))
        return m_apt.AddPartitionsToTxnResponse(results_by_transaction=[
            m_apt.AddPartitionsToTxnResult(transactional_id=t.transactional_id,
                                           topic_results=topic_results(errors))
            for t, errors in zip(request.transactions, answers, strict=True)])

    async def _add_partitions(self, version: int, transactional_id: str, producer_id: int,
                              producer_epoch: int, verify_only: bool,
                              wanted: list[TopicPartition]) -> dict[TopicPartition, int]:
        unknown = unknown_partition_errors(self.cache, wanted)
        if unknown is not None:
            return unknown
        if verify_only:
            return self.coordinator.handle_verify_partitions(
                transactional_id, producer_id, producer_epoch, wanted)
        error = await self.coordinator.handle_add_partitions(
            transactional_id, producer_id, producer_epoch, wanted)
        return dict.fromkeys(wanted, _client_error(ApiKey.ADD_PARTITIONS_TO_TXN, version, error))

    async def handle_add_offsets_to_txn(self, ctx: RequestContext,
                                        request: m_aot.AddOffsetsToTxnRequest) -> Any:
        group_apis = self.server.group_apis
        assert group_apis is not None
        tp = TopicPartition(GROUP_METADATA_TOPIC_NAME,
                            group_apis.coordinator.partition_for(request.group_id))
        error = await self.coordinator.handle_add_partitions(
            request.transactional_id, request.producer_id, request.producer_epoch, [tp])
        return m_aot.AddOffsetsToTxnResponse(
            error_code=_client_error(ApiKey.ADD_OFFSETS_TO_TXN, ctx.api_version, error))

    # ------------------------------------------------------------------ EndTxn
    async def handle_end_txn(self, ctx: RequestContext, request: m_et.EndTxnRequest) -> Any:
        error = await self.coordinator.handle_end_transaction(
            request.transactional_id, request.producer_id, request.producer_epoch,
            request.committed)
        return m_et.EndTxnResponse(
            error_code=_client_error(ApiKey.END_TXN, ctx.api_version, error))

    # ------------------------------------------------------------------ WriteTxnMarkers
    async def handle_write_txn_markers(self, ctx: RequestContext,
                                       request: m_wtm.WriteTxnMarkersRequest) -> Any:
        return await self.write_markers(request)

    async def write_markers(self, request: m_wtm.WriteTxnMarkersRequest
                            ) -> m_wtm.WriteTxnMarkersResponse:
        group_apis = self.server.group_apis
        return await write_txn_markers(
            self.server.replica_manager, request, self.config.request_timeout_ms,
            group_apis.coordinator.handle_txn_completion if group_apis is not None else None)

    # ------------------------------------------------------------------ TxnOffsetCommit
    async def handle_txn_offset_commit(self, ctx: RequestContext,
                                       request: m_toc.TxnOffsetCommitRequest) -> Any:
        results: dict[tuple[str, int], int] = {}
        offsets: dict[tuple[str, int], OffsetAndMetadata] = {}
        now = int(time.time() * 1000)
        for topic in request.topics:
            for p in topic.partitions:
                key = (topic.name, p.partition_index)
                if self.cache.partition(TopicPartition(*key)) is None:
                    results[key] = int(E.UNKNOWN_TOPIC_OR_PARTITION)
                    continue
                offsets[key] = OffsetAndMetadata(
                    p.committed_offset, p.committed_leader_epoch, p.committed_metadata or "",
                    now)
        group_apis = self.server.group_apis
        if offsets:
            if group_apis is None:
                results.update({k: int(E.COORDINATOR_NOT_AVAILABLE) for k in offsets})
            else:
                results.update(await group_apis.coordinator.handle_txn_commit_offsets(
                    request.group_id, request.producer_id, request.producer_epoch,
                    request.member_id, request.generation_id, request.group_instance_id,
                    offsets, self._offsets_verifier(request)))
        by_topic: dict[str, list[m_toc.TxnOffsetCommitResponsePartition]] = defaultdict(list)
        for (topic, partition), error in results.items():
            by_topic[topic].append(m_toc.TxnOffsetCommitResponsePartition(
                partition_index=partition, error_code=error))
        return m_toc.TxnOffsetCommitResponse(topics=[
            m_toc.TxnOffsetCommitResponseTopic(name=t, partitions=ps)
            for t, ps in by_topic.items()])

    def _offsets_verifier(self, request: m_toc.TxnOffsetCommitRequest
                          ) -> TransactionVerifier | None:
        """KIP-890: a TxnOffsetCommit is verified as a produce is (Kafka 3.9's
        GroupCoordinator.handleTxnCommitOffsets), unless
        transaction.partition.verification.enable is off."""
        if not request.transactional_id or not self.server.dynamic_config.current.get(
                "transaction.partition.verification.enable"):
            return None
        core = self.server.replica_manager.core

        def verify(tp: TopicPartition) -> Awaitable[tuple[int, VerificationGuard]]:
            return self.verifier.verify_partition(
                core, request.transactional_id, request.producer_id, request.producer_epoch,
                tp, int(time.time() * 1000))
        return verify

    # ------------------------------------------------------------------ Describe / List
    async def handle_describe_transactions(
            self, ctx: RequestContext, request: m_dtx.DescribeTransactionsRequest) -> Any:
        out = []
        for txn_id in request.transactional_ids:
            state = m_dtx.TransactionState(transactional_id=txn_id)
            error, md = (int(E.INVALID_REQUEST), None) if not txn_id \
                else self.coordinator.describe(txn_id)
            if md is not None and md.state == TxnState.DEAD:
                error, md = int(E.TRANSACTIONAL_ID_NOT_FOUND), None
            state.error_code = error
            if md is not None:
                topics: dict[str, list[int]] = defaultdict(list)
                for tp in md.topic_partitions:
                    topics[tp.topic].append(tp.partition)
                state.transaction_state = md.state.kafka_name
                state.transaction_timeout_ms = md.txn_timeout_ms
                state.transaction_start_time_ms = md.txn_start_timestamp
                state.producer_id = md.producer_id
                state.producer_epoch = md.producer_epoch
                state.topics = [m_dtx.TopicData(topic=t, partitions=sorted(ps))
                                for t, ps in sorted(topics.items())]
            out.append(state)
        return m_dtx.DescribeTransactionsResponse(transaction_states=out)

    async def handle_list_transactions(self, ctx: RequestContext,
                                       request: m_ltx.ListTransactionsRequest) -> Any:
        unknown: list[str] = []
        states: set[TxnState] | None = None
        if request.state_filters:
            states = set()
            for name in request.state_filters:
                state = TxnState.from_kafka_name(name)
                if state is None:
                    unknown.append(name)
                else:
                    states.add(state)
        producer_ids = set(request.producer_id_filters) or None
        duration = request.duration_filter if ctx.api_version >= 1 else -1
        error, found = self.coordinator.list_transactions(states, producer_ids, duration)
        return m_ltx.ListTransactionsResponse(
            error_code=error, unknown_state_filters=unknown,
            transaction_states=[m_ltx.TransactionState(
                transactional_id=md.transactional_id, producer_id=md.producer_id,
                transaction_state=md.state.kafka_name) for md in found])


async def write_txn_markers(
    rm: Any, request: m_wtm.WriteTxnMarkersRequest, timeout_ms: int,
    on_offsets_completed: Callable[[int, set[int], bool], None] | None,
) -> m_wtm.WriteTxnMarkersResponse:
    """The partition leader's side of WriteTxnMarkers on this broker's replica manager
    (marker_channel.write_markers)."""
    return await write_markers(ReplicaManagerAppender(rm), _GATHER, request, timeout_ms,
                               int(time.time() * 1000), on_offsets_completed)


_GATHER = AsyncioTasks()  # write_markers only gathers with it: no task outlives a request
