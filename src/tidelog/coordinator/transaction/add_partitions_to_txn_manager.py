"""KIP-890 part 1, transaction verification on the partition leader (Kafka 3.9's
`AddPartitionsToTxnManager` and `ReplicaManager.maybeStartTransactionVerificationForPartitions`).

With `transaction.partition.verification.enable` (Kafka's default: on), a leader that gets a
transactional batch from a producer with no transaction open on the partition asks the
producer's transaction coordinator, before appending, whether the transaction includes the
partition: an AddPartitionsToTxn v4 `verify_only` request to the broker leading the
`__transaction_state` partition of the transactional id (found as the producer finds it).
Only a verified batch is appended, and only while the partition's verification guard made
when the verification started is still there (storage/producer_state_manager.py): an abort
marker written meanwhile drops it. A zombie's late produce after its transaction ended is so
refused with INVALID_TXN_STATE instead of opening a transaction no coordinator will end.

Verifications are batched per coordinator broker as Kafka's: one request in flight per
broker; those that arrive meanwhile go together in the next one. A second verification of
the same transactional id waiting for the next request replaces the first (which gets
NETWORK_EXCEPTION, or INVALID_PRODUCER_EPOCH if the new one has a newer epoch); one with an
older epoch gets INVALID_PRODUCER_EPOCH at once.

Written once for both drivers (driver.py): the requests go through a `VerificationTransport`
(the asyncio broker's connections, this broker's own coordinator without a socket; the
simulated network), the batching sender runs on the driver's `TaskRunner` and each waiting
verification is one of its promises.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tidelog.coordinator.transaction.driver import Promise, TaskRunner, VerificationTransport
from tidelog.coordinator.transaction.log import TRANSACTION_STATE_TOPIC_NAME
from tidelog.protocol.errors import ErrorCode
from tidelog.protocol.messages import add_partitions_to_txn as m_apt
from tidelog.protocol.records.batch import (
    CONTROL_FLAG_MASK,
    HEADER_STRUCT,
    is_transactional_at,
)
from tidelog.replication.types import TopicPartition
from tidelog.storage.producer_state_manager import VerificationGuard

__all__ = [
    "VERIFY_VERSION",
    "AddPartitionsToTxnManager",
    "answer_verifications",
    "produce_error_of_verification",
    "start_transaction_verification",
    "topic_results",
    "unknown_partition_errors",
]

logger = logging.getLogger(__name__)

E = ErrorCode
VERIFY_VERSION = 4  # AddPartitionsToTxn's batched broker-to-broker form
# Verification errors that older producers may not retry: Kafka answers the produce with
# NOT_ENOUGH_REPLICAS (retriable, and no metadata refresh) instead.
_RETRIABLE_AS_NOT_ENOUGH_REPLICAS = frozenset({
    E.CONCURRENT_TRANSACTIONS, E.NETWORK_EXCEPTION, E.COORDINATOR_LOAD_IN_PROGRESS,
    E.COORDINATOR_NOT_AVAILABLE, E.NOT_COORDINATOR})

# What Kafka 3.9's leader tells a producer (every Produce version before KIP-890 part 2's v12)
# for the coordinator's answer: a fenced producer INVALID_PRODUCER_EPOCH, a partition not in
# its transaction INVALID_TXN_STATE.
_OLD_CLIENT_ERRORS = {int(E.PRODUCER_FENCED): int(E.INVALID_PRODUCER_EPOCH),
                      int(E.TRANSACTION_ABORTABLE): int(E.INVALID_TXN_STATE)}

def produce_error_of_verification(error: int) -> int:
    """The produce error for a failed verification (Kafka's postVerificationCallback)."""
    return int(E.NOT_ENOUGH_REPLICAS) if error in _RETRIABLE_AS_NOT_ENOUGH_REPLICAS else error


def start_transaction_verification(
    core: Any, tp: TopicPartition, producer_id: int, now_ms: int,
) -> VerificationGuard:
    """Kafka's maybeStartTransactionVerificationForPartition: the partition's guard for the
    producer; SENTINEL when there is nothing to verify: its transaction is open here, or this
    broker does not lead the partition (the append answers that error, as Kafka's
    getPartitionOrException would)."""
    partition = core.partition(tp)
    if partition is None or not partition.is_leader:
        return VerificationGuard.SENTINEL
    guard: VerificationGuard = partition.log.maybe_start_transaction_verification(
        producer_id, now_ms)
    return guard


@dataclass(slots=True)
class _Pending:
    producer_id: int
    producer_epoch: int
    partitions: list[TopicPartition]
    answer: Promise = field(repr=False)
    answered: bool = False

    def set(self, errors: dict[TopicPartition, int]) -> None:
        if not self.answered:
            self.answered = True
            self.answer.set_result(errors)


class AddPartitionsToTxnManager:
    def __init__(self, metadata_cache: Any, partition_for: Callable[[str], int],
                 transport: VerificationTransport, tasks: TaskRunner) -> None:
        self.cache = metadata_cache
        self.partition_for = partition_for
        self.transport = transport
        self.tasks = tasks
        # per coordinator broker: the verifications waiting for its next request
        self._pending: dict[int, dict[str, _Pending]] = defaultdict(dict)
        self._sending: set[int] = set()
        self.requests_sent = 0

    async def shutdown(self) -> None:
        """Close the transport (the senders are the task runner's to cancel)."""
        await self.transport.close()

    def _coordinator(self, transactional_id: str) -> int | None:
        tp = TopicPartition(TRANSACTION_STATE_TOPIC_NAME, self.partition_for(transactional_id))
        if self.cache.partition(tp) is None:
            return None
        leader: int | None = self.cache.leader_of(tp)
        return leader if leader is not None and leader >= 0 else None

    async def verify_produce(self, core: Any, transactional_id: str,
                             entries: Mapping[TopicPartition, Any], now_ms: int
                             ) -> tuple[dict[TopicPartition, int], dict[TopicPartition,
                                                                         VerificationGuard]]:
        """Kafka's handleProduceAppend before the append: the produce error of each partition
        whose verification failed, and the guards the append must present (one batch per
        partition, as Produce v3+ carries)."""
        producers: set[tuple[int, int]] = set()
        transactional: list[TopicPartition] = []
        for tp, records in entries.items():
            header = HEADER_STRUCT.unpack_from(records, 0)
            attributes, producer_id, producer_epoch = header[5], header[9], header[10]
            if producer_id >= 0 and is_transactional_at(records) \
                    and not attributes & CONTROL_FLAG_MASK:
                producers.add((producer_id, producer_epoch))
                transactional.append(tp)
        if len(producers) > 1:
            # Kafka: "Transactional records contained more than one producer ID"
            return dict.fromkeys(entries, int(E.INVALID_PRODUCER_ID_MAPPING)), {}
        if not producers:
            return {}, {}
        producer_id, producer_epoch = producers.pop()
        guards: dict[TopicPartition, VerificationGuard] = {}
        for tp in transactional:
            guard = start_transaction_verification(core, tp, producer_id, now_ms)
            if guard is not VerificationGuard.SENTINEL:
                guards[tp] = guard
        if not guards:
            return {}, {}
        answers = await self.verify_transaction(transactional_id, producer_id, producer_epoch,
                                                guards)
        return ({tp: produce_error_of_verification(error) for tp, error in answers.items()
                 if error}, guards)

    async def verify_partition(self, core: Any, transactional_id: str, producer_id: int,
                               producer_epoch: int, tp: TopicPartition, now_ms: int
                               ) -> tuple[int, VerificationGuard]:
        """Kafka's maybeStartTransactionVerificationForPartition (a TxnOffsetCommit's offsets
        partition): the coordinator's error, NONE when verified or nothing to verify, and
        the guard the append must present."""
        guard = start_transaction_verification(core, tp, producer_id, now_ms)
        if guard is VerificationGuard.SENTINEL:
            return 0, guard
        answers = await self.verify_transaction(transactional_id, producer_id, producer_epoch,
                                                [tp])
        return answers[tp], guard

    async def verify_transaction(self, transactional_id: str, producer_id: int,
                                 producer_epoch: int, partitions: Iterable[TopicPartition]
                                 ) -> dict[TopicPartition, int]:
        """Each partition's answer from the coordinator: NONE when the transaction
        includes it."""
        wanted = list(partitions)
        node = self._coordinator(transactional_id)
        if node is None:
            return dict.fromkeys(wanted, int(E.COORDINATOR_NOT_AVAILABLE))
        waiting = self._pending[node]
        existing = waiting.get(transactional_id)
        if existing is not None:
            if existing.producer_epoch > producer_epoch:
                return dict.fromkeys(wanted, int(E.INVALID_PRODUCER_EPOCH))
            error = int(E.INVALID_PRODUCER_EPOCH if existing.producer_epoch < producer_epoch
                        else E.NETWORK_EXCEPTION)
            existing.set(dict.fromkeys(existing.partitions, error))
        answer = self.tasks.promise()
        waiting[transactional_id] = _Pending(producer_id, producer_epoch, wanted, answer)
        if node not in self._sending:
            self._sending.add(node)
            self.tasks.spawn(self._send_all(node))
        errors: dict[TopicPartition, int] = await answer
        return errors

    async def _send_all(self, node: int) -> None:
        try:
            while self._pending.get(node):
                batch = self._pending.pop(node)
                answers = await self._send(node, batch)
                for txn_id, pending in batch.items():
                    pending.set(answers[txn_id])
        finally:
            self._sending.discard(node)

    async def _send(self, node: int, batch: Mapping[str, _Pending]
                    ) -> dict[str, dict[TopicPartition, int]]:
        request = m_apt.AddPartitionsToTxnRequest(transactions=[
            m_apt.AddPartitionsToTxnTransaction(
                transactional_id=txn_id, producer_id=p.producer_id,
                producer_epoch=p.producer_epoch, verify_only=True,
                topics=[m_apt.AddPartitionsToTxnTopic(name=t, partitions=sorted(ps))
                        for t, ps in _by_topic(p.partitions).items()])
            for txn_id, p in batch.items()])
        try:
            response = await self.transport.send(node, request)
            self.requests_sent += 1
        except Exception as e:
            logger.info("transaction verification with broker %d failed: %s", node, e)
            return {txn_id: dict.fromkeys(p.partitions, int(E.NETWORK_EXCEPTION))
                    for txn_id, p in batch.items()}
        if response.error_code:
            return {txn_id: dict.fromkeys(p.partitions, response.error_code)
                    for txn_id, p in batch.items()}
        # Kafka's handleResponse: only a partition answered with an error is unverified, so
        # one the answer leaves out of its transaction's result is verified. A transaction the
        # answer leaves out entirely Kafka never calls back (its produce is never answered,
        # the producer times out and retries); here it gets the retriable error of an answer
        # that never came, so its produce is answered (NOT_ENOUGH_REPLICAS) and retried.
        out = {txn_id: dict.fromkeys(p.partitions, int(E.NETWORK_EXCEPTION))
               for txn_id, p in batch.items()}
        for result in response.results_by_transaction:
            errors = out.get(result.transactional_id)
            if errors is None:
                continue
            errors.update(dict.fromkeys(errors, int(E.NONE)))
            for topic in result.topic_results:
                for r in topic.results_by_partition:
                    tp = TopicPartition(topic.name, r.partition_index)
                    if tp in errors:
                        errors[tp] = _OLD_CLIENT_ERRORS.get(r.partition_error_code,
                                                            r.partition_error_code)
        return out


def _by_topic(partitions: Iterable[TopicPartition]) -> dict[str, list[int]]:
    by_topic: dict[str, list[int]] = defaultdict(list)
    for tp in partitions:
        by_topic[tp.topic].append(tp.partition)
    return by_topic


def unknown_partition_errors(metadata_cache: Any, wanted: list[TopicPartition]
                             ) -> dict[TopicPartition, int] | None:
    """Kafka's AddPartitionsToTxn: any partition the metadata does not know fails the whole
    transaction (UNKNOWN_TOPIC_OR_PARTITION, the others OPERATION_NOT_ATTEMPTED); None when
    every one is known."""
    unknown = {tp for tp in wanted if metadata_cache.partition(tp) is None}
    if not unknown:
        return None
    return {tp: int(E.UNKNOWN_TOPIC_OR_PARTITION) if tp in unknown
            else int(E.OPERATION_NOT_ATTEMPTED) for tp in wanted}


def topic_results(errors: Mapping[TopicPartition, int]
                  ) -> list[m_apt.AddPartitionsToTxnTopicResult]:
    by_topic: dict[str, list[m_apt.AddPartitionsToTxnPartitionResult]] = defaultdict(list)
    for tp, error in errors.items():
        by_topic[tp.topic].append(m_apt.AddPartitionsToTxnPartitionResult(
            partition_index=tp.partition, partition_error_code=error))
    return [m_apt.AddPartitionsToTxnTopicResult(name=t, results_by_partition=rs)
            for t, rs in by_topic.items()]


def answer_verifications(coordinator: Any, metadata_cache: Any,
                         request: m_apt.AddPartitionsToTxnRequest
                         ) -> m_apt.AddPartitionsToTxnResponse:
    """The coordinator broker's answer to the verify_only AddPartitionsToTxn v4 a partition
    leader's manager sends: one result per transaction (the simulated broker's; the asyncio
    broker's handler answers every v4 request, added or verified, alike)."""
    assert all(t.verify_only for t in request.transactions)
    results: list[m_apt.AddPartitionsToTxnResult] = []
    for t in request.transactions:
        wanted = [TopicPartition(tp.name, p) for tp in t.topics for p in tp.partitions]
        errors = unknown_partition_errors(metadata_cache, wanted) or \
            coordinator.handle_verify_partitions(t.transactional_id, t.producer_id,
                                                 t.producer_epoch, wanted)
        results.append(m_apt.AddPartitionsToTxnResult(transactional_id=t.transactional_id,
                                                      topic_results=topic_results(errors)))
    return m_apt.AddPartitionsToTxnResponse(results_by_transaction=results)
