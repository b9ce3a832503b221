"""Random runs: many seeds with every fault kind, invariants after every event, and replay.

The sweep is sized by TIDELOG_SIM_SEEDS (default 200) and TIDELOG_SIM_STEPS (default 2000).
"""

from __future__ import annotations

import os

import pytest

from tidelog.sim.faults import ALL_FAULTS, DEFAULT_FAULTS
from tidelog.sim.runner import run_seed

SEEDS = int(os.environ.get("TIDELOG_SIM_SEEDS", "200"))
STEPS = int(os.environ.get("TIDELOG_SIM_STEPS", "2000"))
CHUNK = 25


@pytest.mark.parametrize("first", range(0, SEEDS, CHUNK))
def test_random_seeds_keep_every_invariant(first: int) -> None:
    failures = []
    for seed in range(first, min(first + CHUNK, SEEDS)):
        summary = run_seed(seed, STEPS)
        assert summary.events >= STEPS
        if not summary.ok:
            failures.append(summary.report())
    assert not failures, "\n\n".join(failures)


def test_random_runs_exercise_the_faults_and_the_protocol() -> None:
    totals: dict[str, int] = {}
    elections = shrinks = expands = acked = 0
    for seed in range(20):  # enough for the kinds drawn only in some runs (alter_log_dirs)
        s = run_seed(1000 + seed, STEPS)
        for k, v in s.faults.items():
            totals[k] = totals.get(k, 0) + v
        elections += s.elections
        shrinks += s.isr_shrinks
        expands += s.isr_expands
        acked += s.acked
    assert set(totals) == set(DEFAULT_FAULTS)
    assert elections > 10 and shrinks > 0 and expands > 0 and acked > 100


def test_same_seed_same_trace_other_seed_other_trace() -> None:
    a = run_seed(42, 1500)
    b = run_seed(42, 1500)
    c = run_seed(43, 1500)
    assert a.trace_digest == b.trace_digest and a.events == b.events
    assert a.trace_digest != c.trace_digest


def test_larger_clusters_and_several_partitions() -> None:
    for seed in range(3):
        s = run_seed(500 + seed, STEPS, brokers=5, partitions=3)
        assert s.ok, s.report()


def test_without_faults_nothing_is_lost_and_everything_converges() -> None:
    s = run_seed(7, STEPS, faults=())
    # (48 acked at 2,000 steps since the brokers run no isr-change-propagation task: the
    # seed's draws changed; 44-98 over seeds 1-10)
    assert s.ok and s.faults == {} and s.acked > 40 and s.lost == 0


def test_replay_is_identical_across_processes_and_hash_seeds() -> None:
    import subprocess
    import sys

    code = ("from tidelog.sim.runner import run_seed; "
            "print(run_seed(11, 1200, brokers=5, partitions=3).trace_digest)")
    digests = set()
    for hash_seed in ("1", "2"):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env={**os.environ, "PYTHONHASHSEED": hash_seed}, timeout=120,
                             check=True)
        digests.add(out.stdout.strip())
    assert len(digests) == 1
    assert digests == {run_seed(11, 1200, brokers=5, partitions=3).trace_digest}


def test_random_runs_find_the_naive_truncation_rule_unscripted() -> None:
    from tidelog.sim.runner import naive_config

    config = naive_config("truncate_to_hw")
    found = None
    for seed in range(40):
        s = run_seed(seed, 3000, config=config)
        if s.violations:
            found = s
            break
    assert found is not None, "40 random seeds with truncate-to-HW and no violation"
    kinds = {v.invariant for v in found.violations}
    assert kinds & {"ValidHighWatermark", "NoAckedLoss", "ConsumedStable", "StrongIsr"}


# Seeds that once exposed a bug in the simulator's shell or model, kept as regressions (with the
# fault kinds of their time, so that they replay as closely as the code allows):
# 244 (a restarted broker served requests meant for its previous registration), 170/1086
# (lossy-crash exemption judged against the wrong leader), 9 (exemption ended too early),
# 13 with 2 brokers (KIP-966 marks forgotten by a controller failover), 8151 (a broker whose
# registration answer was lost never knew its new broker epoch: own-session NODE_EXISTS).
# Controller bugs found by the lifecycle faults: 256 (a reassignment's topic znode write dropped
# a partition just added), 487 at 5000 steps (a replaced move deleted its adding replica, the
# leader and only ISR member; re-added, it was elected with an empty log). Replication: 93 (a
# leader of an epoch it never wrote in, then a follower, asked about that epoch forever).
_NINE = ALL_FAULTS[:9]  # before the controller-failover and disk faults existed
REGRESSIONS = [(244, 3000, 3, 1, _NINE), (170, 3000, 3, 1, _NINE), (1086, 3000, 5, 3, _NINE),
               (9, 2000, 3, 1, _NINE), (13, 2000, 2, 1, ALL_FAULTS[:10]),
               (8151, 3000, 3, 1, ALL_FAULTS[:11]), (256, 2000, 3, 1, ALL_FAULTS[:14]),
               (487, 5000, 3, 1, ALL_FAULTS[:14]), (93, 2000, 3, 1, ALL_FAULTS[:14])]


