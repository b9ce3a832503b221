"""KIP-392: the replica a consumer should fetch from (``replica.selector.class``).

Kafka's leader asks its configured ``ReplicaSelector`` for each partition of a consumer's Fetch
v11+ (which carries the consumer's ``client.rack`` as ``rack_id``). When the selector names a
follower, the leader answers that partition with no records and ``preferred_read_replica`` set,
and the consumer fetches from that follower (up to the follower's high watermark) until its
``metadata.max.age.ms`` passes or a fetch fails. Kafka 3.9 ships one selector,
``org.apache.kafka.common.replica.RackAwareReplicaSelector``; without a selector (the default)
consumers always fetch from the leader. Any other class name is refused at start-up with the
``ClassNotFoundException`` Kafka's ``CoreUtils.createObject`` raises.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from tidelog.replication.partition import Partition

__all__ = [
    "RACK_AWARE_REPLICA_SELECTOR",
    "RackAwareReplicaSelector",
    "ReplicaView",
    "create_replica_selector",
    "find_preferred_read_replica",
    "replica_selector_class_error",
]

RACK_AWARE_REPLICA_SELECTOR = "org.apache.kafka.common.replica.RackAwareReplicaSelector"


@dataclass(frozen=True, slots=True)
class ReplicaView:
    """Kafka's ReplicaView: a replica's endpoint (None = Kafka's Node.noNode(), a broker not
    alive or without the consumer's listener), its LEO and the time since it last caught up."""

    broker_id: int
    rack: str | None
    has_endpoint: bool
    log_end_offset: int
    time_since_last_caught_up_ms: int

    def sort_key(self) -> tuple[int, int, int]:
        """ReplicaView.comparator(): most caught up is largest — the highest LEO, then the
        shortest time since caught up, then the highest broker id."""
        return (self.log_end_offset, -self.time_since_last_caught_up_ms, self.broker_id)


class RackAwareReplicaSelector:
    """Kafka's RackAwareReplicaSelector: the leader when it is in the consumer's rack or no
    replica is (or the consumer names no rack); else the most caught-up replica of that rack."""

    def select(self, client_rack: str, replicas: Iterable[ReplicaView],
               leader: ReplicaView) -> ReplicaView:
        if not client_rack:
            return leader
        same_rack = [r for r in replicas if r.rack == client_rack]
        if not same_rack or leader in same_rack:
            return leader
        return max(same_rack, key=ReplicaView.sort_key)


_SELECTORS: dict[str, type[RackAwareReplicaSelector]] = {
    RACK_AWARE_REPLICA_SELECTOR: RackAwareReplicaSelector,
}


def replica_selector_class_error(class_name: object) -> str | None:
    """The config validator: Kafka loads the class by name when the broker starts."""
    if class_name is None or class_name in _SELECTORS:
        return None
    return f"java.lang.ClassNotFoundException: {class_name}"


def create_replica_selector(class_name: str | None) -> RackAwareReplicaSelector | None:
    """Kafka's ReplicaManager.createReplicaSelector: None when no class is configured."""
    if class_name is None:
        return None
    error = replica_selector_class_error(class_name)
    if error is not None:
        raise ValueError(error)
    return _SELECTORS[class_name]()


def find_preferred_read_replica(
    selector: RackAwareReplicaSelector, partition: Partition, client_rack: str, fetch_offset: int,
    now_ms: int, racks: Mapping[int, str | None],
) -> int | None:
    """Kafka's findPreferredReadReplica for a consumer's fetch at this partition's leader: the
    follower to fetch from, or None for the leader itself. Only ISR followers whose log holds
    ``fetch_offset`` are candidates (a lagging follower chosen again at every metadata refresh
    would keep the consumer behind forever). ``racks``: the rack of each replica with an endpoint
    on the consumer's listener (alive brokers only)."""
    leader_id = partition.leader_id
    if not partition.is_leader or leader_id is None:
        return None
    candidates: list[ReplicaView] = []
    for replica in partition.remote_replicas.values():
        if (replica.broker_id in partition.isr
                and replica.log_end_offset >= fetch_offset >= replica.log_start_offset):
            candidates.append(_view(replica.broker_id, racks, replica.log_end_offset,
                                    now_ms - replica.last_caught_up_time_ms))
    leader = _view(leader_id, racks, partition.log_end_offset, 0)
    candidates.append(leader)
    selected = selector.select(client_rack, candidates, leader)
    # The selector may name the leader; the answer then names no replica.
    if not selected.has_endpoint or selected == leader:
        return None
    return selected.broker_id


def _view(broker_id: int, racks: Mapping[int, str | None], log_end_offset: int,
          since_caught_up_ms: int) -> ReplicaView:
    return ReplicaView(broker_id, racks.get(broker_id), broker_id in racks, log_end_offset,
                       since_caught_up_ms)
