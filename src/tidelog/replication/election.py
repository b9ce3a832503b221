"""Leader election rules (Kafka's ``PartitionLeaderElectionAlgorithms``), used by the controller.

All functions are pure: they take the assignment (AR, in preference order), the ISR and the live
brokers, and return an ``ElectionResult`` (leader or None, the new ISR, whether it was unclean).
The caller bumps the leader epoch and writes the state with a zk-version CAS.

- clean: the first replica of AR that is live and in the ISR;
- unclean (``unclean.leader.election.enable``): when no clean candidate exists, the first live
  replica of AR; the new ISR is that replica alone (the history it lacks is lost);
- preferred: AR's first replica, if live and in the ISR;
- controlled shutdown: the first replica of AR that is live, in the ISR and not shutting down;
  the shutting-down brokers leave the ISR.

KIP-966's lesson: a replica that restarted after an unclean shutdown may have lost a tail it had
acknowledged; pass it in ``not_clean_candidates`` until it has caught up, and it is never picked
by a clean election (only by an unclean one, when that is enabled).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from tidelog.replication.types import NO_LEADER


@dataclass(frozen=True, slots=True)
class ElectionResult:
    leader: int | None
    isr: tuple[int, ...]
    unclean: bool = False

    @property
    def ok(self) -> bool:
        return self.leader is not None


def offline_partition_leader_election(
    assignment: Sequence[int],
    isr: Collection[int],
    live_brokers: Collection[int],
    unclean_enabled: bool,
    not_clean_candidates: Collection[int] = (),
) -> ElectionResult:
    # A replica that may have lost acknowledged data also leaves the ISR (KIP-966).
    live_isr = tuple(
        r for r in assignment if r in isr and r in live_brokers and r not in not_clean_candidates
    )
    if live_isr:
        return ElectionResult(live_isr[0], live_isr)
    if unclean_enabled:
        for replica in assignment:
            if replica in live_brokers:
                return ElectionResult(replica, (replica,), unclean=True)
    # No leader: keep the ISR as it is so the last members stay eligible when they return.
    return ElectionResult(None, tuple(r for r in assignment if r in isr))


def preferred_replica_leader_election(
    assignment: Sequence[int], isr: Collection[int], live_brokers: Collection[int]
) -> ElectionResult:
    if assignment and assignment[0] in isr and assignment[0] in live_brokers:
        return ElectionResult(assignment[0], tuple(r for r in assignment if r in isr))
    return ElectionResult(None, tuple(r for r in assignment if r in isr))


def controlled_shutdown_leader_election(
    assignment: Sequence[int],
    isr: Collection[int],
    live_brokers: Collection[int],
    shutting_down: Collection[int],
) -> ElectionResult:
    new_isr = tuple(r for r in assignment if r in isr and r not in shutting_down)
    for replica in assignment:
        if replica in new_isr and replica in live_brokers:
            return ElectionResult(replica, new_isr)
    return ElectionResult(None, tuple(r for r in assignment if r in isr))


def remove_replica_from_isr(
    leader: int, isr: Sequence[int], replica: int
) -> tuple[int, tuple[int, ...]]:
    """The controller's ``removeReplicasFromIsr`` for a dead or shutting-down broker: it leaves the
    ISR unless it is the last member (so the last replica standing stays electable), and if it
    was the leader the partition is left leaderless (NO_LEADER) until an election."""
    new_isr = tuple(isr) if len(isr) <= 1 else tuple(r for r in isr if r != replica)
    new_leader = NO_LEADER if leader == replica else leader
    return new_leader, new_isr
