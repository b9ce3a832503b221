"""A held fetch ends at the event that settles it, with the partition's error (Kafka's
DelayedFetch.tryComplete cases A-E, its ReplicaManager's completeDelayedFetchOrProduceRequests at
StopReplica and LeaderAndIsr): the partition deleted, this broker made its follower, its leader
epoch moved past the fetch's, its log dir failed. A fetch the event does not settle (a consumer's
Fetch v11+ without an epoch may read a follower: KIP-392) waits on to its deadline."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest
from replication_helpers import TP, state

from tidelog.replication import Errors, ReplicaManager, ReplicationConfig
from tidelog.replication.types import CompleteFetch
from tidelog.sim.disk import MemoryFileIO
from tidelog.storage.log_config import LogConfig
from tidelog.storage.log_manager import LogManager

WAIT_MS = 30_000

# label -> (replica id, current leader epoch, fetch only from the leader)
FETCHES = {
    "consumer v10": (-1, -1, True),
    "consumer v12 with its epoch": (-1, 0, False),
    "consumer v12 without an epoch": (-1, -1, False),
    "follower 2": (2, 0, True),
}


def leader() -> ReplicaManager:
    """Broker 1 leading TP (replicas 1 and 2, epoch 0, empty), one log dir."""
    lm = LogManager(["/disk1"], LogConfig(), MemoryFileIO())
    rm = ReplicaManager(1, lm, ReplicationConfig())
    rm.become_leader_or_follower(0, 1, [replace(state(1, 0, (1, 2), (1, 2)), is_new=True)],
                                 {1, 2}, 0)
    return rm


def hold_all(rm: ReplicaManager) -> None:
    for label, (replica_id, epoch, only_leader) in FETCHES.items():
        outcome = rm.fetch_messages(replica_id, WAIT_MS, 1, 1 << 20, {TP: (0, epoch, 0, 1 << 20)},
                                    10, request_key=label, fetch_only_leader=only_leader)
        assert outcome.delayed, label


EVENTS: dict[str, tuple[Callable[[ReplicaManager], object], dict[str, Errors]]] = {
    "deleted": (lambda rm: rm.stop_replicas(0, 1, {TP: True}, 20),
                dict.fromkeys(FETCHES, Errors.UNKNOWN_TOPIC_OR_PARTITION)),
    "made a follower": (
        lambda rm: rm.become_leader_or_follower(0, 1, [state(2, 1, (1, 2), (1, 2))], {1, 2}, 20),
        {"consumer v10": Errors.NOT_LEADER_OR_FOLLOWER,
         "consumer v12 with its epoch": Errors.FENCED_LEADER_EPOCH,
         "follower 2": Errors.FENCED_LEADER_EPOCH}),
    "a new epoch of the same leader": (
        lambda rm: rm.become_leader_or_follower(0, 1, [state(1, 1, (1, 2), (1, 2))], {1, 2}, 20),
        {"consumer v12 with its epoch": Errors.FENCED_LEADER_EPOCH,
         "follower 2": Errors.FENCED_LEADER_EPOCH}),
    "its log dir failed": (lambda rm: rm.handle_log_dir_failure("/disk1", 20),
                           dict.fromkeys(FETCHES, Errors.KAFKA_STORAGE_ERROR)),
    # Still hosted and led here (Kafka re-checks and finds nothing to answer).
    "stopped, not deleted": (lambda rm: rm.stop_replicas(0, 1, {TP: False}, 20), {}),
}


def errors_of(done: list[object]) -> dict[str, Errors]:
    out = {}
    for c in done:
        assert isinstance(c, CompleteFetch)
        out[str(c.request_key)] = c.results[TP].error
    return out


@pytest.mark.parametrize("event", list(EVENTS))
def test_a_held_fetch_ends_at_the_event_that_settles_it(event: str) -> None:
    rm = leader()
    hold_all(rm)
    action, settled = EVENTS[event]
    action(rm)
    assert errors_of(rm.poll_completed(20)) == settled
    # The others wait for their deadline, and end there.
    rest = errors_of(rm.poll_completed(10 + WAIT_MS))
    assert set(rest) == set(FETCHES) - set(settled)
