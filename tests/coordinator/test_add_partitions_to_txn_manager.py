"""The partition leader's transaction verification (KIP-890): verifications waiting while a
request to their coordinator is in flight go together in the next one; a second verification
of the same transactional id replaces the first; the coordinator's answers become the errors
the producer sees (Kafka 3.9's AddPartitionsToTxnManager)."""

from __future__ import annotations

import asyncio

from tidelog.coordinator.transaction.add_partitions_to_txn_manager import (
    AddPartitionsToTxnManager,
    produce_error_of_verification,
)
from tidelog.coordinator.transaction.asyncio_driver import AsyncioTasks
from tidelog.protocol.errors import ErrorCode as E
from tidelog.protocol.messages import add_partitions_to_txn as m_apt
from tidelog.replication.types import TopicPartition

TP0, TP1 = TopicPartition("t", 0), TopicPartition("t", 1)


class OneCoordinator:
    """The metadata cache at its boundary: every transactional id's coordinator is broker 1."""

    def partition(self, tp: TopicPartition) -> object | None:
        return object()

    def leader_of(self, tp: TopicPartition) -> int:
        return 1


class Coordinator:
    """The transport to the coordinator at its boundary: answers `codes` per partition once
    released (leaving out of its answer a partition with no code and the transactions in
    `unanswered`); records the requests."""

    def __init__(self, codes: dict[TopicPartition, int],
                 unanswered: frozenset[str] = frozenset()) -> None:
        self.codes = codes
        self.unanswered = unanswered
        self.requests: list[list[str]] = []
        self.release = asyncio.Event()

    async def close(self) -> None:
        return None

    async def send(self, broker_id: int, request: m_apt.AddPartitionsToTxnRequest
                   ) -> m_apt.AddPartitionsToTxnResponse:
        assert broker_id == 1
        assert all(t.verify_only for t in request.transactions)
        self.requests.append([t.transactional_id for t in request.transactions])
        await self.release.wait()
        return m_apt.AddPartitionsToTxnResponse(results_by_transaction=[
            m_apt.AddPartitionsToTxnResult(transactional_id=t.transactional_id, topic_results=[
                m_apt.AddPartitionsToTxnTopicResult(name=topic.name, results_by_partition=[
                    m_apt.AddPartitionsToTxnPartitionResult(
                        partition_index=p,
                        partition_error_code=self.codes[TopicPartition(topic.name, p)])
                    for p in topic.partitions if TopicPartition(topic.name, p) in self.codes])
                for topic in t.topics])
            for t in request.transactions if t.transactional_id not in self.unanswered])


def manager(coordinator: Coordinator) -> AddPartitionsToTxnManager:
    return AddPartitionsToTxnManager(OneCoordinator(), lambda txn: 0, coordinator, AsyncioTasks())


def test_verifications_waiting_for_the_coordinator_go_in_one_request() -> None:
    async def go() -> tuple[list[dict[TopicPartition, int]], list[list[str]]]:
        coordinator = Coordinator({TP0: 0, TP1: int(E.TRANSACTION_ABORTABLE)})
        m = manager(coordinator)
        first = asyncio.ensure_future(m.verify_transaction("a", 1, 0, [TP0]))
        await asyncio.sleep(0)  # "a" is in flight
        later = [asyncio.ensure_future(m.verify_transaction(txn, pid, 0, [TP0, TP1]))
                 for txn, pid in (("b", 2), ("c", 3))]
        await asyncio.sleep(0)
        coordinator.release.set()
        answers = await asyncio.gather(first, *later)
        await m.shutdown()
        return answers, coordinator.requests

    answers, requests = asyncio.run(go())
    assert requests == [["a"], ["b", "c"]]
    # a partition not in the transaction: INVALID_TXN_STATE for the producer
    assert answers == [{TP0: 0}] + [{TP0: 0, TP1: int(E.INVALID_TXN_STATE)}] * 2


def test_a_second_verification_of_a_transactional_id_replaces_the_waiting_one() -> None:
    async def go() -> list[dict[TopicPartition, int]]:
        coordinator = Coordinator({TP0: int(E.PRODUCER_FENCED)})
        m = manager(coordinator)
        blocker = asyncio.ensure_future(m.verify_transaction("x", 9, 0, [TP0]))
        await asyncio.sleep(0)
        waiting = asyncio.ensure_future(m.verify_transaction("a", 1, 3, [TP0]))
        await asyncio.sleep(0)
        same_epoch = asyncio.ensure_future(m.verify_transaction("a", 1, 3, [TP0]))
        await asyncio.sleep(0)
        older = await m.verify_transaction("a", 1, 2, [TP0])  # refused at once
        newer = asyncio.ensure_future(m.verify_transaction("a", 1, 4, [TP0]))
        await asyncio.sleep(0)
        coordinator.release.set()
        out = [await waiting, await same_epoch, older, await newer, await blocker]
        await m.shutdown()
        return out

    waiting, same_epoch, older, newer, blocker = asyncio.run(go())
    assert waiting == {TP0: int(E.NETWORK_EXCEPTION)}
    assert same_epoch == {TP0: int(E.INVALID_PRODUCER_EPOCH)}  # replaced by a newer epoch
    assert older == {TP0: int(E.INVALID_PRODUCER_EPOCH)}
    # the coordinator's PRODUCER_FENCED is INVALID_PRODUCER_EPOCH to the producer
    assert newer == blocker == {TP0: int(E.INVALID_PRODUCER_EPOCH)}


def test_what_the_answer_leaves_out_of_a_transaction_is_verified() -> None:
    """Kafka's handleResponse: only the partitions answered with an error are unverified. A
    transaction the answer leaves out is answered as a request that got no answer (Kafka
    never answers its produce; the producer retries after its request timeout)."""
    async def go() -> list[dict[TopicPartition, int]]:
        coordinator = Coordinator({TP0: int(E.TRANSACTION_ABORTABLE)},
                                  unanswered=frozenset({"b"}))
        coordinator.release.set()
        m = manager(coordinator)
        answers = await asyncio.gather(m.verify_transaction("a", 1, 0, [TP0, TP1]),
                                       m.verify_transaction("b", 2, 0, [TP1]))
        await m.shutdown()
        return list(answers)

    a, b = asyncio.run(go())
    assert a == {TP0: int(E.INVALID_TXN_STATE), TP1: int(E.NONE)}
    assert b == {TP1: int(E.NETWORK_EXCEPTION)}
    assert produce_error_of_verification(b[TP1]) == E.NOT_ENOUGH_REPLICAS


def test_no_coordinator_and_retriable_errors_answer_the_produce_retriably() -> None:
    class NoTransactionTopic(OneCoordinator):
        def partition(self, tp: TopicPartition) -> object | None:
            return None

    m = AddPartitionsToTxnManager(NoTransactionTopic(), lambda txn: 0, Coordinator({}),
                                  AsyncioTasks())
    answer = asyncio.run(m.verify_transaction("a", 1, 0, [TP0]))
    assert answer == {TP0: int(E.COORDINATOR_NOT_AVAILABLE)}
    for error in (E.COORDINATOR_NOT_AVAILABLE, E.CONCURRENT_TRANSACTIONS, E.NOT_COORDINATOR,
                  E.COORDINATOR_LOAD_IN_PROGRESS, E.NETWORK_EXCEPTION):
        assert produce_error_of_verification(int(error)) == E.NOT_ENOUGH_REPLICAS
    assert produce_error_of_verification(int(E.INVALID_TXN_STATE)) == E.INVALID_TXN_STATE
