"""What a client knows about a cluster: brokers, topics, partition leaders (from Metadata)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tidelog.protocol.errors import ErrorCode
from tidelog.protocol.topic_partition import TopicPartition

__all__ = [
    "BrokerMetadata",
    "ClusterMetadata",
    "PartitionMetadata",
    "TopicMetadata",
    "TopicPartition",
]


@dataclass(frozen=True, slots=True)
class BrokerMetadata:
    node_id: int
    host: str
    port: int
    rack: str | None = None


@dataclass(frozen=True, slots=True)
class PartitionMetadata:
    topic: str
    partition: int
    leader: int  # -1 while no leader is known
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    offline_replicas: tuple[int, ...] = ()
    error: int = ErrorCode.NONE


@dataclass(frozen=True, slots=True)
class TopicMetadata:
    name: str
    error: int
    partitions: dict[int, PartitionMetadata]
    is_internal: bool = False


@dataclass(slots=True)
class ClusterMetadata:
    """A snapshot of the cluster, merged from Metadata responses (newest answer wins)."""

    cluster_id: str | None = None
    controller_id: int = -1
    brokers: dict[int, BrokerMetadata] = field(default_factory=dict)
    topics: dict[str, TopicMetadata] = field(default_factory=dict)

    def leader_for(self, tp: TopicPartition) -> int | None:
        topic = self.topics.get(tp.topic)
        if topic is None:
            return None
        part = topic.partitions.get(tp.partition)
        if part is None or part.leader < 0:
            return None
        return part.leader

    def partition(self, tp: TopicPartition) -> PartitionMetadata | None:
        topic = self.topics.get(tp.topic)
        return None if topic is None else topic.partitions.get(tp.partition)

    def partitions_for(self, topic: str) -> list[int] | None:
        """Sorted partition ids of ``topic``, or None if the topic is not known."""
        meta = self.topics.get(topic)
        if meta is None or meta.error != ErrorCode.NONE:
            return None
        return sorted(meta.partitions)

    def update(self, response: Any, *, all_topics: bool) -> None:
        """Merge a MetadataResponse. ``all_topics``: the request asked for every topic, so
        topics missing from the answer no longer exist."""
        self.cluster_id = response.cluster_id
        self.controller_id = response.controller_id
        self.brokers = {
            b.node_id: BrokerMetadata(b.node_id, b.host, b.port, b.rack) for b in response.brokers
        }
        if all_topics:
            self.topics = {}
        for t in response.topics:
            if t.name is None:
                continue
            parts = {
                p.partition_index: PartitionMetadata(
                    t.name,
                    p.partition_index,
                    p.leader_id,
                    p.leader_epoch,
                    tuple(p.replica_nodes),
                    tuple(p.isr_nodes),
                    tuple(p.offline_replicas),
                    p.error_code,
                )
                for p in t.partitions
            }
            self.topics[t.name] = TopicMetadata(t.name, t.error_code, parts, t.is_internal)
