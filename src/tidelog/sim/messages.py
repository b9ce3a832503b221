"""What travels on the simulated network: Python objects, no wire codec.

Controller requests are `controller/core.py`'s dataclasses, fetch requests are the fetcher's own
(`replication/fetcher.py`); this module only adds the envelopes the simulator needs around them
(correlation ids, the sender's broker epoch) and the client and ZooKeeper messages.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tidelog.replication.types import TopicPartition

ZK_NODE = 1000
CONTROLLER_NODE = 1001
# The controller's end of the brokers' own connections to it (Kafka's
# NodeToControllerChannelManager: AlterPartition and its answer), apart from the controller's
# connections to the brokers (LeaderAndIsr, UpdateMetadata, StopReplica and their answers): the
# two fail and reorder independently, and the first is faulty in random runs (a lost or late
# AlterPartition is sent again), while the controller's requests are modelled as reliable
# (Kafka's ControllerChannelManager sends each again until it is answered).
CONTROLLER_CHANNEL_NODE = 1002
CLIENT_BASE = 2000


@dataclass(slots=True)
class ProduceRequest:
    corr_id: int
    acks: int
    timeout_ms: int
    tp: TopicPartition
    records: bytes
    # A transactional producer's: the leader verifies its batch with the coordinator (KIP-890).
    transactional_id: str | None = None


@dataclass(slots=True)
class ProduceResponse:
    corr_id: int
    tp: TopicPartition
    error: int
    base_offset: int


@dataclass(slots=True)
class ConsumerFetchRequest:
    corr_id: int
    tp: TopicPartition
    fetch_offset: int
    current_leader_epoch: int
    max_wait_ms: int
    isolation_level: int = 0  # 1: READ_COMMITTED (up to the LSO, with the aborted list)


@dataclass(slots=True)
class ConsumerFetchResponse:
    corr_id: int
    tp: TopicPartition
    error: int
    high_watermark: int
    records: bytes
    last_stable_offset: int = -1
    aborted_transactions: tuple[tuple[int, int], ...] | None = None  # READ_COMMITTED only


@dataclass(slots=True)
class ReplicaFetchRequest:
    """A follower's fetch; `request` is the fetcher's own request object."""

    corr_id: int
    broker_epoch: int
    request: Any


@dataclass(slots=True)
class ReplicaFetchResponse:
    corr_id: int
    request: Any
    response: Any


@dataclass(slots=True)
class EpochRequest:
    """OffsetsForLeaderEpoch from a follower; `request` is the fetcher's own object."""

    corr_id: int
    request: Any


@dataclass(slots=True)
class EpochResponse:
    corr_id: int
    request: Any
    response: Any


@dataclass(slots=True)
class ControllerMessage:
    request: Any


@dataclass(slots=True)
class ControllerResponse:
    """A broker's answer to a LeaderAndIsr (the only answer the controller acts on): every
    partition's error code, for the controller (by its epoch) that sent it to the broker's
    registration `broker_epoch`."""

    controller_epoch: int
    broker_epoch: int
    partition_errors: dict[TopicPartition, int]


@dataclass(slots=True)
class AlterPartitionMessage:
    """A leader's AlterPartition (KIP-497) to the controller: its ISR proposals, from its
    registration `broker_epoch`."""

    corr_id: int
    broker_epoch: int
    proposals: tuple[Any, ...]  # replication.types.ProposeIsr


@dataclass(slots=True)
class AlterPartitionReply:
    """The controller's answer: a shell.alter_partition_manager.AlterPartitionAnswer."""

    corr_id: int
    answer: Any


@dataclass(slots=True)
class ZkRequest:
    """An operation a broker asks of ZooKeeper: ('ping',), ('register', id, data),
    ('log_dir_event',)."""

    corr_id: int
    session_id: int
    op: tuple[Any, ...]


@dataclass(slots=True)
class ZkResponse:
    corr_id: int
    session_id: int
    op: tuple[Any, ...]
    code: str
    result: Any = None
    extra: dict[str, Any] = field(default_factory=dict)
