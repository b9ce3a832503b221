"""The controller's side of partition reassignment (KIP-455): the phases around the pure
decisions of `reassignment.py`, in Kafka's order (`KafkaController.onPartitionReassignment`),
carried out through the shared `DecisionExecutor` over the ZooKeeper interface.

`ReassignmentManager` is the one implementation both controllers run: the real one
(controller.py, through `ControllerReassignments` below, in a worker thread inside its event
queue) and the simulator's (sim/controller.py, directly). Every method is synchronous, takes
the executor of the current controller epoch and returns an `Executed` with the requests to
send, in order; it runs one event at a time, so the state here — the partitions being
reassigned with their full assignment, and the ones that came from the legacy znode — changes
only inside an event. The full assignment lives in ZooKeeper (the topic znode's
partitions/adding_replicas/removing_replicas), so a new controller resumes every move (`resume`).

Sources of reassignments: AlterPartitionReassignments (`alter`), the legacy
/admin/reassign_partitions znode (`on_zk_reassignment`, on its creation); the latest one of a
partition wins (an API reassignment takes the partition out of the znode). Triggers of progress:
an ISR change of a moving partition (`on_isr_change`: TRS within the ISR completes it) and a
broker start (`on_broker_startup`: its replicas of moving partitions get RS again, and a
removed replica whose broker was down gets its StopReplica(delete=true) now).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import TYPE_CHECKING, Protocol, TypeVar
from uuid import UUID

from tidelog.controller import zk_data
from tidelog.controller.core import Decision
from tidelog.controller.executor import MAX_EVENT_ATTEMPTS, DecisionExecutor, Executed
from tidelog.controller.reassignment import (
    INVALID_REPLICA_ASSIGNMENT,
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
from tidelog.controller.zk_interface import (
    ControllerMovedError,
    ZnodeVersionError,
    ZooKeeperClient,
)
from tidelog.protocol.errors import ErrorCode
from tidelog.replication.types import TopicPartition

if TYPE_CHECKING:  # pragma: no cover
    from tidelog.controller.controller import KafkaController

log = logging.getLogger(__name__)

T = TypeVar("T")

NONE = ApiError(0)
_PARTITION_DOES_NOT_EXIST = ApiError(UNKNOWN_TOPIC_OR_PARTITION, "The partition does not exist.")


class ReassignmentHost(Protocol):
    """What the manager reads of the controller that runs it."""

    @property
    def controller_label(self) -> int: ...

    def topic_id(self, topic: str) -> UUID | None: ...

    def topic_being_deleted(self, topic: str) -> bool: ...


class ReassignmentManager:
    def __init__(self, host: ReassignmentHost) -> None:
        self.host = host
        self.reassigning: dict[TopicPartition, ReplicaAssignment] = {}
        self.from_zk_znode: set[TopicPartition] = set()
        # Removed replicas on brokers that were down: deleted when the broker starts (in
        # memory only; Kafka's ZooKeeper-mode controller never deletes them at all).
        self.pending_deletes: dict[int, set[TopicPartition]] = {}
        # Topics whose last move completed in the latest call (a deletion may resume).
        self.completed_topics: set[str] = set()
        self._znode_existed = False

    def reset(self) -> None:
        self.reassigning.clear()
        self.from_zk_znode.clear()
        self.pending_deletes.clear()
        self.completed_topics.clear()
        self._znode_existed = False

    def current(self, ex: DecisionExecutor, tp: TopicPartition) -> ReplicaAssignment:
        a = self.reassigning.get(tp)
        if a is not None:
            return a
        return ReplicaAssignment(tuple(ex.core.assignments.get(tp, ())))

    def topic_is_moving(self, topic: str) -> bool:
        return any(tp.topic == topic for tp in self.reassigning)

    def list(self, partitions: Iterable[TopicPartition] | None
             ) -> dict[TopicPartition, ReplicaAssignment]:
        if partitions is None:
            return dict(sorted(self.reassigning.items()))
        return {tp: self.reassigning[tp] for tp in partitions if tp in self.reassigning}

    # -- requests --------------------------------------------------------------------------
    def alter(self, ex: DecisionExecutor, targets: Mapping[TopicPartition, list[int] | None]
              ) -> tuple[dict[TopicPartition, ApiError], Executed]:
        """Kafka's processApiPartitionReassignment: validate, build, take the partitions out of
        the legacy znode, trigger."""
        out = _Out()
        results: dict[TopicPartition, ApiError] = {}
        to_trigger: dict[TopicPartition, ReplicaAssignment] = {}
        for tp, target in targets.items():
            current = self.current(ex, tp)
            error = None if target is None else validate_replicas(current, target,
                                                                   ex.core.live_brokers)
            if error is not None:
                results[tp] = error
                continue
            built = build_reassignment(current, target)
            if built is None:
                results[tp] = ApiError(NO_REASSIGNMENT_IN_PROGRESS)
            elif target is None and self._revert_is_unclean(ex, tp, current):
                results[tp] = ApiError(
                    INVALID_REPLICA_ASSIGNMENT,
                    f"Unable to revert partition assignment for {tp.topic}:{tp.partition} "
                    "because it would require an unclean leader election.")
            else:
                to_trigger[tp] = built
        self._remove_from_zk_znode(ex, set(to_trigger))
        results.update(self._trigger(ex, to_trigger, out))
        return results, out.done

    @staticmethod
    def _revert_is_unclean(ex: DecisionExecutor, tp: TopicPartition,
                           current: ReplicaAssignment) -> bool:
        """KRaft's PartitionReassignmentRevert: a cancellation deletes the adding replicas, so
        when they are the whole ISR it would leave no in-sync copy — refused unless the topic
        allows unclean elections. Kafka's ZooKeeper controller deletes them anyway (the only
        copies of acked records); tidelog takes KRaft's rule, as for a replaced move."""
        state = ex.core.partition_states.get(tp)
        if state is None or any(r not in current.adding_replicas for r in state.isr):
            return False
        return not ex.core.unclean_enabled_for(tp.topic)

    # -- triggers ----------------------------------------------------------------------------
    def _trigger(self, ex: DecisionExecutor,
                 reassignments: Mapping[TopicPartition, ReplicaAssignment], out: _Out
                 ) -> dict[TopicPartition, ApiError]:
        """Kafka's maybeTriggerPartitionReassignment."""
        results: dict[TopicPartition, ApiError] = {}
        for tp, assignment in reassignments.items():
            if self.host.topic_being_deleted(tp.topic) or tp not in ex.core.assignments:
                results[tp] = _PARTITION_DOES_NOT_EXIST
            else:
                self._on_partition_reassignment(ex, tp, assignment, out)
                results[tp] = NONE
        return results

    def _on_partition_reassignment(self, ex: DecisionExecutor, tp: TopicPartition,
                                   assignment: ReplicaAssignment, out: _Out) -> None:
        core = ex.core
        old = self.current(ex, tp)
        unneeded: tuple[int, ...] = ()
        if old != assignment:
            # U1/U2: the full assignment in ZooKeeper first, then in memory.
            self._track(ex, tp, assignment)
            core.assignments[tp] = assignment.replicas
            self._write_topic(ex, tp.topic)
            unneeded = tuple(r for r in old.replicas if r not in assignment.replicas)
        else:
            self._track(ex, tp, assignment)
        log.info("controller %d: reassigning %s: %s", self.host.controller_label, tp, assignment)
        state = ex.zk.get_partition_states([tp]).get(tp)
        isr = state.isr if state is not None else ()
        if not is_reassignment_complete(assignment, isr):
            # A1/A2: RS (with a bumped leader epoch) to every replica; the adding ones start
            # as followers. Replicas of an earlier reassignment not in RS leave and are deleted.
            self._note_dead(ex, tp, unneeded)
            out.add(ex.execute(lambda: start_decision(core, tp, assignment, unneeded), [tp]))
            return
        self._complete(ex, tp, assignment, unneeded, out)

    def _complete(self, ex: DecisionExecutor, tp: TopicPartition, assignment: ReplicaAssignment,
                  unneeded: tuple[int, ...], out: _Out) -> None:
        core = ex.core
        # B2-B5: AR = TRS in memory, the leader moved into TRS if need be, the removing
        # replicas out of the ISR and deleted (after their successors joined the ISR).
        done = ReplicaAssignment(assignment.target_replicas, (), tuple(dict.fromkeys(
            assignment.removing_replicas + unneeded)))
        core.assignments[tp] = done.replicas
        # B2: no adding/removing replicas in memory, so B3's LeaderAndIsr carries TRS alone.
        self._track(ex, tp, None)
        self._note_dead(ex, tp, done.removing_replicas)
        out.add(ex.execute(lambda: complete_decision(core, tp, done), [tp]))
        # B6/B7: AR = TRS in ZooKeeper, then out of the legacy znode.
        self._write_topic(ex, tp.topic)
        if tp in self.from_zk_znode:
            self._remove_from_zk_znode(ex, {tp})
        log.info("controller %d: reassignment of %s completed: %s", self.host.controller_label,
                 tp, list(done.replicas))
        if not self.topic_is_moving(tp.topic):
            self.completed_topics.add(tp.topic)

    def _track(self, ex: DecisionExecutor, tp: TopicPartition,
               assignment: ReplicaAssignment | None) -> None:
        """A partition starts or stops moving: here and in the core, whose LeaderAndIsr
        requests carry its adding/removing replicas."""
        if assignment is None:
            del self.reassigning[tp]
            ex.core.reassigning.pop(tp, None)
        else:
            self.reassigning[tp] = assignment
            ex.core.reassigning[tp] = (assignment.adding_replicas, assignment.removing_replicas)

    def _note_dead(self, ex: DecisionExecutor, tp: TopicPartition, removed: Iterable[int]) -> None:
        for r in removed:
            if r not in ex.core.live_brokers:
                self.pending_deletes.setdefault(r, set()).add(tp)

    def on_isr_change(self, ex: DecisionExecutor,
                      tps: Iterable[TopicPartition] | None = None) -> Executed:
        """Kafka's processPartitionReassignmentIsrChange (every moving partition by default)."""
        out = _Out()
        for tp in sorted(set(self.reassigning if tps is None else tps)):
            assignment = self.reassigning.get(tp)
            state = ex.core.partition_states.get(tp)
            if assignment is None or state is None:
                continue
            if is_reassignment_complete(assignment, state.isr):
                self._on_partition_reassignment(ex, tp, assignment, out)
        return out.done

    def on_broker_startup(self, ex: DecisionExecutor, broker_id: int) -> Executed:
        core = ex.core
        out = _Out()
        stale = self.pending_deletes.pop(broker_id, set())
        stale = {tp for tp in stale if broker_id not in core.assignments.get(tp, ())}
        if stale:
            d = Decision()
            d.delete_replicas[broker_id] = stale
            out.add(ex.execute(lambda: d))
        for tp, assignment in sorted(self.reassigning.items()):
            if broker_id in assignment.replicas:
                self._on_partition_reassignment(ex, tp, assignment, out)
        return out.done

    def resume(self, ex: DecisionExecutor, topics: Iterable[str]) -> Executed:
        """After a failover: every reassignment in the topic znodes, then the legacy znode's
        (Kafka's initializePartitionReassignments and the resumption that follows)."""
        out = _Out()
        stored = self._read_stored(ex, sorted(topics))
        for tp, assignment in sorted(stored.items()):
            if tp in ex.core.assignments:
                self._track(ex, tp, assignment)
        for tp, assignment in sorted(stored.items()):
            if tp in self.reassigning:
                self._on_partition_reassignment(ex, tp, assignment, out)
        out.add(self.on_zk_reassignment(ex, True))
        return out.done

    @staticmethod
    def _read_stored(ex: DecisionExecutor, topics: list[str]
                     ) -> dict[TopicPartition, ReplicaAssignment]:
        out: dict[TopicPartition, ReplicaAssignment] = {}
        for topic in topics:
            adding, removing = ex.zk.get_topic_reassignments(topic)
            for p in sorted(set(adding) | set(removing)):
                tp = TopicPartition(topic, p)
                replicas = ex.core.assignments.get(tp)
                if replicas:
                    out[tp] = ReplicaAssignment(tuple(replicas), tuple(adding.get(p, ())),
                                                tuple(removing.get(p, ())))
        return out

    def on_zk_reassignment(self, ex: DecisionExecutor, exists: bool) -> Executed:
        """Kafka's processZkPartitionReassignment, when /admin/reassign_partitions appears
        (its later rewrites are the controller's own removals, or ignored as in Kafka)."""
        out = _Out()
        created = exists and not self._znode_existed
        self._znode_existed = exists
        if not created:
            return out.done
        targets = ex.zk.get_partition_reassignment() or {}
        to_trigger: dict[TopicPartition, ReplicaAssignment] = {}
        failed: dict[TopicPartition, ApiError] = {}
        for key, replicas in targets.items():
            tp = TopicPartition(*key)
            built = build_reassignment(self.current(ex, tp), replicas)
            if built is None:
                failed[tp] = ApiError(NO_REASSIGNMENT_IN_PROGRESS)
            else:
                to_trigger[tp] = built
        self.from_zk_znode |= set(to_trigger)
        results = self._trigger(ex, to_trigger, out)
        failed.update({tp: e for tp, e in results.items() if e.code})
        if failed:
            log.warning("controller %d: failed reassignment through zk: %s",
                        self.host.controller_label, failed)
            self._remove_from_zk_znode(ex, set(failed))
        return out.done

    def _remove_from_zk_znode(self, ex: DecisionExecutor, tps: set[TopicPartition]) -> None:
        """Kafka's maybeRemoveFromZkReassignment."""
        self.from_zk_znode -= tps
        current = ex.zk.get_partition_reassignment()
        if not current:
            return
        remaining = {tp: rs for tp, rs in current.items() if TopicPartition(*tp) not in tps}
        if len(remaining) != len(current):
            self._znode_existed = bool(remaining)
            ex.zk.set_partition_reassignment(remaining, ex.epoch_zk_version)

    def _write_topic(self, ex: DecisionExecutor, topic: str) -> None:
        parts, adding, removing = full_assignments(ex.core.assignments, self.reassigning, topic)

        # Partitions an admin's CreatePartitions wrote that the controller has not read yet
        # (its PartitionModifications watch is pending) are kept: Kafka's ZK controller
        # writes its context alone and so drops an acknowledged partition addition made
        # just before.
        def merge_and_write(data: bytes | None, version: int) -> None:
            written = dict(parts)
            if data is not None:
                for p, replicas in zk_data.decode_topic_znode(topic, data)[0].items():
                    written.setdefault(p, replicas)
            ex.zk.set_topic_assignment(topic, written, expected_version=version,
                                       expected_epoch_zk_version=ex.epoch_zk_version,
                                       topic_id=self.host.topic_id(topic), adding=adding,
                                       removing=removing)

        rewrite_topic_znode(ex.zk, topic, merge_and_write)


