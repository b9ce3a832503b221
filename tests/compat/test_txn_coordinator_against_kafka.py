"""The transaction coordinator's answers to raw requests, on Kafka 3.9 and on tidelog (issue 17
item 5): the same error codes for a timeout beyond transaction.max.timeout.ms, EndTxn without a
transaction, AddPartitionsToTxn naming an unknown topic, stale epochs at each API's versions
before and after PRODUCER_FENCED, unknown transactional ids and producer ids, a broker that is
not the coordinator; DescribeTransactions and ListTransactions as they describe an id."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from differential import Pair, Target, coordinator, create_ready, raw

from tidelog.coordinator.offsets import partition_for
from tidelog.protocol.messages import add_offsets_to_txn as m_aot
from tidelog.protocol.messages import add_partitions_to_txn as m_apt
from tidelog.protocol.messages import describe_transactions as m_dtx
from tidelog.protocol.messages import end_txn as m_et
from tidelog.protocol.messages import find_coordinator as m_fc
from tidelog.protocol.messages import init_producer_id as m_ipi
from tidelog.protocol.messages import list_transactions as m_ltx
from tidelog.protocol.messages import txn_offset_commit as m_toc

pytestmark = [pytest.mark.integration]

# The same names on both clusters: the offsets partition of the group is part of the answers.
RUN = uuid.uuid4().hex[:8]


def add_partitions(address: str, txn: str, pid: int, epoch: int, topics: dict[str, list[int]],
                   version: int) -> list[tuple[str, int, int]]:
    r = raw(address, m_apt.AddPartitionsToTxnRequest(
        v3_and_below_transactional_id=txn, v3_and_below_producer_id=pid,
        v3_and_below_producer_epoch=epoch,
        v3_and_below_topics=[m_apt.AddPartitionsToTxnTopic(t, ps) for t, ps in topics.items()]),
        version)
    return sorted((t.name, p.partition_index, p.partition_error_code)
                  for t in r.results_by_topic_v3_and_below for p in t.results_by_partition)


def init(address: str, txn: str, timeout_ms: int = 60000, version: int = 4,
         expected: tuple[int, int] = (-1, -1)) -> m_ipi.InitProducerIdResponse:
    deadline = time.monotonic() + 30
    while True:  # an open transaction being aborted first: CONCURRENT_TRANSACTIONS, retried
        r = raw(address, m_ipi.InitProducerIdRequest(
            transactional_id=txn, transaction_timeout_ms=timeout_ms, producer_id=expected[0],
            producer_epoch=expected[1]), version)
        if r.error_code != 51 or time.monotonic() > deadline:
            return r
        time.sleep(0.2)


def settled(t: Target, txn: str, request: Callable[[str], Any]) -> tuple[str, Any]:
    """(coordinator, answer) once the coordinator of `txn` answers as such: a new
    __transaction_state is loading (COORDINATOR_LOAD_IN_PROGRESS) or still moving
    (NOT_COORDINATOR) for a while on both clusters."""
    deadline = time.monotonic() + 60
    while True:
        at = coordinator(t, txn, key_type=1)
        r = request(at)
        if r.error_code not in (14, 16) or time.monotonic() > deadline:
            return at, r
        time.sleep(0.3)


def scenario(t: Target) -> dict[str, Any]:
    topic = f"txn-errors-{RUN}"
    create_ready(t, topic, partitions=2)
    txn = f"tx-{RUN}"
    out: dict[str, Any] = {}
    at, first = settled(t, txn, lambda a: init(a, txn))
    other = next(b for b in t.bootstrap.split(",") if b != at)
    fc = raw(other, m_fc.FindCoordinatorRequest(key="", key_type=1), 3)
    out["FindCoordinator empty transactional id"] = fc.error_code
    out["InitProducerId timeout beyond transaction.max.timeout.ms"] = init(
        at, txn, timeout_ms=900_001).error_code
    out["InitProducerId timeout 0"] = init(at, txn, timeout_ms=0).error_code
    out["InitProducerId at a broker that is not the coordinator"] = init(other, txn).error_code
    out["EndTxn unknown transactional id"] = settled(t, f"{txn}-unknown", lambda a: raw(
        a, m_et.EndTxnRequest(transactional_id=f"{txn}-unknown", producer_id=1,
                              producer_epoch=0, committed=True), 3))[1].error_code
    pid, epoch = first.producer_id, first.producer_epoch
    out["InitProducerId"] = (first.error_code, epoch)
    out["EndTxn without a transaction"] = raw(at, m_et.EndTxnRequest(
        transactional_id=txn, producer_id=pid, producer_epoch=epoch, committed=True), 3).error_code
    out["AddPartitionsToTxn unknown topic"] = add_partitions(
        at, txn, pid, epoch, {topic: [0], f"{topic}-missing": [0]}, 3)
    out["AddPartitionsToTxn unknown partition"] = add_partitions(at, txn, pid, epoch,
                                                                 {topic: [0, 7]}, 3)
    out["AddPartitionsToTxn wrong producer id"] = add_partitions(at, txn, pid + 1, epoch,
                                                                 {topic: [0]}, 3)
    out["AddPartitionsToTxn"] = add_partitions(at, txn, pid, epoch, {topic: [0, 1]}, 3)
    out["AddOffsetsToTxn"] = raw(at, m_aot.AddOffsetsToTxnRequest(
        transactional_id=txn, producer_id=pid, producer_epoch=epoch, group_id=f"g-{txn}"),
        3).error_code
    out["TxnOffsetCommit unknown topic"] = [
        (tp.name, p.error_code) for tp in raw(coordinator(t, f"g-{txn}"), m_toc.TxnOffsetCommitRequest(
            transactional_id=txn, group_id=f"g-{txn}", producer_id=pid, producer_epoch=epoch,
            topics=[m_toc.TxnOffsetCommitRequestTopic(f"{topic}-missing", [
                m_toc.TxnOffsetCommitRequestPartition(0, 5)])]), 3).topics for p in tp.partitions]
    # An unknown id of the same __transaction_state partition: this coordinator's to answer.
    unknown = next(f"{txn}-no{i}" for i in range(10_000)
                   if partition_for(f"{txn}-no{i}", 50) == partition_for(txn, 50))
    described = raw(at, m_dtx.DescribeTransactionsRequest(transactional_ids=[txn, unknown]), 0)
    out["DescribeTransactions"] = [
        (s.error_code, s.transaction_state, s.transaction_timeout_ms, s.producer_epoch,
         sorted((d.topic, tuple(sorted(d.partitions))) for d in s.topics))
        for s in described.transaction_states]
    listed = raw(at, m_ltx.ListTransactionsRequest(state_filters=["Ongoing", "Bogus"],
                                                   producer_id_filters=[pid]), 0)
    out["ListTransactions"] = (listed.error_code, listed.unknown_state_filters,
                               [(s.transactional_id == txn, s.transaction_state)
                                for s in listed.transaction_states])
    # A new instance fences the first: it aborts the open transaction first.
    second = init(at, txn)
    out["InitProducerId while a transaction is open"] = (second.error_code, second.producer_epoch
                                                         - epoch)
    for api, version in (("AddPartitionsToTxn", 1), ("AddPartitionsToTxn", 3)):
        out[f"{api} v{version} stale epoch"] = add_partitions(at, txn, pid, epoch,
                                                               {topic: [0]}, version)
    for version in (1, 3):
        out[f"EndTxn v{version} stale epoch"] = raw(at, m_et.EndTxnRequest(
            transactional_id=txn, producer_id=pid, producer_epoch=epoch, committed=True),
            version).error_code
    out["InitProducerId v3 stale expected epoch"] = init(at, txn, version=3,
                                                         expected=(pid, epoch)).error_code
    out["InitProducerId v4 stale expected epoch"] = init(at, txn, version=4,
                                                         expected=(pid, epoch)).error_code
    out["AddOffsetsToTxn v1 stale epoch"] = raw(at, m_aot.AddOffsetsToTxnRequest(
        transactional_id=txn, producer_id=pid, producer_epoch=epoch, group_id="g"), 1).error_code
    return out


def test_transaction_coordinator_errors_are_kafkas(pair: Pair) -> None:
    on_kafka, on_tidelog = pair.run(scenario)
    differing = {k: (on_kafka[k], on_tidelog.get(k)) for k in on_kafka
                 if on_kafka[k] != on_tidelog.get(k)}
    assert not differing, differing
    # The oracle answered what the steps claim.
    assert on_kafka["EndTxn without a transaction"] == 48  # INVALID_TXN_STATE
    assert on_kafka["InitProducerId timeout beyond transaction.max.timeout.ms"] == 50
    assert on_kafka["AddPartitionsToTxn v3 stale epoch"][0][2] == 90  # PRODUCER_FENCED
    assert on_kafka["AddPartitionsToTxn v1 stale epoch"][0][2] == 47  # INVALID_PRODUCER_EPOCH
