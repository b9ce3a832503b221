"""KIP-890 part 1 (transaction.partition.verification.enable, on by default in Kafka 3.9) on
Kafka and on tidelog, with raw requests: a transactional produce to a partition its transaction
never added is refused with the same error at old and new Produce versions; a zombie's late
produce after its transaction was aborted is refused and leaves no hanging transaction (the
last stable offset reaches the high watermark); AddPartitionsToTxn v4 verify_only gives the
same answers (in the transaction, not in it, another epoch, an unknown transactional id); with
the config turned off (a dynamic cluster default) the produce is appended as before. A
TxnOffsetCommit is verified too: refused until AddOffsetsToTxn added the group's offsets
partition to the transaction. A produce of transactional batches without a transactional id
is refused whole, nothing appended."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

import pytest
from differential import Pair, Target, coordinator, create_ready, leader_address, raw
from test_txn_coordinator_against_kafka import init, settled

from tidelog.protocol.messages import add_offsets_to_txn as m_aot
from tidelog.protocol.messages import add_partitions_to_txn as m_apt
from tidelog.protocol.messages import describe_transactions as m_dtx
from tidelog.protocol.messages import end_txn as m_et
from tidelog.protocol.messages import incremental_alter_configs as m_iac
from tidelog.protocol.messages import list_offsets as m_lo
from tidelog.protocol.messages import produce as m_produce
from tidelog.protocol.messages import txn_offset_commit as m_toc
from tidelog.protocol.records.builder import Record, build_batch

pytestmark = [pytest.mark.integration]

RUN = uuid.uuid4().hex[:8]


def txn_produce(address: str, txn: str | None, topic: str, partition: int, pid: int, epoch: int,
                seq: int, version: int = 9) -> int:
    batch = build_batch([Record(value=b"v%d" % seq)], producer_id=pid, producer_epoch=epoch,
                        base_sequence=seq, transactional=True)
    r = raw(address, m_produce.ProduceRequest(
        transactional_id=txn, acks=-1, timeout_ms=10000, topic_data=[m_produce.TopicProduceData(
            topic, [m_produce.PartitionProduceData(partition, bytes(batch))])]), version)
    return int(r.responses[0].partition_responses[0].error_code)


def offsets(address: str, topic: str, partition: int) -> tuple[int, int]:
    """(last stable offset, high watermark)."""
    def latest(isolation: int) -> int:
        r = raw(address, m_lo.ListOffsetsRequest(replica_id=-1, isolation_level=isolation,
                                                 topics=[m_lo.ListOffsetsTopic(topic, [
                                                     m_lo.ListOffsetsPartition(partition_index=partition, timestamp=-1)])]),
                4)
        return int(r.topics[0].partitions[0].offset)
    return latest(1), latest(0)


def verify(address: str, txns: list[tuple[str, int, int, dict[str, list[int]]]]
           ) -> list[tuple[str, str, int, int]]:
    r = raw(address, m_apt.AddPartitionsToTxnRequest(transactions=[
        m_apt.AddPartitionsToTxnTransaction(
            transactional_id=txn, producer_id=pid, producer_epoch=epoch, verify_only=True,
            topics=[m_apt.AddPartitionsToTxnTopic(t, ps) for t, ps in topics.items()])
        for txn, pid, epoch, topics in txns]), 4)
    return sorted((res.transactional_id, t.name, p.partition_index, p.partition_error_code)
                  for res in r.results_by_transaction for t in res.topic_results
                  for p in t.results_by_partition)


def add(address: str, txn: str, pid: int, epoch: int, topic: str, partitions: list[int]) -> int:
    r = raw(address, m_apt.AddPartitionsToTxnRequest(
        v3_and_below_transactional_id=txn, v3_and_below_producer_id=pid,
        v3_and_below_producer_epoch=epoch,
        v3_and_below_topics=[m_apt.AddPartitionsToTxnTopic(topic, partitions)]), 3)
    return int(r.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code)


def until_state(address: str, txn: str, states: set[str]) -> str:
    deadline = time.monotonic() + 30
    while True:
        r = raw(address, m_dtx.DescribeTransactionsRequest(transactional_ids=[txn]), 0)
        state = r.transaction_states[0].transaction_state
        if state in states or time.monotonic() > deadline:
            return str(state)
        time.sleep(0.2)


def unknown_ids(t: Target, txn: str, at: str) -> tuple[str, str]:
    """Two transactional ids never used: the first coordinated by `at`, the second by another
    broker (FindCoordinator on the target, so each cluster picks its own)."""
    here: str | None = None
    elsewhere: str | None = None
    for i in range(500):
        candidate = f"{txn}-unknown-{i}"
        if coordinator(t, candidate, key_type=1) == at:
            here = here or candidate
        else:
            elsewhere = elsewhere or candidate
        if here and elsewhere:
            # The id coordinated here is answered as unknown only once its __transaction_state
            # partition has loaded there (until then COORDINATOR_LOAD_IN_PROGRESS, on both).
            settled(t, here, lambda a, x=here: raw(a, m_dtx.DescribeTransactionsRequest(
                transactional_ids=[x]), 0).transaction_states[0])
            return here, elsewhere
    raise AssertionError(f"no unknown transactional ids on both sides of {at}")


@dataclass(frozen=True)
class Txn:
    topic: str  # two partitions, 0 added to the transaction
    id: str
    coordinator: str
    producer_id: int
    epoch: int


def begin(t: Target, name: str, out: dict[str, Any]) -> Txn:
    topic = f"txn-{name}-{RUN}"
    create_ready(t, topic, partitions=2)
    txn = f"{name}-{RUN}"
    at, first = settled(t, txn, lambda a: init(a, txn))
    out["add partition 0"] = add(at, txn, first.producer_id, first.producer_epoch, topic, [0])
    return Txn(topic, txn, at, first.producer_id, first.producer_epoch)


def scenario(t: Target) -> dict[str, Any]:
    out: dict[str, Any] = {}
    x = begin(t, "verify", out)
    topic, txn, at, pid, epoch = x.topic, x.id, x.coordinator, x.producer_id, x.epoch
    leader0, leader1 = leader_address(t, topic, 0), leader_address(t, topic, 1)
    out["produce v9 to the added partition"] = txn_produce(leader0, txn, topic, 0, pid, epoch, 0)
    out["produce v9 to a partition not added"] = txn_produce(leader1, txn, topic, 1, pid, epoch, 0)
    out["produce v3 to a partition not added"] = txn_produce(leader1, txn, topic, 1, pid, epoch, 0,
                                                             version=3)
    # Unknown transactional ids, one this coordinator owns and one another broker does: which
    # ids those are depends on each cluster's __transaction_state leaders, so the answers are
    # keyed by role, not by id.
    unknown_here, unknown_elsewhere = unknown_ids(t, txn, at)
    roles = {txn: txn, unknown_here: "unknown, coordinated here",
             unknown_elsewhere: "unknown, coordinated elsewhere"}
    out["verify_only"] = sorted((roles[i], *rest) for i, *rest in verify(at, [
        (txn, pid, epoch, {topic: [0, 1]}),
        (unknown_here, pid, epoch, {topic: [0]}),
        (unknown_elsewhere, pid, epoch, {topic: [0]}),
    ]))
    out["verify_only other epoch"] = verify(at, [(txn, pid, epoch + 1, {topic: [0]})])
    out["abort"] = raw(at, m_et.EndTxnRequest(transactional_id=txn, producer_id=pid,
                                              producer_epoch=epoch, committed=False),
                       3).error_code
    out["state after abort"] = until_state(at, txn, {"CompleteAbort"})
    # The aborted markers are in; a zombie's late batch (same epoch, next sequence) would
    # start a transaction nobody ends.
    deadline = time.monotonic() + 30
    while (lso_hw := offsets(leader0, topic, 0))[0] != lso_hw[1] and time.monotonic() < deadline:
        time.sleep(0.2)
    out["zombie produce after the abort"] = txn_produce(leader0, txn, topic, 0, pid, epoch, 1)
    out["LSO == HW after the zombie"] = offsets(leader0, topic, 0)
    return out


def test_transactional_produce_to_a_partition_not_in_the_transaction(pair: Pair) -> None:
    out = pair.same(scenario)
    assert out["produce v9 to the added partition"] == 0
    assert out["produce v9 to a partition not added"] == 48  # INVALID_TXN_STATE
    assert out["produce v3 to a partition not added"] == 48
    assert out["zombie produce after the abort"] == 48
    assert out["LSO == HW after the zombie"] == (2, 2)  # v0, the ABORT marker; no hanging txn


def txn_offset_commit(t: Target, x: Txn, group: str) -> int:
    """TxnOffsetCommit v3 of offset 5 of the transaction's topic-0 for `group`, retried while
    the group's coordinator loads or moves."""
    deadline = time.monotonic() + 30
    while True:
        r = raw(coordinator(t, group), m_toc.TxnOffsetCommitRequest(
            transactional_id=x.id, group_id=group, producer_id=x.producer_id,
            producer_epoch=x.epoch, topics=[m_toc.TxnOffsetCommitRequestTopic(
                x.topic, [m_toc.TxnOffsetCommitRequestPartition(0, 5)])]), 3)
        code = int(r.topics[0].partitions[0].error_code)
        if code not in (14, 15, 16) or time.monotonic() > deadline:
            return code
        time.sleep(0.3)


