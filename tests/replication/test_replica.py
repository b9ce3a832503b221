"""Replica: the leader's view of a follower and its caught-up clock (seed 000's updateLogReadResult)."""

from __future__ import annotations

from tidelog.replication import Replica


def test_a_fetch_at_the_leaders_leo_is_caught_up_now() -> None:
    r = Replica(2)
    r.update_fetch_state(fetch_offset=10, log_start_offset=0, fetch_time_ms=500, leader_end_offset=10)
    assert r.last_caught_up_time_ms == 500
    assert (r.log_end_offset, r.last_fetch_leader_log_end_offset, r.last_fetch_time_ms) == (10, 10, 500)


def test_a_fetch_that_read_to_the_leo_of_its_time_counts_at_the_next_fetch() -> None:
    # Fetch 1 at 100 reads up to the leader's LEO 10 (as of fetch 1). New data arrives; fetch 2
    # at 200 asks for 10: it had everything as of fetch 1, so it was caught up at 100.
    r = Replica(2)
    r.update_fetch_state(5, 0, 100, leader_end_offset=10)
    assert r.last_caught_up_time_ms == 0
    r.update_fetch_state(10, 0, 200, leader_end_offset=15)
    assert r.last_caught_up_time_ms == 100


def test_a_follower_that_never_reaches_the_leo_of_any_fetch_is_not_caught_up() -> None:
    r = Replica(2)
    r.update_fetch_state(0, 0, 100, leader_end_offset=10)
    r.update_fetch_state(8, 0, 200, leader_end_offset=20)
    r.update_fetch_state(18, 0, 300, leader_end_offset=30)
    assert r.last_caught_up_time_ms == 0


def test_caught_up_time_never_goes_back_with_a_reordered_fetch() -> None:
    r = Replica(2)
    r.update_fetch_state(10, 0, 500, leader_end_offset=10)
    r.update_fetch_state(10, 0, 400, leader_end_offset=10)
    assert r.last_caught_up_time_ms == 500


def test_reset_on_a_new_leader_forgets_the_leo_and_starts_the_clock_for_isr_members() -> None:
    r = Replica(2, log_end_offset=7, last_caught_up_time_ms=3)
    r.reset_replica_state(now_ms=1_000, leader_end_offset=7, is_new_leader=True, is_follower_in_sync=True)
    assert (r.log_end_offset, r.last_caught_up_time_ms, r.last_fetch_leader_log_end_offset) == (-1, 1_000, 7)
    out = Replica(3, log_end_offset=7, last_caught_up_time_ms=3)
    out.reset_replica_state(1_000, 7, is_new_leader=True, is_follower_in_sync=False)
    assert out.last_caught_up_time_ms == 0


def test_replaying_an_unchanged_fetch_is_the_same_fetch_recorded_again() -> None:
    # A fetch session skips partitions that did not change; their fetches are replayed later
    # with the last recorded offsets (ReplicaManager.replay_follower_fetches).
    for offset, leo in ((10, 10), (5, 10)):
        replayed, recorded = Replica(2), Replica(2)
        for r in (replayed, recorded):
            r.update_fetch_state(offset, 0, 100, leader_end_offset=leo)
        replayed.replay_fetch(300)
        recorded.update_fetch_state(offset, 0, 300, leader_end_offset=leo)
        assert replayed == recorded
    caught_up = Replica(2)
    caught_up.update_fetch_state(10, 0, 300, leader_end_offset=10)
    caught_up.replay_fetch(200)  # older than what is recorded: nothing
    assert (caught_up.last_caught_up_time_ms, caught_up.last_fetch_time_ms) == (300, 300)
