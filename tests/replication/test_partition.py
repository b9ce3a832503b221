"""Partition: ISR shrink/expand, HW over the (maximal) ISR, acks=all checks (seeds 000, 001)."""

from __future__ import annotations

import pytest
from replication_helpers import TP, fetch, leader_partition, new_log, records, state

from tidelog.replication import Errors, Partition, ProposeIsr, ReplicationConfig, ReplicationError
from tidelog.sim.disk import MemoryFileIO


def test_leader_hw_is_the_min_leo_over_the_isr_as_followers_fetch() -> None:
    # seed 001's walk-through: append 2, followers fetch the data, then their next fetch
    # (at offset 2) tells the leader their LEO and the HW moves.
    p = leader_partition()
    p.append_records_to_leader(records(2), acks=-1, now_ms=0)
    assert (p.log_end_offset, p.high_watermark) == (2, 0)
    fetch(p, 2, 0, now_ms=1)
    fetch(p, 3, 0, now_ms=1)
    assert p.high_watermark == 0
    fetch(p, 2, 2, now_ms=2)
    assert p.high_watermark == 0  # replica 3 has not confirmed yet
    fetch(p, 3, 2, now_ms=2)
    assert p.high_watermark == 2


def test_a_single_member_isr_commits_on_append() -> None:
    p = leader_partition(isr=(1,))
    p.append_records_to_leader(records(3), acks=1, now_ms=0)
    assert p.high_watermark == 3


def test_hw_never_moves_backwards() -> None:
    p = leader_partition()
    p.append_records_to_leader(records(5), acks=1, now_ms=0)
    fetch(p, 2, 5, 1)
    fetch(p, 3, 5, 1)
    assert p.high_watermark == 5
    fetch(p, 3, 3, 2)  # a stale / reordered fetch with a lower offset
    assert p.high_watermark == 5
    assert p.maybe_increment_leader_hw() is False


def test_stuck_follower_is_shrunk_out_of_the_isr_after_the_lag_time() -> None:
    p = leader_partition(ReplicationConfig(replica_lag_time_max_ms=10_000))
    p.append_records_to_leader(records(1), acks=1, now_ms=0)
    fetch(p, 2, 1, now_ms=100)
    fetch(p, 3, 1, now_ms=100)
    # Follower 3 stops fetching; follower 2 keeps fetching at the LEO.
    for t in range(1_000, 10_200, 1_000):
        fetch(p, 2, 1, now_ms=t)
    assert p.get_out_of_sync_replicas(now_ms=10_100) == set()
    assert p.get_out_of_sync_replicas(now_ms=10_101) == {3}
    proposal = p.maybe_shrink_isr(now_ms=10_101)
    assert proposal == ProposeIsr(TP, 1, 0, (1, 2), 0, 1)
    assert p.isr == {1, 2, 3} and p.pending_isr == {1, 2}  # applied only when ZooKeeper agrees
    p.on_isr_update_result(True, 1, (1, 2))
    assert p.isr == {1, 2} and p.pending_isr is None and p.zk_version == 1


def test_slow_follower_that_never_reaches_the_leo_is_shrunk() -> None:
    p = leader_partition(ReplicationConfig(replica_lag_time_max_ms=10_000))
    leo_seen_by_3 = 0
    for t in range(0, 12_000, 500):
        # The leader gets a batch before each fetch: follower 3 always asks for what it has,
        # one batch behind the leader's LEO of the previous fetch.
        p.append_records_to_leader(records(1), acks=1, now_ms=t)
        fetch(p, 2, p.log_end_offset, now_ms=t)
        fetch(p, 3, leo_seen_by_3, now_ms=t)
        leo_seen_by_3 = max(0, p.log_end_offset - 2)
    assert p.get_out_of_sync_replicas(now_ms=11_500) == {3}


def test_follower_that_keeps_catching_up_stays_in_the_isr() -> None:
    p = leader_partition(ReplicationConfig(replica_lag_time_max_ms=10_000))
    last = 0
    for t in range(0, 60_000, 500):
        p.append_records_to_leader(records(1), acks=1, now_ms=t)
        # each fetch asks for what the previous fetch returned: it read to the LEO of its time
        fetch(p, 2, last, now_ms=t)
        fetch(p, 3, last, now_ms=t)
        last = p.log_end_offset
    assert p.maybe_shrink_isr(now_ms=60_000) is None


