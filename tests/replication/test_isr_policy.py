"""ISR lag policies: replica.lag.time.max.ms vs the pre-0.9 replica.lag.max.messages (seed 003)."""

from __future__ import annotations

import pytest
from replication_helpers import fetch, leader_partition, records

from tidelog.replication import (
    MessageLagPolicy,
    Partition,
    Replica,
    ReplicationConfig,
    TimeLagPolicy,
    policy_for,
)


def test_policy_for_picks_the_message_rule_only_when_configured() -> None:
    assert isinstance(policy_for(ReplicationConfig()), TimeLagPolicy)
    policy = policy_for(ReplicationConfig.from_properties({"replica.lag.max.messages": "4"}))
    assert isinstance(policy, MessageLagPolicy) and policy.replica_lag_max_messages == 4


def test_message_rule_judges_the_leo_gap_and_the_time_rule_the_caught_up_clock() -> None:
    r = Replica(2, log_end_offset=10, last_caught_up_time_ms=0, last_fetch_time_ms=900)
    assert MessageLagPolicy(4, 10_000).is_out_of_sync(r, leader_end_offset=15, now_ms=1_000)
    assert not MessageLagPolicy(4, 10_000).is_out_of_sync(r, leader_end_offset=14, now_ms=1_000)
    assert not TimeLagPolicy(10_000).is_out_of_sync(r, leader_end_offset=15, now_ms=1_000)
    assert TimeLagPolicy(10_000).is_out_of_sync(r, leader_end_offset=15, now_ms=10_001)


def run_bursty_producer(p: Partition, rounds: int) -> tuple[int, int]:
    """Seed 003's setting: batches of 3 with an occasional burst of 5, the isr-expiration check
    running between an append and the followers' next fetch. Returns (shrinks, expands)."""
    shrinks = expands = 0
    now = 0
    for i in range(rounds):
        now += 100
        p.append_records_to_leader(records(5 if i % 4 == 3 else 3), acks=1, now_ms=now)
        proposal = p.maybe_shrink_isr(now)
        if proposal is not None:
            shrinks += 1
            p.on_isr_update_result(True, p.zk_version + 1, proposal.new_isr)
        now += 10
        for follower in (2, 3):  # healthy followers: every fetch reaches the LEO
            proposal = fetch(p, follower, p.log_end_offset, now)
            if proposal is not None:
                expands += 1
                p.on_isr_update_result(True, p.zk_version + 1, proposal.new_isr)
    return shrinks, expands


@pytest.mark.parametrize(
    ("config", "flaps"),
    [
        (ReplicationConfig(replica_lag_max_messages=4), True),
        (ReplicationConfig(replica_lag_time_max_ms=10_000), False),
    ],
)
def test_a_burst_makes_the_message_rule_flap_but_not_the_time_rule(
    config: ReplicationConfig, flaps: bool
) -> None:
    p = leader_partition(config)
    shrinks, expands = run_bursty_producer(p, rounds=20)
    if flaps:
        # Every burst of 5 > 4 throws both healthy followers out, and their next fetch brings
        # them back: 5 bursts, one shrink proposal each, two expands each.
        assert (shrinks, expands) == (5, 10)
    else:
        assert (shrinks, expands) == (0, 0)
    assert p.isr == {1, 2, 3}
