"""A leader answers at once the held fetches of a follower that just got a partition there which
those fetches do not name, and holds that follower's fetches lacking it only a slice of their
wait, a bounded number of times (replication/follower_joins.py)."""

from __future__ import annotations

from replication_helpers import TP, state

from tidelog.replication import CompleteFetch, ReplicaManager, ReplicationConfig, TopicPartition
from tidelog.replication.follower_joins import JOIN_WAIT_SLICES
from tidelog.sim.disk import MemoryFileIO
from tidelog.storage.log_config import LogConfig
from tidelog.storage.log_manager import LogManager

NEW = TopicPartition("orders", 1)
WAIT = 500
SLICE = WAIT // JOIN_WAIT_SLICES


def leader(lag_ms: int = 10_000) -> ReplicaManager:
    """Broker 1 leading TP (replicas 1, 2, 3)."""
    lm = LogManager(["/broker-1"], LogConfig(), MemoryFileIO())
    rm = ReplicaManager(1, lm, ReplicationConfig(replica_lag_time_max_ms=lag_ms))
    rm.become_leader_or_follower(0, 1, [state(1, 0, (1, 2, 3))], {1, 2, 3}, 0)
    return rm


def hold(rm: ReplicaManager, replica_id: int, key: str, now_ms: int,
         tps: tuple[TopicPartition, ...] = (TP,)) -> None:
    out = rm.fetch_messages(replica_id, WAIT, 1, 1 << 20,
                            {tp: (0, 0, 0, 1 << 20) for tp in tps}, now_ms, request_key=key)
    assert out.delayed


def completed_keys(rm: ReplicaManager, now_ms: int) -> list[object]:
    return [c.request_key for c in rm.poll_completed(now_ms) if isinstance(c, CompleteFetch)]


def lead_new(rm: ReplicaManager, now_ms: int, epoch: int = 0, leader_id: int = 1,
             replicas: tuple[int, ...] = (1, 2, 3)) -> None:
    rm.become_leader_or_follower(0, 1, [state(leader_id, epoch, (1, 2, 3), replicas, tp=NEW)],
                                 {1, 2, 3}, now_ms)


def test_a_new_leadership_answers_its_followers_held_fetches_that_lack_it_at_once() -> None:
    rm = leader()
    hold(rm, 2, "f2", 0)
    hold(rm, -1, "consumer", 0)
    assert completed_keys(rm, 100) == []
    lead_new(rm, 100)
    # Without this, f2 waits until 500 and broker 2's fetch naming NEW goes out after it.
    assert completed_keys(rm, 100) == ["f2"]
    assert completed_keys(rm, WAIT) == ["consumer"]


def test_a_held_fetch_naming_the_partition_or_of_a_non_replica_is_left_to_wait() -> None:
    rm = leader()
    lead_new(rm, 0)
    hold(rm, 2, "f2", 0, (TP, NEW))
    hold(rm, 3, "f3", 0, (TP, NEW))
    # Broker 1 comes to lead a partition of brokers 1 and 3 only.
    rm.become_leader_or_follower(
        0, 1, [state(1, 0, (1, 3), (1, 3), tp=TopicPartition("x", 0))], {1, 2, 3}, 20)
    assert completed_keys(rm, 20) == ["f3"]
    assert completed_keys(rm, WAIT) == ["f2"]


def test_a_follower_fetch_still_lacking_its_new_partition_is_held_only_a_slice() -> None:
    rm = leader()
    lead_new(rm, 0)
    # Broker 2 has not had its LeaderAndIsr yet: its next fetch still names TP only.
    hold(rm, 2, "early", 0)
    assert completed_keys(rm, SLICE - 1) == []
    assert completed_keys(rm, SLICE) == ["early"]
    # Once a fetch of broker 2 names NEW, its fetches wait as long as they ask again.
    hold(rm, 2, "joined", SLICE, (TP, NEW))
    hold(rm, 2, "other fetcher", SLICE)
    assert completed_keys(rm, 2 * SLICE) == []
    assert completed_keys(rm, SLICE + WAIT) == ["joined", "other fetcher"]


def test_short_holds_are_bounded_in_count() -> None:
    rm = leader()
    lead_new(rm, 0)
    now = 0
    for i in range(JOIN_WAIT_SLICES):
        hold(rm, 2, f"short {i}", now)
        now += SLICE
        assert completed_keys(rm, now) == [f"short {i}"]
    # A follower that never learns of NEW is held as long as it asks from now on.
    hold(rm, 2, "full", now)
    assert completed_keys(rm, now + SLICE) == []
    assert completed_keys(rm, now + WAIT) == ["full"]


def test_short_holds_end_after_the_lag_time_or_with_the_leadership() -> None:
    rm = leader(lag_ms=1_000)
    lead_new(rm, 0)
    hold(rm, 2, "late", 1_000)
    assert completed_keys(rm, 1_000 + SLICE) == []
    assert completed_keys(rm, 1_000 + WAIT) == ["late"]

    rm = leader()
    lead_new(rm, 0)
    lead_new(rm, 10, epoch=1, leader_id=3)  # NEW moved on to broker 3
    hold(rm, 2, "after the move", 10)
    assert completed_keys(rm, 10 + SLICE) == []
    assert completed_keys(rm, 10 + WAIT) == ["after the move"]