def test_expand_needs_leo_at_hw_and_at_the_leader_epoch_start() -> None:
    io = MemoryFileIO()
    p = Partition(TP, 1, new_log(io, 1), ReplicationConfig())
    # Broker 1 leads epoch 0, writes 10 records, then leads again in epoch 1 (start offset 10).
    p.make_leader(state(1, 0, (1,)), 0)
    p.append_records_to_leader(records(10), acks=1, now_ms=0)
    p.make_leader(state(1, 1, (1,), zk_version=1), 0)
    assert p.leader_epoch_start_offset == 10
    p.append_records_to_leader(records(5), acks=1, now_ms=0)
    assert p.high_watermark == 15
    assert fetch(p, 2, 9, now_ms=1) is None  # below the HW
    p2 = Partition(TP, 1, new_log(MemoryFileIO(), 1), ReplicationConfig())
    p2.make_leader(state(1, 0, (1,)), 0)
    p2.append_records_to_leader(records(10), acks=1, now_ms=0)
    p2.make_leader(state(1, 1, (1,), zk_version=1), 0)
    p2.log.update_high_watermark(4)  # a new leader whose HW lags (its HW came from a follower)
    assert fetch(p2, 2, 6, now_ms=1) is None  # above the HW but before the epoch start (KIP-320)
    proposal = fetch(p2, 2, 10, now_ms=2)
    assert proposal is not None and proposal.new_isr == (1, 2)
    assert fetch(p, 3, 15, now_ms=1) is not None


def test_hw_is_computed_over_the_maximal_isr_while_an_expand_is_pending() -> None:
    # correctness.md's counterexample: ISR [1,2], the leader starts adding 3 (LEO 0 = HW 0).
    for maximal, expected_hw in ((True, 0), (False, 10)):
        p = leader_partition(ReplicationConfig(maximal_isr=maximal), isr=(1, 2))
        proposal = fetch(p, 3, 0, now_ms=1)
        assert proposal is not None and proposal.new_isr == (1, 2, 3)
        p.append_records_to_leader(records(10), acks=1, now_ms=2)
        fetch(p, 2, 10, now_ms=3)
        # Maximal: 3's LEO (0) still holds the HW. Naive: HW 10 on [1,2]; once the write
        # lands 3 is in the ISR without offsets 0..9.
        assert p.high_watermark == expected_hw
        p.on_isr_update_result(True, 1, (1, 2, 3))
        assert p.isr == {1, 2, 3}


def test_hw_may_advance_when_a_shrink_lands() -> None:
    p = leader_partition(ReplicationConfig(replica_lag_time_max_ms=1_000))
    p.append_records_to_leader(records(4), acks=1, now_ms=0)
    fetch(p, 2, 4, now_ms=10)
    assert p.high_watermark == 0  # 3 has not fetched
    proposal = p.maybe_shrink_isr(now_ms=1_001)
    assert proposal is not None and proposal.new_isr == (1, 2)
    assert p.high_watermark == 0  # maximal ISR still holds 3 while the write is pending
    assert p.on_isr_update_result(True, 1, (1, 2)) is True
    assert p.high_watermark == 4


def test_only_one_isr_change_in_flight_and_a_failed_cas_keeps_the_old_isr() -> None:
    p = leader_partition(ReplicationConfig(replica_lag_time_max_ms=1_000), isr=(1, 2))
    assert fetch(p, 3, 0, now_ms=1) is not None
    assert p.maybe_shrink_isr(now_ms=5_000) is None  # the expand is still in flight
    p.on_isr_update_result(False, -1, ())
    assert p.isr == {1, 2} and p.pending_isr is None and p.zk_version == 0
    # a late result for a proposal that is no longer pending changes nothing
    assert p.on_isr_update_result(True, 7, (1, 2, 3)) is False
    assert p.isr == {1, 2}


def test_isr_result_from_an_older_epoch_is_ignored() -> None:
    p = leader_partition(isr=(1, 2))
    fetch(p, 3, 0, now_ms=1)
    p.make_leader(state(1, 1, (1, 2), zk_version=3), now_ms=2)  # re-elected: proposal dropped
    assert p.pending_isr is None
    p.on_isr_update_result(True, 4, (1, 2, 3), leader_epoch=0)
    assert p.isr == {1, 2}


def test_acks_all_is_refused_when_the_isr_is_below_min_insync() -> None:
    p = leader_partition(isr=(1,), min_insync_replicas=2)
    with pytest.raises(ReplicationError) as e:
        p.append_records_to_leader(records(1), acks=-1, now_ms=0)
    assert e.value.error == Errors.NOT_ENOUGH_REPLICAS
    assert p.log_end_offset == 0  # nothing written
    p.append_records_to_leader(records(1), acks=1, now_ms=0)
    assert p.log_end_offset == 1


