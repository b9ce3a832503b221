"""Plain inputs and outputs of the replication core.

Inputs are what the controller and clients send (``LeaderAndIsrPartitionState``); outputs are
small frozen dataclasses ("actions") that the shell (``sim/`` or ``broker/``) carries out:

- ``ProposeIsr``: write this ISR to ZooKeeper as a compare-and-set on ``zk_version`` (seed 000's
  ``updateIsr``); report the outcome with ``ReplicaManager.on_isr_update_result``.
- ``AddFetcher`` / ``RemoveFetcher``: start / stop replicating a partition from a leader.
- ``CompleteProduce`` / ``CompleteFetch``: a delayed request is done; send its response.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field

from tidelog.protocol.topic_partition import TopicPartition
from tidelog.replication.errors import Errors

NO_LEADER = -1
UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1
CONSUMER_REPLICA_ID = -1
DEBUGGING_REPLICA_ID = -2  # Kafka's debugging consumer: reads any replica, to its HW
# Fetch and ListOffsets isolation levels (KIP-98)
READ_UNCOMMITTED = 0
READ_COMMITTED = 1
# ListOffsets special timestamps (Kafka's ListOffsetsRequest.LATEST_TIMESTAMP / EARLIEST_TIMESTAMP
# / MAX_TIMESTAMP).
LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2
MAX_TIMESTAMP = -3


@dataclass(frozen=True, slots=True)
class LeaderAndIsrPartitionState:
    """One partition of a LeaderAndIsr request (the controller's view of the partition)."""

    topic: str
    partition: int
    controller_epoch: int
    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    zk_version: int  # the partition epoch: version of /brokers/topics/t/partitions/p/state
    replicas: tuple[int, ...]
    is_new: bool = False
    # During a reassignment (LeaderAndIsr v3+, KIP-455): the replicas joining and leaving
    # `replicas` (Kafka's ReplicaAssignment beyond RS); empty otherwise.
    adding_replicas: tuple[int, ...] = ()
    removing_replicas: tuple[int, ...] = ()

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


# ---------------------------------------------------------------- actions (outputs)


@dataclass(frozen=True, slots=True)
class ProposeIsr:
    """Write ``new_isr`` for ``tp`` iff the stored state still has ``zk_version`` (a CAS).
    ``isr_with_broker_epochs``: each member with the broker epoch the leader knows it by (its
    last fetch's; the leader's own; -1 unknown), AlterPartition v3's NewIsrWithEpochs: the ISR
    writer refuses a member whose registration has another epoch (KIP-903)."""

    tp: TopicPartition
    leader: int
    leader_epoch: int
    new_isr: tuple[int, ...]
    zk_version: int
    controller_epoch: int
    # What the leader knows of the members, not part of the proposal's identity.
    isr_with_broker_epochs: tuple[tuple[int, int], ...] = field(default=(), compare=False)


@dataclass(frozen=True, slots=True)
class AddFetcher:
    """Replicate ``tp`` from ``source_broker``; start by truncating (KIP-101/279), then fetch."""

    tp: TopicPartition
    source_broker: int
    fetch_offset: int
    leader_epoch: int


@dataclass(frozen=True, slots=True)
class RemoveFetcher:
    tp: TopicPartition


FetcherAction = AddFetcher | RemoveFetcher


@dataclass(frozen=True, slots=True)
class ProducePartitionResult:
    error: Errors
    base_offset: int = -1
    log_start_offset: int = -1
    log_append_time_ms: int = -1


@dataclass(frozen=True, slots=True)
class FetchPartitionData:
    """One partition of a fetch response (leader -> follower/consumer)."""

    error: Errors
    high_watermark: int = -1
    log_start_offset: int = -1
    records: bytes | memoryview = b""
    last_stable_offset: int = -1
    # READ_COMMITTED: (producer id, first offset) of the aborted transactions overlapping the
    # records; None for other isolation levels (the wire's null)
    aborted_transactions: tuple[tuple[int, int], ...] | None = None
    # (epoch, end offset): the fetcher's last fetched epoch is not in this log's history up to
    # its fetch offset — it must truncate to there (Fetch v12+); no records then.
    diverging_epoch: tuple[int, int] | None = None


@dataclass(frozen=True, slots=True)
class EpochEndOffset:
    """One partition of an OffsetsForLeaderEpoch response."""

    error: Errors
    leader_epoch: int = UNDEFINED_EPOCH
    end_offset: int = UNDEFINED_EPOCH_OFFSET


@dataclass(frozen=True, slots=True)
class ListOffsetsPartitionResult:
    error: Errors
    offset: int = -1
    leader_epoch: int = UNDEFINED_EPOCH
    timestamp: int = -1  # the found batch's max timestamp, for a search by time


@dataclass(frozen=True, slots=True)
class CompleteProduce:
    request_key: Hashable
    results: Mapping[TopicPartition, ProducePartitionResult]


@dataclass(frozen=True, slots=True)
class CompleteFetch:
    request_key: Hashable
    results: Mapping[TopicPartition, FetchPartitionData]
    isr_proposals: tuple[ProposeIsr, ...] = field(default=())


Completion = CompleteProduce | CompleteFetch
