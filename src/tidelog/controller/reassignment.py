"""Partition reassignment (KIP-455), the controller's decisions, pure.

Kafka 2.4+'s ZooKeeper-mode controller (`KafkaController.onPartitionReassignment`) moves a
partition from its original replicas (ORS) to target replicas (TRS) through a full replica set
RS = ORS + TRS (target first, as Kafka's `ReplicaAssignment.reassignTo`), with
adding = RS - ORS and removing = RS - TRS:

1. the topic znode gets RS with "adding_replicas"/"removing_replicas" (so a new controller
   resumes the move), the leader epoch is bumped and LeaderAndIsr carries RS to every replica:
   the adding replicas start as followers and catch up;
2. once TRS is within the ISR (`is_reassignment_complete`, checked at every ISR change):
   the leader moves to the first live in-sync target replica if it is not in TRS, the removing
   replicas leave the ISR (one write, leader epoch bumped), they get StopReplica(delete=true),
   and the topic znode gets AR = TRS without adding/removing.

A new reassignment of a partition already moving replaces the old one, from the whole current
RS (KRaft's rule, see `build_reassignment`); cancelling reverts to ORS, its adding replicas
stopped and deleted at once (when they were the whole ISR, the ISR restarts from an original
replica, KRaft's revert: `reassignment_write`). This module
holds the assignment arithmetic, the request validation and the partition-state writes; the
shell (`controller.py`) does the ZooKeeper and channel I/O in Kafka's order.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, replace

from tidelog.controller.core import NO_LEADER, ControllerCore, Decision, PartitionWrite
from tidelog.protocol.errors import ErrorCode
from tidelog.replication import election
from tidelog.replication.types import TopicPartition

INVALID_REPLICA_ASSIGNMENT = int(ErrorCode.INVALID_REPLICA_ASSIGNMENT)
NO_REASSIGNMENT_IN_PROGRESS = int(ErrorCode.NO_REASSIGNMENT_IN_PROGRESS)
UNKNOWN_TOPIC_OR_PARTITION = int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)


@dataclass(frozen=True, slots=True)
class ReplicaAssignment:
    """Kafka's `ReplicaAssignment`: the full replica set and the replicas joining/leaving it."""

    replicas: tuple[int, ...]
    adding_replicas: tuple[int, ...] = ()
    removing_replicas: tuple[int, ...] = ()

    @property
    def origin_replicas(self) -> tuple[int, ...]:
        return tuple(r for r in self.replicas if r not in self.adding_replicas)

    @property
    def target_replicas(self) -> tuple[int, ...]:
        return tuple(r for r in self.replicas if r not in self.removing_replicas)

    @property
    def is_being_reassigned(self) -> bool:
        return bool(self.adding_replicas or self.removing_replicas)

    def reassign_to(self, target: Iterable[int]) -> ReplicaAssignment:
        target = tuple(target)
        origin = self.origin_replicas
        full = tuple(dict.fromkeys(target + origin))
        return ReplicaAssignment(full, tuple(r for r in full if r not in origin),
                                 tuple(r for r in full if r not in target))


@dataclass(frozen=True, slots=True)
class ApiError:
    """Kafka's ApiError: a code and a message, by default the error's own (none for NONE)."""

    code: int
    message: str | None = None

    @property
    def text(self) -> str | None:
        if self.message is not None or self.code == 0:
            return self.message
        return ErrorCode(self.code).message


def validate_replicas(current: ReplicaAssignment, replicas: list[int],
                      live_brokers: Collection[int]) -> ApiError | None:
    """Kafka's `KafkaController.validateReplicas` for a requested target replica list."""
    if not replicas:
        return ApiError(INVALID_REPLICA_ASSIGNMENT,
                        "Empty replica list specified in partition reassignment.")
    if len(set(replicas)) != len(replicas):
        return ApiError(INVALID_REPLICA_ASSIGNMENT,
                        "Duplicate replica ids in partition reassignment replica list: "
                        f"{_scala_list(replicas)}")
    if any(r < 0 for r in replicas):
        return ApiError(INVALID_REPLICA_ASSIGNMENT,
                        f"Invalid broker id in replica list: {_scala_list(replicas)}")
    adding = ReplicaAssignment(current.replicas).reassign_to(replicas).adding_replicas
    if not set(adding) <= set(live_brokers):
        return ApiError(INVALID_REPLICA_ASSIGNMENT,
                        "Replica assignment has brokers that are not alive. Replica list: "
                        f"{_scala_list(adding)}, live broker list: "
                        f"{_scala_set(live_brokers)}")
    return None