def test_hw_does_not_advance_while_the_isr_is_below_min_insync() -> None:
    # KIP-966: an ISR of one must not commit what only one replica has when min.isr is 2.
    p = leader_partition(isr=(1,), min_insync_replicas=2)
    p.append_records_to_leader(records(3), acks=1, now_ms=0)
    assert p.high_watermark == 0
    loose = leader_partition(ReplicationConfig(hw_requires_min_isr=False), isr=(1,),
                             min_insync_replicas=2)
    loose.append_records_to_leader(records(3), acks=1, now_ms=0)
    assert loose.high_watermark == 3


def test_check_enough_replicas_reach_offset() -> None:
    p = leader_partition(isr=(1, 2), min_insync_replicas=2)
    p.append_records_to_leader(records(2), acks=-1, now_ms=0)
    assert p.check_enough_replicas_reach_offset(2) == (False, Errors.NONE)
    fetch(p, 2, 2, now_ms=1)
    assert p.check_enough_replicas_reach_offset(2) == (True, Errors.NONE)
    p.append_records_to_leader(records(1), acks=-1, now_ms=2)
    p.maybe_shrink_isr(now_ms=20_000)
    p.on_isr_update_result(True, 1, (1,))
    assert p.check_enough_replicas_reach_offset(3) == (True, Errors.NOT_ENOUGH_REPLICAS_AFTER_APPEND)
    p.make_follower(state(2, 1, (2,), zk_version=2), now_ms=3)
    assert p.check_enough_replicas_reach_offset(3) == (True, Errors.NOT_LEADER_OR_FOLLOWER)


def test_expand_skips_replicas_the_shell_reports_offline_or_re_registered() -> None:
    # KIP-841 / KIP-903: eligibility is a predicate over (broker id, broker epoch of its fetch).
    eligible = {2: 100}
    p = leader_partition(isr=(1,))
    p.is_replica_eligible = lambda b, e: b in eligible and (e is None or e == eligible[b])
    assert p.update_follower_fetch_state(3, 0, 0, 1, p.log_end_offset) is None  # offline
    assert p.update_follower_fetch_state(2, 0, 0, 1, p.log_end_offset, broker_epoch=99) is None
    proposal = p.update_follower_fetch_state(2, 0, 0, 1, p.log_end_offset, broker_epoch=100)
    assert proposal is not None and proposal.new_isr == (1, 2)


def test_make_follower_reports_every_epoch_change_even_with_the_same_leader() -> None:
    p = Partition(TP, 2, new_log(MemoryFileIO(), 2), ReplicationConfig())
    assert p.make_follower(state(1, 0, (1, 2, 3)), 0) is True
    assert p.make_follower(state(1, 0, (1, 2), zk_version=1), 0) is False
    assert p.make_follower(state(1, 1, (1, 2), zk_version=2), 0) is True  # KAFKA-7164
    assert not p.is_leader and p.leader_id == 1 and p.leader_epoch == 1


def test_a_new_leader_records_its_epoch_at_its_leo_at_once() -> None:
    # KIP-279: the epoch is in the cache before any append in it.
    p = Partition(TP, 1, new_log(MemoryFileIO(), 1), ReplicationConfig())
    p.make_leader(state(1, 0, (1,)), 0)
    p.append_records_to_leader(records(3), acks=1, now_ms=0)
    p.make_leader(state(1, 4, (1,), zk_version=1), 0)
    assert p.log.leader_epoch_cache.entries == [(0, 0), (4, 3)]
    assert p.last_offset_for_leader_epoch(4, 2) == p.last_offset_for_leader_epoch(-1, 0)
    assert p.last_offset_for_leader_epoch(4, 2).end_offset == 3
    assert p.last_offset_for_leader_epoch(3, 2).error == Errors.FENCED_LEADER_EPOCH
    assert p.last_offset_for_leader_epoch(5, 2).error == Errors.UNKNOWN_LEADER_EPOCH


def test_update_from_a_replica_outside_the_assignment_is_refused() -> None:
    p = leader_partition()
    with pytest.raises(ReplicationError) as e:
        fetch(p, 9, 0, now_ms=1)
    assert e.value.error == Errors.NOT_LEADER_OR_FOLLOWER