def rewrite_topic_znode(zk: ZooKeeperClient, topic: str,
                        attempt: Callable[[bytes | None, int], T]) -> T:
    """`attempt(data, version)` on the topic znode read, until it returns: it writes
    conditioned on that version and raises `ZnodeVersionError` when the znode changed since
    (a partition addition landing between the read and the write is read again, not
    overwritten); given up after MAX_EVENT_ATTEMPTS lost writes."""
    path = zk_data.topic_path(topic)
    for _ in range(MAX_EVENT_ATTEMPTS):
        data, version = zk.get_data_and_version(path)
        try:
            return attempt(data, version)
        except ZnodeVersionError:
            log.info("%s changed while being rewritten; reading it again", path)
    raise ZnodeVersionError(f"{path} kept changing: {MAX_EVENT_ATTEMPTS} writes lost")


class _Out:
    """The requests of every execution of one manager call, in order."""

    __slots__ = ("done",)

    def __init__(self) -> None:
        self.done = Executed(Decision())

    def add(self, e: Executed) -> None:
        self.done.decision = e.decision
        self.done.requests.extend(e.requests)
        self.done.written.extend(e.written)


class ControllerReassignments:
    """The real controller's side: each manager call as (part of) an event of its queue, run in
    a worker thread through `KafkaController._carry_out` (which sends the requests)."""

    def __init__(self, controller: KafkaController) -> None:
        self.c = controller
        self.manager = ReassignmentManager(self)

    # -- ReassignmentHost ----------------------------------------------------------------------
    @property
    def controller_label(self) -> int:
        return self.c.broker_id

    def topic_id(self, topic: str) -> UUID | None:
        return self.c.topic_ids.get(topic)

    def topic_being_deleted(self, topic: str) -> bool:
        return topic in self.c.topics_to_be_deleted

    # -- the controller's calls ----------------------------------------------------------------
    @property
    def reassigning(self) -> dict[TopicPartition, ReplicaAssignment]:
        return self.manager.reassigning

    def reset(self) -> None:
        self.manager.reset()

    def topic_is_moving(self, topic: str) -> bool:
        return self.manager.topic_is_moving(topic)

    def list(self, partitions: Iterable[TopicPartition] | None
             ) -> dict[TopicPartition, ReplicaAssignment]:
        return self.manager.list(partitions)

    async def _run(self, call: Callable[[DecisionExecutor], Executed]) -> None:
        m = self.manager
        m.completed_topics.clear()
        await self.c._carry_out(call)
        deletable: Collection[str] = m.completed_topics & self.c.topics_to_be_deleted
        m.completed_topics.clear()
        if deletable:
            await self.c._resume_deletions()

    async def resume(self) -> None:
        topics = sorted(self.c.topics)
        await self._run(lambda ex: self.manager.resume(ex, topics))

    async def on_zk_reassignment(self, exists: bool) -> None:
        await self._run(lambda ex: self.manager.on_zk_reassignment(ex, exists))

    async def on_isr_change(self) -> None:
        await self._run(lambda ex: self.manager.on_isr_change(ex))

    async def on_broker_startup(self, broker_id: int) -> None:
        await self._run(lambda ex: self.manager.on_broker_startup(ex, broker_id))

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
        if self.c.core is None:
            return None
        results: dict[TopicPartition, ApiError] = {}

        def call(ex: DecisionExecutor) -> Executed:
            answer, done = self.manager.alter(ex, targets)
            results.update(answer)
            return done

        await self._run(call)
        if len(results) < len(targets):  # the controller resigned meanwhile
            return {tp: results.get(tp, ApiError(int(ErrorCode.NOT_CONTROLLER)))
                    for tp in targets}
        return results

    async def list_partition_reassignments(
            self, partitions: list[TopicPartition] | None
    ) -> dict[TopicPartition, ReplicaAssignment] | None:
        """An admin's ListPartitionReassignments; None: not the active controller."""
        c = self.c
        if not c.is_active:
            return None

        async def event() -> dict[TopicPartition, ReplicaAssignment] | None:
            return None if c.core is None else self.manager.list(partitions)

        try:
            return await c.enqueue("ListPartitionReassignments", event)
        except ControllerMovedError:
            return None
