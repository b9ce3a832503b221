"""transaction.partition.verification.enable in the simulator (KIP-890): a per-seed setting of the
transactional runs. On, a zombie's late produce is refused by the coordinator it is verified
with; off, the leader appends it as a transaction no coordinator knows, which hangs (the LSO
held below the HW) or is committed by a later marker of its producer id: the transactional
invariants catch both."""

from __future__ import annotations

import logging

import pytest

from tidelog.protocol.records.builder import build_values
from tidelog.sim.cluster import SimCluster, SimConfig
from tidelog.sim.messages import CLIENT_BASE, ProduceRequest, ProduceResponse
from tidelog.sim.runner import VERIFICATION_OFF_ALLOWED, run_seed, runs_txn_verification

INVALID_TXN_STATE = 48


@pytest.fixture(autouse=True)
def _quiet() -> None:
    logging.getLogger("tidelog").setLevel(logging.CRITICAL)


@pytest.mark.parametrize("verification", [True, False])
def test_a_late_produce_after_the_transaction_ended_hangs_only_without_verification(
        verification: bool) -> None:
    """The same late batch (the producer's epoch and next sequence, after its last EndTxn):
    verified, refused with INVALID_TXN_STATE and every LSO reaches its HW; unverified,
    appended as the first batch of a transaction no coordinator ends, and the end of the run
    reports it (TransactionsDecided: the partition is never read to its end)."""
    cluster = SimCluster(SimConfig(seed=11, partitions=2, transactions=True,
                                   transaction_partition_verification_enable=verification))
    cluster.start()
    txn = cluster.txn
    assert txn is not None
    txn.start(producers=1)
    producer = txn.producers[0]
    producer.stall_share = 0.0
    cluster.run_for(3000)
    txn.stop()
    for _ in range(100):
        if not producer.busy:
            break
        cluster.run_for(100)
    assert producer.phase == "idle" and producer.stats.committed + producer.stats.aborted > 0
    tp = sorted(cluster.tps, key=producer.next_sequence)[-1]  # a partition it wrote to
    assert producer.next_sequence(tp) > 0
    leader, _ = cluster.leader_of(tp)
    late_node = CLIENT_BASE + 9000
    answers: list[ProduceResponse] = []
    cluster.network.register(late_node, lambda src, msg: answers.append(msg))
    late = bytes(build_values([b"late"], now_ms=cluster.scheduler.now_ms,
                              producer_id=producer.producer_id,
                              producer_epoch=producer.producer_epoch,
                              base_sequence=producer.next_sequence(tp), transactional=True))
    cluster.network.send(late_node, leader, ProduceRequest(1, -1, 1500, tp, late,
                                                           producer.transactional_id))
    for _ in range(50):
        if answers:
            break
        cluster.run_for(100)
    assert len(answers) == 1
    part = cluster.acting_leader(tp).partition(tp)  # type: ignore[union-attr]
    violations = txn.finish(max_ms=6000)
    if verification:
        assert answers[0].error == INVALID_TXN_STATE
        assert violations == [] and part.last_stable_offset == part.high_watermark
    else:
        assert answers[0].error == 0
        assert part.last_stable_offset == answers[0].base_offset < part.high_watermark
        assert {v.invariant for v in violations} == {"TransactionsDecided"}
        assert any(str(tp) in v.detail for v in violations)


def test_with_verification_off_a_zombies_late_produce_is_read_and_the_invariant_fails() -> None:
    """Seed 147 (3,000 steps; seed 3 before a controller failover loaded every registered
    broker before deciding, seed 27 before leaders sent AlterPartition: each changed the runs'
    draws): a restart's zombie sends a batch right after the new instance got
    its epoch. Verification off: the leader, whose log had not seen the new epoch, appends it
    and the new instance's COMMIT marker makes it visible — NoAbortedRead fails (allowed in such
    a run, which therefore still passes). Verification on: the coordinator refuses it and no
    invariant fails."""
    off = run_seed(147, 3000, transactions=True, txn_verification=False)
    assert off.txn_verification is False and off.late_produces == 1 and off.late_appended == 1
    failed = {v.invariant for v in off.violations}
    assert "NoAbortedRead" in failed and failed <= set(VERIFICATION_OFF_ALLOWED)
    assert off.ok and set(VERIFICATION_OFF_ALLOWED) <= set(off.allowed)
    on = run_seed(147, 3000, transactions=True, txn_verification=True)
    assert on.txn_verification is True and on.late_produces == 1 and on.late_appended == 0
    assert on.violations == [] and on.ok and on.allowed == ()


def test_verification_is_a_per_seed_choice_recorded_in_the_trace_and_the_summary() -> None:
    choices = [runs_txn_verification(s) for s in range(3, 400, 4)]
    assert 0.15 < choices.count(False) / len(choices) < 0.35
    off_seed = next(s for s in range(3, 400, 4) if not runs_txn_verification(s))
    s = run_seed(off_seed, 300, full_trace=True)
    assert s.txn_verification is False and "NoAbortedRead" in s.allowed
    assert any("transaction.partition.verification.enable" in line and "False" in line
               for line in s.trace_tail)
    plain = run_seed(off_seed - 1, 300)  # no transactions: no setting
    assert plain.txn_verification is None and "NoAbortedRead" not in plain.allowed


def test_transactional_seeds_run_with_two_log_dirs_too() -> None:
    """One seed in three has two log dirs per broker, independently of the transactional one
    in four: seeds 7, 19, 31, ... run both (`__transaction_state` replicas among those moved
    between dirs)."""
    from tidelog.sim.runner import runs_jbod, runs_transactions

    both = [s for s in range(48) if runs_transactions(s, None) and runs_jbod(s, None)]
    assert both == [7, 19, 31, 43]
    s = run_seed(43, 3000, full_trace=True)
    assert s.log_dirs == 2 and s.txn_verification is not None and s.committed > 0
    assert s.ok, s.report()
    moves = [line for line in s.trace_tail if "alter_log_dirs" in line]
    assert any("__transaction_state" in line and "error=0" in line for line in moves)