def offsets_commit(t: Target) -> dict[str, Any]:
    out: dict[str, Any] = {}
    x = begin(t, "verify-offsets", out)
    group = f"g-{x.id}"
    out["TxnOffsetCommit before AddOffsetsToTxn"] = txn_offset_commit(t, x, group)
    out["AddOffsetsToTxn"] = raw(x.coordinator, m_aot.AddOffsetsToTxnRequest(
        transactional_id=x.id, producer_id=x.producer_id, producer_epoch=x.epoch,
        group_id=group), 3).error_code
    out["TxnOffsetCommit after AddOffsetsToTxn"] = txn_offset_commit(t, x, group)
    out["abort"] = raw(x.coordinator, m_et.EndTxnRequest(
        transactional_id=x.id, producer_id=x.producer_id, producer_epoch=x.epoch,
        committed=False), 3).error_code
    return out


def test_a_txn_offset_commit_is_verified(pair: Pair) -> None:
    out = pair.same(offsets_commit)
    assert out["TxnOffsetCommit before AddOffsetsToTxn"] == 48  # INVALID_TXN_STATE
    assert out["TxnOffsetCommit after AddOffsetsToTxn"] == 0


def without_transactional_id(t: Target) -> dict[str, Any]:
    topic = f"txn-no-id-{RUN}"
    create_ready(t, topic, partitions=1)
    leader = leader_address(t, topic, 0)
    return {"transactional produce without a transactional id": txn_produce(
                leader, None, topic, 0, 1000, 0, 0),
            "(LSO, HW) after it": offsets(leader, topic, 0)}


