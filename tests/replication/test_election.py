"""Leader election rules: clean, unclean, preferred, controlled shutdown, KIP-966 candidates."""

from __future__ import annotations

from tidelog.replication.election import (
    ElectionResult,
    controlled_shutdown_leader_election,
    offline_partition_leader_election,
    preferred_replica_leader_election,
    remove_replica_from_isr,
)
from tidelog.replication.types import NO_LEADER


def test_clean_election_picks_the_first_live_isr_member_in_assignment_order() -> None:
    result = offline_partition_leader_election([3, 1, 2], isr={1, 2}, live_brokers={1, 2}, unclean_enabled=False)
    assert result == ElectionResult(1, (1, 2))
    result = offline_partition_leader_election([3, 1, 2], isr={1, 2, 3}, live_brokers={2, 3}, unclean_enabled=False)
    assert result == ElectionResult(3, (3, 2))


def test_no_live_isr_member_means_no_leader_unless_unclean_is_enabled() -> None:
    clean = offline_partition_leader_election([1, 2, 3], isr={1}, live_brokers={2, 3}, unclean_enabled=False)
    assert clean.leader is None and not clean.ok and clean.isr == (1,)
    unclean = offline_partition_leader_election([1, 2, 3], isr={1}, live_brokers={3, 2}, unclean_enabled=True)
    assert unclean == ElectionResult(2, (2,), unclean=True)


def test_a_replica_back_from_an_unclean_shutdown_is_not_a_clean_candidate() -> None:
    # KIP-966: 2 restarted after losing its unflushed tail; 0 and 1 are out of the ISR.
    result = offline_partition_leader_election(
        [0, 1, 2], isr={2}, live_brokers={0, 1, 2}, unclean_enabled=False, not_clean_candidates={2}
    )
    assert result.leader is None
    with_other = offline_partition_leader_election(
        [2, 0, 1], isr={0, 2}, live_brokers={0, 1, 2}, unclean_enabled=False, not_clean_candidates={2}
    )
    assert with_other == ElectionResult(0, (0,))
    last_resort = offline_partition_leader_election(
        [0, 1, 2], isr={2}, live_brokers={2}, unclean_enabled=True, not_clean_candidates={2}
    )
    assert last_resort == ElectionResult(2, (2,), unclean=True)


def test_preferred_replica_election_needs_the_first_replica_live_and_in_sync() -> None:
    assert preferred_replica_leader_election([2, 1, 3], {1, 2, 3}, {1, 2, 3}) == ElectionResult(2, (2, 1, 3))
    assert preferred_replica_leader_election([2, 1, 3], {1, 3}, {1, 2, 3}).leader is None
    assert preferred_replica_leader_election([2, 1, 3], {1, 2}, {1, 3}).leader is None


def test_controlled_shutdown_moves_leadership_off_the_broker_and_shrinks_it_out() -> None:
    result = controlled_shutdown_leader_election([1, 2, 3], isr={1, 2, 3}, live_brokers={1, 2, 3}, shutting_down={1})
    assert result == ElectionResult(2, (2, 3))
    alone = controlled_shutdown_leader_election([1, 2, 3], isr={1}, live_brokers={1, 2, 3}, shutting_down={1})
    assert alone.leader is None  # no other in-sync replica: the broker keeps it until it stops


def test_removing_a_dead_replica_from_the_isr() -> None:
    assert remove_replica_from_isr(1, (1, 2, 3), 3) == (1, (1, 2))
    assert remove_replica_from_isr(1, (1, 2, 3), 1) == (NO_LEADER, (2, 3))
    # the last member stays, so the replica with the latest data remains electable
    assert remove_replica_from_isr(1, (1,), 1) == (NO_LEADER, (1,))
