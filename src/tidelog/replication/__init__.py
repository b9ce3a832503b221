"""The pure replication core: Replica, Partition (ISR, HW, leader epoch), fetch states, election, purgatory.

Nothing here imports asyncio, socket, kazoo, time or random: the shell passes now_ms and inputs in,
and gets decisions out. See docs/replication.md for the API summary.
"""

from tidelog.replication import election
from tidelog.replication.config import ReplicationConfig
from tidelog.replication.errors import Errors, ReplicationError
from tidelog.replication.fetcher import (
    FetchPartition,
    FetchRequest,
    FetchResult,
    ListOffsetsRequest,
    OffsetsForLeaderEpochRequest,
    PartitionFetchState,
    PartitionStates,
    ReplicaFetcher,
    ReplicaState,
)
from tidelog.replication.isr_policy import IsrLagPolicy, MessageLagPolicy, TimeLagPolicy, policy_for
from tidelog.replication.partition import Partition
from tidelog.replication.purgatory import DelayedFetch, DelayedOperationPurgatory, DelayedProduce
from tidelog.replication.replica import Replica
from tidelog.replication.replica_manager import (
    FetchOutcome,
    LeaderAndIsrResult,
    ProduceOutcome,
    ReplicaManager,
    StopReplicaResult,
)
from tidelog.replication.types import (
    CONSUMER_REPLICA_ID,
    DEBUGGING_REPLICA_ID,
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    NO_LEADER,
    UNDEFINED_EPOCH,
    UNDEFINED_EPOCH_OFFSET,
    AddFetcher,
    CompleteFetch,
    CompleteProduce,
    Completion,
    EpochEndOffset,
    FetcherAction,
    FetchPartitionData,
    LeaderAndIsrPartitionState,
    ListOffsetsPartitionResult,
    ProducePartitionResult,
    ProposeIsr,
    RemoveFetcher,
    TopicPartition,
)

__all__ = [
    "CONSUMER_REPLICA_ID", "DEBUGGING_REPLICA_ID", "EARLIEST_TIMESTAMP", "LATEST_TIMESTAMP", "NO_LEADER", "UNDEFINED_EPOCH",
    "UNDEFINED_EPOCH_OFFSET", "AddFetcher", "CompleteFetch", "CompleteProduce", "Completion",
    "DelayedFetch", "DelayedOperationPurgatory", "DelayedProduce", "EpochEndOffset", "Errors",
    "FetchOutcome", "FetchPartition", "FetchPartitionData", "FetchRequest", "FetchResult",
    "FetcherAction", "IsrLagPolicy", "LeaderAndIsrPartitionState",
    "LeaderAndIsrResult", "ListOffsetsPartitionResult", "ListOffsetsRequest", "MessageLagPolicy",
    "OffsetsForLeaderEpochRequest", "Partition", "PartitionFetchState", "PartitionStates",
    "ProduceOutcome", "ProducePartitionResult", "ProposeIsr", "RemoveFetcher", "Replica",
    "ReplicaFetcher", "ReplicaManager", "ReplicaState", "ReplicationConfig", "ReplicationError",
    "StopReplicaResult", "TimeLagPolicy", "TopicPartition", "election", "policy_for",
]