@pytest.mark.parametrize(("seed", "steps", "brokers", "partitions", "faults"), REGRESSIONS)
def test_regression_seeds(seed: int, steps: int, brokers: int, partitions: int,
                          faults: tuple[str, ...]) -> None:
    s = run_seed(seed, steps, brokers=brokers, partitions=partitions, faults=faults)
    assert s.ok, s.report()


def test_varied_timing_keeps_the_fetch_wait_within_the_lag_time() -> None:
    # As the broker's config requires: seed 70 drew a 500 ms fetch wait with a 300 ms lag time,
    # and after the heal the idle followers left and rejoined the ISR forever (never converged).
    from tidelog.sim.runner import varied_config

    for seed in range(400):
        rep = varied_config(seed).replication
        assert rep.replica_fetch_wait_max_ms <= rep.replica_lag_time_max_ms, seed
    s = run_seed(70, 3000, config=varied_config(70), brokers=4, partitions=1)
    assert s.ok, s.report()


def test_regression_a_cancelled_move_that_deleted_an_in_sync_replica_counts_as_a_lost_copy(
        ) -> None:
    # Seed 108 (varied, 3000 steps): record 82 was acked with ISR [1, 2], 2 being added by a
    # move; the cancellation deleted 2 (as Kafka's controllers do), and the injector then let
    # broker 1, the last copy, lose power: outside NoAckedLoss's precondition.
    from tidelog.sim.runner import varied_config

    s = run_seed(108, 3000, config=varied_config(108), brokers=3, partitions=1)
    assert s.ok, s.report()


@pytest.mark.parametrize("first", range(0, 30, 10))
def test_random_seeds_with_varied_timing_and_cluster_shapes(first: int) -> None:
    # Lag time, session timeout, fetch wait, link latency, checkpoint and page-cache intervals
    # drawn from the seed; 3-5 brokers, 1-2 partitions. (Seed 5 once found a controller bug:
    # a new partition whose replicas were all down at creation never came online.)
    from tidelog.sim.runner import varied_config

    failures = []
    for seed in range(first, first + 10):
        s = run_seed(seed, STEPS, config=varied_config(seed), brokers=3 + seed % 3,
                     partitions=1 + seed % 2)
        if not s.ok:
            failures.append(s.report())
    assert not failures, "\n\n".join(failures)


def test_random_runs_with_failing_disks() -> None:
    for seed in range(8):
        s = run_seed(seed, STEPS, faults=ALL_FAULTS, partitions=2)
        assert s.ok, s.report()
        assert set(s.faults) <= set(ALL_FAULTS)



def test_unclean_election_runs_still_converge() -> None:
    from tidelog.sim.runner import UNCLEAN_ALLOWED, unclean_config

    unclean = 0
    # Seeds 0-11: since AlterPartition has its own channel to the controller, faulty in random
    # runs, the draws moved and of these only seed 11 elects uncleanly (0-7 did before).
    for seed in range(12):
        s = run_seed(seed, 3000, config=unclean_config(), partitions=1 + seed % 2,
                     allowed=UNCLEAN_ALLOWED)
        assert s.ok, s.report()
        unclean += s.unclean_elections
    assert unclean > 0  # the runs did elect replicas outside the ISR


def test_regression_a_broker_stopped_after_the_heal_is_brought_back() -> None:
    # Varied seed 16: a controlled shutdown's final stop landed after the heal; the end check
    # then missed the one intact copy of acked records.
    from tidelog.sim.runner import varied_config

    s = run_seed(16, 3000, faults=ALL_FAULTS, config=varied_config(16), brokers=4)
    assert s.ok, s.report()


def test_consumers_never_see_the_hw_go_back_and_the_check_catches_kafkas_fetch() -> None:
    """Seed 19 (seed 4 before a started broker's UpdateMetadata went before its LeaderAndIsr,
    seed 2 before leaders sent AlterPartition: each changed the runs' draws): a leader change
    where the new leader's HW starts below the one consumers saw.
    With the consumer HW guard the run is clean; with Kafka's Fetch (no guard) the strict
    MonotonicHighWatermark check of DESIGN.md fails."""
    from dataclasses import replace

    from tidelog.sim.cluster import SimConfig

    base = SimConfig()
    kafka_fetch = replace(base, replication=replace(base.replication, consumer_hw_guard=False))
    # The fault kinds of its time (the lifecycle faults came later and change the schedule).
    kinds = ALL_FAULTS[:11]
    assert run_seed(19, 3000, config=base, trace=False, faults=kinds).ok
    naive = run_seed(19, 3000, config=kafka_fetch, trace=False, faults=kinds)
    assert [v.invariant for v in naive.violations] == ["MonotonicHighWatermark"]
