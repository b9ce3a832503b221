"""Which members of a proposed ISR may not be in it (KIP-841/903), as the ISR writer rules.

Kafka's KRaft controller refuses an AlterPartition whose new ISR names a broker that is not
registered, or one whose broker epoch (sent by the leader with each member: the epoch of the
member's last fetch) is not that of its registration: ReplicationControlManager's
`ineligibleReplicasForIsr`, answered INELIGIBLE_REPLICA. tidelog's leaders write their ISR to
ZooKeeper themselves, so the rule runs in the ISR writer of both drivers, against the
registrations in `/brokers/ids` (the broker epoch is the znode's czxid). An epoch of -1 is not
checked (the leader did not know it), as in Kafka.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

__all__ = ["IneligibleReplica", "ineligible_replicas_for_isr"]


@dataclass(frozen=True, slots=True)
class IneligibleReplica:
    broker_id: int
    reason: str  # Kafka's words: "not registered", "stale broker epoch"

    def __str__(self) -> str:
        return f"{self.broker_id} ({self.reason})"


def ineligible_replicas_for_isr(
    isr_with_broker_epochs: Iterable[tuple[int, int]],
    registered_epoch: Callable[[int], int | None],
) -> list[IneligibleReplica]:
    """``registered_epoch(broker id)``: the epoch of its registration, None if unregistered."""
    out: list[IneligibleReplica] = []
    for broker_id, broker_epoch in isr_with_broker_epochs:
        registered = registered_epoch(broker_id)
        if registered is None:
            out.append(IneligibleReplica(broker_id, "not registered"))
        elif broker_epoch != -1 and broker_epoch != registered:
            out.append(IneligibleReplica(broker_id, "stale broker epoch"))
    return out
