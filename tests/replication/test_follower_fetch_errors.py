"""A follower's fetch at a leader that does not count it among the partition's replicas, as
Kafka's Partition.followerReplicaOrThrow answers it: UNKNOWN_LEADER_EPOCH when the fetch names
the leader's current epoch (a replica being added: the pair is not known yet, retry),
NOT_LEADER_OR_FOLLOWER without an epoch."""

from __future__ import annotations

from replication_helpers import TP, state

from tidelog.replication import Errors, ReplicaManager, ReplicationConfig
from tidelog.sim.disk import MemoryFileIO
from tidelog.storage.log_config import LogConfig
from tidelog.storage.log_manager import LogManager


def test_a_fetch_from_a_broker_that_is_not_a_replica() -> None:
    rm = ReplicaManager(1, LogManager(["/b1"], LogConfig(), MemoryFileIO()), ReplicationConfig())
    rm.become_leader_or_follower(0, 1, [state(1, 3, (1, 2), replicas=(1, 2))], {1, 2, 4}, 0)

    def fetch(epoch: int) -> Errors:
        return rm.fetch_messages(4, 0, 0, 1 << 20, {TP: (0, epoch, 0, 1 << 20)}, 0) \
            .results[TP].error

    assert fetch(3) == Errors.UNKNOWN_LEADER_EPOCH
    assert fetch(-1) == Errors.NOT_LEADER_OR_FOLLOWER
    assert fetch(2) == Errors.FENCED_LEADER_EPOCH  # the epoch is checked first
