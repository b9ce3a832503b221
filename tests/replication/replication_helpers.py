"""Helpers for the replication-core tests: real Logs over the simulator's in-memory file layer."""

from __future__ import annotations

from tidelog.protocol.records.builder import build_values
from tidelog.replication import (
    LeaderAndIsrPartitionState,
    Partition,
    ReplicationConfig,
    TopicPartition,
)
from tidelog.sim.disk import MemoryFileIO
from tidelog.storage.log import Log
from tidelog.storage.log_config import LogConfig

TP = TopicPartition("orders", 0)


def records(n: int, tag: str = "v") -> bytes:
    """One batch of n records."""
    return bytes(build_values([f"{tag}{i}".encode() for i in range(n)]))


def new_log(io: MemoryFileIO, broker: int, tp: TopicPartition = TP) -> Log:
    return Log(f"/broker-{broker}/{tp.topic}-{tp.partition}", LogConfig(), io)


def state(
    leader: int,
    leader_epoch: int,
    isr: tuple[int, ...],
    replicas: tuple[int, ...] = (1, 2, 3),
    zk_version: int = 0,
    controller_epoch: int = 1,
    tp: TopicPartition = TP,
) -> LeaderAndIsrPartitionState:
    return LeaderAndIsrPartitionState(
        tp.topic, tp.partition, controller_epoch, leader, leader_epoch, isr, zk_version, replicas
    )


def leader_partition(
    config: ReplicationConfig | None = None,
    isr: tuple[int, ...] = (1, 2, 3),
    replicas: tuple[int, ...] = (1, 2, 3),
    now_ms: int = 0,
    leader_epoch: int = 0,
) -> Partition:
    p = Partition(TP, 1, new_log(MemoryFileIO(), 1), config or ReplicationConfig())
    p.make_leader(state(1, leader_epoch, isr, replicas), now_ms)
    return p


def fetch(p: Partition, replica_id: int, offset: int, now_ms: int):
    """A follower fetch as the leader sees it: the follower's LEO is its fetch offset."""
    return p.update_follower_fetch_state(replica_id, offset, 0, now_ms, p.log_end_offset)
