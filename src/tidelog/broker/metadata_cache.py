"""`MetadataCache`: the cluster as the controller last described it (Kafka's ZK-mode
`MetadataCache`), filled by UpdateMetadata requests and read by the Metadata API, auto topic
creation, the replica fetchers (leader addresses) and CreateTopics/DeleteTopics (waiting for the
controller to act).

Kafka's rule for a stale request: an UpdateMetadata whose controller epoch is older than the
newest one seen is refused (STALE_CONTROLLER_EPOCH) and changes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from uuid import UUID

from tidelog.protocol.primitives import ZERO_UUID
from tidelog.replication.types import TopicPartition

__all__ = ["BrokerEndpoint", "MetadataCache", "PartitionMetadata"]


@dataclass(frozen=True, slots=True)
class BrokerEndpoint:
    """A live broker: its inter-broker endpoint, plus every listener's (host, port)."""

    broker_id: int
    host: str
    port: int
    rack: str | None = None
    listeners: tuple[tuple[str, str, int], ...] = ()  # (listener name, host, port)

    def for_listener(self, listener_name: str) -> tuple[str, int] | None:
        for name, host, port in self.listeners:
            if name == listener_name:
                return host, port
        return None if self.listeners else (self.host, self.port)


@dataclass(frozen=True, slots=True)
class PartitionMetadata:
    topic: str
    partition: int
    controller_epoch: int
    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    zk_version: int
    replicas: tuple[int, ...]
    offline_replicas: tuple[int, ...] = ()


# Kafka's LeaderAndIsr.LeaderDuringDelete: the controller marks partitions of a topic being
# deleted with this leader in UpdateMetadata; the cache then drops them.
LEADER_DURING_DELETE = -2


@dataclass(slots=True)
class MetadataCache:
    broker_id: int
    listener_name: str = "PLAINTEXT"
    controller_id: int | None = None
    controller_epoch: int = -1
    brokers: dict[int, BrokerEndpoint] = field(default_factory=dict)
    partitions: dict[str, dict[int, PartitionMetadata]] = field(default_factory=dict)
    # Each topic's id (KIP-516) as UpdateMetadata v7+ carries it; dropped with the topic.
    topic_ids: dict[str, UUID] = field(default_factory=dict)
    # Endpoints learnt from LeaderAndIsr's live_leaders (used before an UpdateMetadata arrives).
    known_endpoints: dict[int, BrokerEndpoint] = field(default_factory=dict)
    # The id of the topic this broker hosts under each name, from LeaderAndIsr (Kafka keeps it
    # with each log, partition.metadata): a fetch naming another id is INCONSISTENT_TOPIC_ID.
    # Dropped with the topic; replaced when a topic of that name is created again.
    hosted_topic_ids: dict[str, UUID] = field(default_factory=dict)
    updates: int = 0
    _names_by_id: dict[UUID, str] | None = None

    def update(
        self,
        controller_id: int,
        controller_epoch: int,
        brokers: list[BrokerEndpoint],
        partition_states: list[PartitionMetadata],
        topic_ids: Mapping[str, UUID] | None = None,
    ) -> bool:
        """Apply an UpdateMetadata; False (nothing applied) when its controller epoch is stale.
        `topic_ids`: the ids of the topics it names (a zero id, as v0-6 send, is no id)."""
        if controller_epoch < self.controller_epoch:
            return False
        self.controller_epoch = controller_epoch
        self.controller_id = controller_id
        self.brokers = {b.broker_id: b for b in brokers}
        for b in brokers:
            self.known_endpoints[b.broker_id] = b
        for st in partition_states:
            if st.leader == LEADER_DURING_DELETE:
                self.hosted_topic_ids.pop(st.topic, None)
                parts = self.partitions.get(st.topic)
                if parts is not None:
                    parts.pop(st.partition, None)
                    if not parts:
                        del self.partitions[st.topic]
                        self.topic_ids.pop(st.topic, None)
                continue
            self.partitions.setdefault(st.topic, {})[st.partition] = st
        for topic, topic_id in (topic_ids or {}).items():
            if topic_id != ZERO_UUID and topic in self.partitions:
                self.topic_ids[topic] = topic_id
        self.updates += 1
        self._names_by_id = None
        return True

    def note_hosted_topic_ids(self, topic_ids: Mapping[str, UUID]) -> None:
        """The topic ids a LeaderAndIsr names for the partitions it gives this broker."""
        for topic, topic_id in topic_ids.items():
            if topic_id != ZERO_UUID and self.hosted_topic_ids.get(topic) != topic_id:
                self.hosted_topic_ids[topic] = topic_id
                self._names_by_id = None

    def remember_endpoint(self, endpoint: BrokerEndpoint) -> None:
        self.known_endpoints[endpoint.broker_id] = endpoint

    # ------------------------------------------------------------------ queries
    def alive_broker_ids(self) -> list[int]:
        return sorted(self.brokers)

    def is_alive(self, broker_id: int) -> bool:
        return broker_id in self.brokers

    def endpoint(self, broker_id: int) -> BrokerEndpoint | None:
        """A broker's inter-broker endpoint, from whichever of UpdateMetadata and
        LeaderAndIsr's live leaders told us last (a restarted broker may have a new port)."""
        return self.known_endpoints.get(broker_id) or self.brokers.get(broker_id)

    def topics(self) -> list[str]:
        return sorted(self.partitions)

    def contains_topic(self, topic: str) -> bool:
        return topic in self.partitions

    def topic_id(self, topic: str) -> UUID:
        """The topic's id, or the zero id when the controller sent none (Kafka's Uuid.ZERO_UUID)."""
        return self.topic_ids.get(topic, ZERO_UUID)

    def hosted_topic_id(self, topic: str) -> UUID:
        """The id this broker's replica of ``topic`` fetches under: the LeaderAndIsr's (as
        Kafka's follower names a partition by its log's id), else the metadata's."""
        topic_id = self.hosted_topic_ids.get(topic)
        return topic_id if topic_id is not None else self.topic_id(topic)

    def topic_names_by_id(self) -> dict[UUID, str]:
        """Topic id -> name (Kafka's topicIdsToNames), rebuilt only after a change. A hosted
        topic the UpdateMetadata requests have not named yet counts too (a follower's v13+
        fetch may come first, e.g. just after this broker restarted); for a name they know,
        their id is the topic's."""
        if self._names_by_id is None:
            self._names_by_id = {
                **{i: t for t, i in self.hosted_topic_ids.items() if t not in self.topic_ids},
                **{i: t for t, i in self.topic_ids.items()}}
        return self._names_by_id

    def topic_partitions(self, topic: str) -> dict[int, PartitionMetadata]:
        return dict(self.partitions.get(topic, {}))

    def partition(self, tp: TopicPartition) -> PartitionMetadata | None:
        return self.partitions.get(tp.topic, {}).get(tp.partition)

    def leader_of(self, tp: TopicPartition) -> int | None:
        st = self.partition(tp)
        return None if st is None or st.leader < 0 else st.leader

    def has_leaders(self, topic: str) -> bool:
        parts = self.partitions.get(topic)
        return bool(parts) and all(
            p.leader >= 0 and p.leader in self.brokers for p in parts.values()
        )
