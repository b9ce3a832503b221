"""Transactions in the simulator: the one transaction coordinator on virtual time (sim/tasks.py,
sim/txn_node.py), transactional producers and read_committed consumers (sim/client.py,
sim/txn_workload.py) and the exactly-once checks over them (sim/txn_invariants.py): commits
and aborts end to end, a coordinator killed with a PrepareCommit in its log completed by its
successor, a restarted producer fencing its zombie, the timeout abort, random seeds (a late
produce after its transaction ended, with and without KIP-890's verification:
test_sim_txn_verification.py)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from tidelog.coordinator.transaction.marker_channel import TransactionMarkerChannel
from tidelog.coordinator.transaction.metadata import TransactionState
from tidelog.protocol.errors import ErrorCode
from tidelog.protocol.topic_partition import TopicPartition
from tidelog.sim.cluster import SimCluster, SimConfig
from tidelog.sim.runner import run_seed, runs_transactions
from tidelog.sim.tasks import SimFuture, SimTasks


@pytest.fixture(autouse=True)
def _quiet() -> None:
    # Faults make the brokers log their disk errors; the runs below do not need them.
    logging.getLogger("tidelog").setLevel(logging.CRITICAL)


class _Process:
    """A Scheduler over the simulator's clock, as a node's ProcessScheduler."""

    def __init__(self, cluster: SimCluster) -> None:
        self.scheduler = cluster.scheduler

    def milliseconds(self) -> int:
        return self.scheduler.now_ms

    def schedule(self, name: str, fn: object, delay_ms: int, period_ms: int = -1) -> object:
        return self.scheduler.schedule(delay_ms, fn)


def test_coroutines_run_on_virtual_time_and_resume_in_an_event_of_their_own() -> None:
    cluster = SimCluster(SimConfig(seed=1))
    tasks = SimTasks(_Process(cluster))  # type: ignore[arg-type]
    fut = SimFuture()
    seen: list[tuple[str, int]] = []

    async def sleeper() -> None:
        await tasks.sleep(30)
        seen.append(("slept", cluster.scheduler.now_ms))
        got = await tasks.gather([fut, tasks.sleep(5)])
        seen.append((f"gathered {got}", cluster.scheduler.now_ms))

    async def failing() -> None:
        try:
            await fut2
        except KeyError as e:
            seen.append((f"raised {e}", cluster.scheduler.now_ms))

    fut2 = SimFuture()
    tasks.spawn(sleeper())
    tasks.spawn(failing())
    cluster.scheduler.run_until(40)
    assert seen == [("slept", 30)]
    fut.set_result(7)
    # Completing a future never runs its waiter inside the caller's frame.
    assert seen == [("slept", 30)]
    fut2.set_exception(KeyError("x"))
    cluster.scheduler.run_until(50)
    assert seen == [("slept", 30), ("raised 'x'", 40), ("gathered [7, None]", 40)]


def transactional_cluster(seed: int, **workload: object) -> SimCluster:
    cluster = SimCluster(SimConfig(seed=seed, partitions=2, transactions=True))
    cluster.start()
    assert cluster.txn is not None
    cluster.txn.start(**workload)  # type: ignore[arg-type]
    return cluster


def test_transactions_commit_and_abort_and_a_read_committed_reader_sees_only_commits() -> None:
    cluster = transactional_cluster(3)
    txn = cluster.txn
    assert txn is not None
    cluster.run_for(8000)
    assert txn.finish() == []
    assert cluster.checker.violations == []
    ledger = txn.ledger
    assert len(ledger.committed) >= 10 and len(ledger.aborted) >= 2
    committed_records = sum(n for t in ledger.committed for n in ledger.written[t].values())
    assert sum(c.records_read for c in txn.consumers) == committed_records
    # Each data partition carries markers: the records are transactional, the LSO at the HW.
    for tp in cluster.tps:
        part = cluster.acting_leader(tp).partition(tp)  # type: ignore[union-attr]
        assert part.last_stable_offset == part.high_watermark > 0


def test_a_coordinator_killed_after_prepare_commit_is_completed_by_its_successor() -> None:
    cluster = transactional_cluster(5, producers=1)
    txn = cluster.txn
    assert txn is not None
    tid = "txn-0"
    killed = None
    for _ in range(200_000):
        cluster.scheduler.step()
        node = cluster.node(txn.coordinator_of(tid))
        if node is None or node.txn is None:
            continue
        md = node.txn.coordinator.state.transactions.get(tid)
        if md is not None and md.state == TransactionState.PREPARE_COMMIT:
            # PrepareCommit is in the log (acknowledged); CompleteCommit is not.
            killed = (node.broker_id, md.producer_id)
            node.stop("kill")
            break
    assert killed is not None
    in_flight = txn.producers[0].txn
    cluster.run_for(3000)
    cluster.heal()
    assert cluster.settle()
    assert txn.finish() == []
    assert cluster.checker.violations == []
    assert in_flight in txn.ledger.committed
    # The successor loaded the partition and wrote the completion.
    coordinator = cluster.node(txn.coordinator_of(tid))
    assert coordinator is not None and coordinator.txn is not None
    md = coordinator.txn.coordinator.state.transactions[tid]
    assert md.producer_id == killed[1]
    assert md.state in (TransactionState.COMPLETE_COMMIT, TransactionState.COMPLETE_ABORT,
                        TransactionState.EMPTY)
    # Every record of the in-flight transaction was read once.
    seen = {tp: txns.get(in_flight) for tp, txns in txn.ledger.seen.items()}
    for tp, count in txn.ledger.written[in_flight].items():
        got = seen.get(tp)
        assert got is not None and len(got) == count
        assert all(len(offsets) == 1 for offsets in got.values())


def test_a_restarted_producer_fences_its_zombie() -> None:
    cluster = transactional_cluster(7, producers=1)
    txn = cluster.txn
    assert txn is not None
    cluster.run_for(2000)
    zombie = txn.producers[0]
    fresh = txn.restart()
    assert fresh is not None and fresh.transactional_id == zombie.transactional_id
    cluster.run_for(3000)
    assert zombie.phase == "fenced"
    assert fresh.producer_id == zombie.producer_id
    assert fresh.producer_epoch > zombie.producer_epoch
    assert fresh.stats.committed > 0
    assert txn.finish() == []
    assert cluster.checker.violations == []


def test_a_transaction_left_open_past_its_timeout_is_aborted_and_never_read() -> None:
    cluster = transactional_cluster(9, producers=1)
    txn = cluster.txn
    assert txn is not None
    stalled = txn.producers[0]
    stalled.stall_share = 1.0
    cluster.run_for(3 * txn.transaction_timeout_ms + 2000)  # the stall: twice the timeout
    # The coordinator aborted the first transaction under a bumped epoch: its EndTxn was
    # refused, the producer fenced and restarted.
    assert stalled.phase == "fenced" and stalled.stats.committed == 0
    first = (stalled.transactional_id, 1)
    assert first in txn.ledger.written
    txn.producers[-1].stall_share = 0.0
    assert txn.finish() == []
    assert cluster.checker.violations == []
    assert not any(txns.get(first) for txns in txn.ledger.seen.values())


def test_one_seed_in_four_runs_transactions_but_never_with_unclean_election() -> None:
    from tidelog.sim.runner import unclean_config

    assert [s for s in range(8) if runs_transactions(s, None)] == [3, 7]
    assert not runs_transactions(3, unclean_config())


@pytest.mark.parametrize("first", [3, 83])
def test_random_transactional_seeds_keep_every_invariant(first: int) -> None:
    failures = []
    committed = 0
    for seed in range(first, first + 80, 4):
        s = run_seed(seed, 4000)
        committed += s.committed
        if not s.ok:
            failures.append(s.report())
    assert not failures, "\n\n".join(failures)
    assert committed > 100


def test_a_run_whose_marker_is_refused_by_a_leader_not_hosting_the_partition_yet_commits(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Found on seed 131: a crash aimed at a coordinator; the COMMIT marker for t-0 went to a
    # broker that did not host t-0 yet, whose UNKNOWN_TOPIC_OR_PARTITION the marker channel took
    # for a deleted topic: CompleteCommit was written without the marker, and the producer's
    # next epoch bump aborted the committed records (CommittedExactlyOnce: 0 of 2 records read).
    # Since the simulator's AlterPartition channel became faulty (40a6df1) every seed draws
    # differently and no transactional seed of 0-4,000 at 2,000 steps fails under the old rule
    # any more (the rule itself: tests/coordinator/test_marker_channel.py,
    # test_a_leader_not_hosting_the_partition_yet_is_asked_again). Seed 103 still has a marker
    # answered UNKNOWN_TOPIC_OR_PARTITION (counted here) in a run that commits and keeps every
    # invariant.
    refused: list[TopicPartition] = []
    send = TransactionMarkerChannel._send

    async def counting_send(self: TransactionMarkerChannel, *args: Any) -> dict[TopicPartition, int]:
        answer = await send(self, *args)
        refused.extend(tp for tp, e in answer.items() if e == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        return answer

    monkeypatch.setattr(TransactionMarkerChannel, "_send", counting_send)
    s = run_seed(103, 2000)
    assert s.ok, s.report()
    assert refused
    assert s.committed > 0