def build_reassignment(current: ReplicaAssignment,
                       target: list[int] | None) -> ReplicaAssignment | None:
    """Kafka's `maybeBuildReassignment`: the new full assignment; a cancellation (target None)
    reverts to the original replicas; None when there is nothing to cancel.

    A new target for a partition already moving starts from its whole replica set, as KRaft's
    controller does (`PartitionReassignmentReplicas(part.replicas, target)`): the adding
    replicas of the replaced move that the new target drops stay as removing replicas until
    the new target is in the ISR. Kafka's ZooKeeper controller starts from the original
    replicas and deletes those at once, even when one is the leader and the only ISR member
    (sim seed 487: the partition's only copy was deleted, the replica re-added, and elected
    from the ISR it had never left with an empty log)."""
    if target is None:
        return current.reassign_to(current.origin_replicas) if current.is_being_reassigned \
            else None
    return ReplicaAssignment(current.replicas).reassign_to(target)


def is_reassignment_complete(assignment: ReplicaAssignment, isr: Iterable[int]) -> bool:
    """Kafka's isReassignmentComplete: a cancellation's revert (no adding/removing replicas)
    completes at once, whatever the ISR holds of the original replicas."""
    return not assignment.is_being_reassigned or set(assignment.target_replicas) <= set(isr)


def reassignment_write(core: ControllerCore, tp: TopicPartition, replicas: tuple[int, ...],
                       leave: Iterable[int]) -> PartitionWrite | None:
    """The partition state with `replicas` as its assignment and the replicas in `leave` out
    of the ISR, leader epoch bumped (Kafka's updateLeaderEpochAndSendRequest, then the
    OfflineReplica transition's removeReplicasFromIsr). The leader stays unless it leaves, is
    not in `replicas` or is not online: then Kafka's ReassignPartitionLeaderElectionStrategy
    picks the first of `replicas` online and in the ISR. When every ISR member leaves (a
    cancellation), the ISR is that of KRaft's revert. None for a partition without state."""
    state = core.partition_states.get(tp)
    if state is None:
        return None
    leader, isr = state.leader, list(state.isr)
    for r in leave:
        # The last ISR member stays (Kafka's removeReplicasFromIsr), so it can lead again.
        leader, isr = election.remove_replica_from_isr(leader, isr, r)
        isr = list(isr)
    # Kafka's isReplicaOnline: a live broker whose log dir holding the partition has not
    # failed (a replica answered KAFKA_STORAGE_ERROR for is not alive to lead).
    online = {r for r in replicas if core.is_replica_online(r, tp)} - core.shutting_down
    # Never a replica back from an unclean shutdown (KIP-966's rule, as every election).
    dirty = core.unclean_restarted.get(tp, ())
    if isr and set(isr) <= set(leave):
        # A cancelled move whose adding replicas were the whole ISR (accepted only with unclean
        # election on): KRaft's PartitionReassignmentRevert restarts the ISR from the first
        # original replica, by an unclean election if it cannot lead. Kafka's ZooKeeper
        # controller keeps the deleted replica as the ISR outside the assignment (sim seed
        # 600 --unclean: ISR [0] with replicas [2, 1]).
        result = election.offline_partition_leader_election(
            replicas, replicas[:1], online, core.unclean_enabled_for(tp.topic), dirty)
        leader = NO_LEADER if result.leader is None else result.leader
        isr = list(result.isr)
    elif leader == NO_LEADER or leader not in replicas or leader not in online:
        leader = next((r for r in replicas if r in online and r in isr and r not in dirty),
                      NO_LEADER)
    new = replace(state, leader=leader, leader_epoch=state.leader_epoch + 1, isr=tuple(isr),
                  controller_epoch=core.controller_epoch, replicas=replicas, is_new=False)
    return PartitionWrite(tp, new, state.zk_version)