def test_transactional_records_without_a_transactional_id_are_refused(pair: Pair) -> None:
    out = pair.same(without_transactional_id)
    assert out["transactional produce without a transactional id"] == 53
    assert out["(LSO, HW) after it"] == (0, 0)


def alter_cluster_default(t: Target, value: str | None) -> int:
    """IncrementalAlterConfigs v0 of transaction.partition.verification.enable on the
    cluster-wide broker default (None: delete it)."""
    op = 0 if value is not None else 1  # SET, DELETE
    r = raw(t.bootstrap.split(",")[0], m_iac.IncrementalAlterConfigsRequest(resources=[
        m_iac.AlterConfigsResource(4, "", [m_iac.AlterableConfig(
            "transaction.partition.verification.enable", op, value)])]), 0)
    return int(r.responses[0].error_code)


def toggled_off(t: Target) -> dict[str, Any]:
    out: dict[str, Any] = {}
    x = begin(t, "verify-off", out)
    topic, txn, pid, epoch = x.topic, x.id, x.producer_id, x.epoch
    leader1 = leader_address(t, topic, 1)
    out["on: produce to a partition not added"] = txn_produce(leader1, txn, topic, 1, pid, epoch, 0)
    out["turned off"] = alter_cluster_default(t, "false")
    try:
        # Every broker applies the change when it sees it: retried until the leader has.
        deadline = time.monotonic() + 30
        while (code := txn_produce(leader1, txn, topic, 1, pid, epoch, 0)) == 48 \
                and time.monotonic() < deadline:
            time.sleep(0.2)
        out["off: produce to a partition not added"] = code
    finally:
        out["turned on"] = alter_cluster_default(t, None)
    return out


def test_with_verification_turned_off_the_produce_is_appended_as_before(pair: Pair) -> None:
    out = pair.same(toggled_off)
    assert out["on: produce to a partition not added"] == 48
    assert out["off: produce to a partition not added"] == 0
