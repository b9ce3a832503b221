"""The controller's side of partition reassignment (KIP-455): the I/O around the pure phases of
`reassignment.py`, in Kafka's order (`KafkaController.onPartitionReassignment`).

Every method runs inside the controller's event queue (one event at a time), so the state here
— the partitions being reassigned with their full assignment, and the ones that came from the
legacy znode — changes only between ZooKeeper writes the controller awaits. The full assignment
lives in ZooKeeper (the topic znode's partitions/adding_replicas/removing_replicas), so a new
controller resumes every move (`resume`).

Sources of reassignments: AlterPartitionReassignments (`alter`), the legacy
/admin/reassign_partitions znode (`on_zk_reassignment`, on its creation); the latest one of a
partition wins (an API reassignment takes the partition out of the znode). Triggers of progress:
an ISR change of a moving partition (`on_isr_change`: TRS within the ISR completes it) and a
broker start (`on_broker_startup`: its replicas of moving partitions get RS again, and a
removed replica whose broker was down gets its StopReplica(delete=true) now).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from tidelog.controller.core import Decision
from tidelog.controller.reassignment import (
    NO_REASSIGNMENT_IN_PROGRESS,
    UNKNOWN_TOPIC_OR_PARTITION,
    ApiError,
    ReplicaAssignment,
    build_reassignment,
    complete_decision,
    full_assignments,
    is_reassignment_complete,
    start_decision,
    validate_replicas,
)
from tidelog.controller.zk_interface import ControllerMovedError
from tidelog.protocol.errors import ErrorCode
from tidelog.replication.types import TopicPartition

if TYPE_CHECKING:  # pragma: no cover
    from tidelog.controller.controller import KafkaController

log = logging.getLogger(__name__)

NONE = ApiError(0)
_PARTITION_DOES_NOT_EXIST = ApiError(UNKNOWN_TOPIC_OR_PARTITION, "The partition does not exist.")


class ReassignmentManager:
    def __init__(self, controller: KafkaController) -> None:
        self.c = controller
        self.reassigning: dict[TopicPartition, ReplicaAssignment] = {}
        self.from_zk_znode: set[TopicPartition] = set()
        # Removed replicas on brokers that were down: deleted when the broker starts (in
        # memory only; Kafka's ZooKeeper-mode controller never deletes them at all).
        self.pending_deletes: dict[int, set[TopicPartition]] = {}
        self._znode_existed = False

    def reset(self) -> None:
        self.reassigning.clear()
        self.from_zk_znode.clear()
        self.pending_deletes.clear()
        self._znode_existed = False

    def current(self, tp: TopicPartition) -> ReplicaAssignment:
        a = self.reassigning.get(tp)
        if a is not None:
            return a
        core = self.c.core
        replicas = core.assignments.get(tp, ()) if core is not None else ()
        return ReplicaAssignment(tuple(replicas))

    def topic_is_moving(self, topic: str) -> bool:
        return any(tp.topic == topic for tp in self.reassigning)

    # -- requests --------------------------------------------------------------------------
    async def alter(self, targets: Mapping[TopicPartition, list[int] | None]
                    ) -> dict[TopicPartition, ApiError]:
        """Kafka's processApiPartitionReassignment: validate, build, take the partitions out of
        the legacy znode, trigger."""
        core = self.c.core
        assert core is not None
        results: dict[TopicPartition, ApiError] = {}
        to_trigger: dict[TopicPartition, ReplicaAssignment] = {}
        for tp, target in targets.items():
            current = self.current(tp)
            error = None if target is None else validate_replicas(current, target,
                                                                   core.live_brokers)
            if error is not None:
                results[tp] = error
                continue
            built = build_reassignment(current, target)
            if built is None:
                results[tp] = ApiError(NO_REASSIGNMENT_IN_PROGRESS)
            else:
                to_trigger[tp] = built
        await self._remove_from_zk_znode(set(to_trigger))
        results.update(await self._trigger(to_trigger))
        return results

    def list(self, partitions: Iterable[TopicPartition] | None
             ) -> dict[TopicPartition, ReplicaAssignment]:
        if partitions is None:
            return dict(sorted(self.reassigning.items()))
        return {tp: self.reassigning[tp] for tp in partitions if tp in self.reassigning}

    # -- triggers ----------------------------------------------------------------------------
    async def _trigger(self, reassignments: Mapping[TopicPartition, ReplicaAssignment]
                       ) -> dict[TopicPartition, ApiError]:
        """Kafka's maybeTriggerPartitionReassignment."""
        c = self.c
        out: dict[TopicPartition, ApiError] = {}
        for tp, assignment in reassignments.items():
            core = c.core
            if core is None:
                out[tp] = ApiError(int(ErrorCode.NOT_CONTROLLER))
            elif tp.topic in c.topics_to_be_deleted or tp not in core.assignments:
                out[tp] = _PARTITION_DOES_NOT_EXIST
            else:
                await self.on_partition_reassignment(tp, assignment)
                out[tp] = NONE
        return out

    async def on_partition_reassignment(self, tp: TopicPartition,
                                        assignment: ReplicaAssignment) -> None:
        c, core = self.c, self.c.core
        if core is None:
            return
        old = self.current(tp)
        unneeded: tuple[int, ...] = ()
        if old != assignment:
            # U1/U2: the full assignment in ZooKeeper first, then in memory.
            self.reassigning[tp] = assignment
            core.assignments[tp] = assignment.replicas
            await self._write_topic(tp.topic)
            unneeded = tuple(r for r in old.replicas if r not in assignment.replicas)
        else:
            self.reassigning[tp] = assignment
        log.info("controller %d: reassigning %s: %s", c.broker_id, tp, assignment)
        state = (await c._zk(c.zk_client.get_partition_states, [tp])).get(tp)
        isr = state.isr if state is not None else ()
        if not is_reassignment_complete(assignment, isr):
            # A1/A2: RS (with a bumped leader epoch) to every replica; the adding ones start
            # as followers. Replicas of an earlier reassignment not in RS leave and are deleted.
            self._note_dead(tp, unneeded)
            await c._execute(lambda: start_decision(core, tp, assignment, unneeded), [tp])
            return
        await self._complete(tp, assignment, unneeded)

    async def _complete(self, tp: TopicPartition, assignment: ReplicaAssignment,
                        unneeded: tuple[int, ...]) -> None:
        c, core = self.c, self.c.core
        if core is None:
            return
        # B2-B5: AR = TRS in memory, the leader moved into TRS if need be, the removing
        # replicas out of the ISR and deleted (after their successors joined the ISR).
        done = ReplicaAssignment(assignment.target_replicas, (), tuple(dict.fromkeys(
            assignment.removing_replicas + unneeded)))
        core.assignments[tp] = done.replicas
        self._note_dead(tp, done.removing_replicas)
        await c._execute(lambda: complete_decision(core, tp, done), [tp])
        # B6/B7: AR = TRS in ZooKeeper, then out of the legacy znode.
        del self.reassigning[tp]
        await self._write_topic(tp.topic)
        if tp in self.from_zk_znode:
            await self._remove_from_zk_znode({tp})
        log.info("controller %d: reassignment of %s completed: %s", c.broker_id, tp,
                 list(done.replicas))
        if tp.topic in c.topics_to_be_deleted and not self.topic_is_moving(tp.topic):
            await c._resume_deletions()

    def _note_dead(self, tp: TopicPartition, removed: Iterable[int]) -> None:
        core = self.c.core
        for r in removed:
            if core is not None and r not in core.live_brokers:
                self.pending_deletes.setdefault(r, set()).add(tp)

    async def on_isr_change(self, tps: Iterable[TopicPartition]) -> None:
        """Kafka's processPartitionReassignmentIsrChange."""
        core = self.c.core
        for tp in sorted(set(tps)):
            assignment = self.reassigning.get(tp)
            state = core.partition_states.get(tp) if core is not None else None
            if assignment is None or state is None:
                continue
            if is_reassignment_complete(assignment, state.isr):
                await self.on_partition_reassignment(tp, assignment)

    async def on_broker_startup(self, broker_id: int) -> None:
        c, core = self.c, self.c.core
        if core is None:
            return
        stale = self.pending_deletes.pop(broker_id, set())
        stale = {tp for tp in stale if broker_id not in core.assignments.get(tp, ())}
        if stale:
            d = Decision()
            d.delete_replicas[broker_id] = stale
            await c._execute(lambda: d)
        for tp, assignment in sorted(self.reassigning.items()):
            if broker_id in assignment.replicas:
                await self.on_partition_reassignment(tp, assignment)

    async def resume(self) -> None:
        """After a failover: every reassignment in the topic znodes, then the legacy znode's
        (Kafka's initializePartitionReassignments and the resumption that follows)."""
        c, core = self.c, self.c.core
        if core is None:
            return
        stored = await c._zk(self._read_stored, sorted(c.topics))
        for tp, assignment in sorted(stored.items()):
            if tp in core.assignments:
                self.reassigning[tp] = assignment
        for tp, assignment in sorted(stored.items()):
            if tp in self.reassigning:
                await self.on_partition_reassignment(tp, assignment)
        await self.on_zk_reassignment(True)

    def _read_stored(self, topics: list[str]) -> dict[TopicPartition, ReplicaAssignment]:
        zk, core = self.c.zk_client, self.c.core
        out: dict[TopicPartition, ReplicaAssignment] = {}
        if core is None:
            return out
        for topic in topics:
            adding, removing = zk.get_topic_reassignments(topic)
            for p in sorted(set(adding) | set(removing)):
                tp = TopicPartition(topic, p)
                replicas = core.assignments.get(tp)
                if replicas:
                    out[tp] = ReplicaAssignment(tuple(replicas), tuple(adding.get(p, ())),
                                                tuple(removing.get(p, ())))
        return out

    async def on_zk_reassignment(self, exists: bool) -> None:
        """Kafka's processZkPartitionReassignment, when /admin/reassign_partitions appears
        (its later rewrites are the controller's own removals, or ignored as in Kafka)."""
        created = exists and not self._znode_existed
        self._znode_existed = exists
        if not created or self.c.core is None:
            return
        c = self.c
        targets = await c._zk(c.zk_client.get_partition_reassignment) or {}
        to_trigger: dict[TopicPartition, ReplicaAssignment] = {}
        failed: dict[TopicPartition, ApiError] = {}
        for key, replicas in targets.items():
            tp = TopicPartition(*key)
            built = build_reassignment(self.current(tp), replicas)
            if built is None:
                failed[tp] = ApiError(NO_REASSIGNMENT_IN_PROGRESS)
            else:
                to_trigger[tp] = built
        self.from_zk_znode |= set(to_trigger)
        results = await self._trigger(to_trigger)
        failed.update({tp: e for tp, e in results.items() if e.code})
        if failed:
            log.warning("controller %d: failed reassignment through zk: %s", c.broker_id, failed)
            await self._remove_from_zk_znode(set(failed))

    async def _remove_from_zk_znode(self, tps: set[TopicPartition]) -> None:
        """Kafka's maybeRemoveFromZkReassignment."""
        c = self.c
        self.from_zk_znode -= tps
        current = await c._zk(c.zk_client.get_partition_reassignment)
        if not current:
            return
        remaining = {tp: rs for tp, rs in current.items() if TopicPartition(*tp) not in tps}
        if len(remaining) != len(current):
            self._znode_existed = bool(remaining)
            await c._zk(c.zk_client.set_partition_reassignment, remaining, c.epoch_zk_version)

    async def _write_topic(self, topic: str) -> None:
        c, core = self.c, self.c.core
        if core is None:
            return
        parts, adding, removing = full_assignments(core.assignments, self.reassigning, topic)
        await c._zk(c.zk_client.set_topic_assignment, topic, parts,
                    expected_epoch_zk_version=c.epoch_zk_version,
                    topic_id=c.topic_ids.get(topic), adding=adding, removing=removing)

    # -- the admin requests, as events of the controller's queue -----------------------------
    async def alter_partition_reassignments(
            self, targets: Mapping[TopicPartition, list[int] | None]
    ) -> dict[TopicPartition, ApiError] | None:
        """An admin's AlterPartitionReassignments; None: not the active controller."""
        c = self.c
        if not c.is_active:
            return None
        try:
            return await c.enqueue("ApiPartitionReassignment", lambda: self._alter_event(targets))
        except ControllerMovedError:
            return None

    async def _alter_event(self, targets: Mapping[TopicPartition, list[int] | None]
                           ) -> dict[TopicPartition, ApiError] | None:
        return None if self.c.core is None else await self.alter(targets)

    async def list_partition_reassignments(
            self, partitions: list[TopicPartition] | None
    ) -> dict[TopicPartition, ReplicaAssignment] | None:
        """An admin's ListPartitionReassignments; None: not the active controller."""
        c = self.c
        if not c.is_active:
            return None

        async def event() -> dict[TopicPartition, ReplicaAssignment] | None:
            return None if c.core is None else self.list(partitions)

        try:
            return await c.enqueue("ListPartitionReassignments", event)
        except ControllerMovedError:
            return None