def start_decision(core: ControllerCore, tp: TopicPartition, assignment: ReplicaAssignment,
                   unneeded: Iterable[int]) -> Decision:
    """Phase A: RS to every replica (the adding ones start as followers); replicas of an
    earlier reassignment no longer in RS leave the ISR and are deleted. The core's assignment
    must already be RS."""
    unneeded = tuple(unneeded)
    d = Decision(update_metadata=True, metadata_partitions={tp})
    w = reassignment_write(core, tp, assignment.replicas, unneeded)
    if w is not None:
        d.writes.append(w)
    _delete(d, tp, unneeded)
    return d


def complete_decision(core: ControllerCore, tp: TopicPartition,
                      assignment: ReplicaAssignment) -> Decision:
    """Phase B: AR = TRS, the leader moved into TRS if need be, the removing replicas out of
    the ISR and deleted. The core's assignment must already be TRS."""
    d = Decision(update_metadata=True, metadata_partitions={tp})
    w = reassignment_write(core, tp, assignment.target_replicas, assignment.removing_replicas)
    if w is not None:
        d.writes.append(w)
    _delete(d, tp, assignment.removing_replicas)
    return d


def _delete(d: Decision, tp: TopicPartition, replicas: Iterable[int]) -> None:
    for r in replicas:
        d.delete_replicas.setdefault(r, set()).add(tp)


def full_assignments(assignments: Mapping[TopicPartition, tuple[int, ...]],
                     reassigning: Mapping[TopicPartition, ReplicaAssignment], topic: str
                     ) -> tuple[dict[int, list[int]], dict[int, list[int]], dict[int, list[int]]]:
    """A topic's znode content: (partitions, adding_replicas, removing_replicas)."""
    parts: dict[int, list[int]] = {}
    adding: dict[int, list[int]] = {}
    removing: dict[int, list[int]] = {}
    for tp, replicas in assignments.items():
        if tp.topic != topic:
            continue
        parts[tp.partition] = list(replicas)
        a = reassigning.get(tp)
        if a is not None:
            if a.adding_replicas:
                adding[tp.partition] = list(a.adding_replicas)
            if a.removing_replicas:
                removing[tp.partition] = list(a.removing_replicas)
    return parts, adding, removing


def _scala_list(xs: Iterable[int]) -> str:
    # Kafka's controller prints the request's replica Buffer (its toString).
    return "ArrayBuffer(" + ", ".join(str(x) for x in xs) + ")"


def _scala_set(xs: Iterable[int]) -> str:
    return "Set(" + ", ".join(str(x) for x in sorted(xs)) + ")"


# --- /admin/reassign_partitions (the legacy znode, Kafka's ReassignPartitionsZNode) -----------

REASSIGN_PARTITIONS_PATH = "/admin/reassign_partitions"


def encode_reassign_partitions(targets: Mapping[tuple[str, int], Iterable[int]]) -> bytes:
    parts = [{"topic": t, "partition": p, "replicas": list(rs)}
             for (t, p), rs in sorted(targets.items())]
    return json.dumps({"version": 1, "partitions": parts}, separators=(",", ":")).encode()


def decode_reassign_partitions(data: bytes | None) -> dict[TopicPartition, list[int]]:
    """The target replicas per partition; ValueError for a znode Kafka could not parse."""
    try:
        obj = json.loads((data or b"").decode("utf-8"))
        return {TopicPartition(str(p["topic"]), int(p["partition"])): [int(r) for r in p["replicas"]]
                for p in obj["partitions"]}
    except (UnicodeDecodeError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{REASSIGN_PARTITIONS_PATH}: invalid content ({e!r})") from None
