"""The one execute loop for the controller's decisions: `ControllerCore`'s pure decisions
applied through a `ZooKeeperClient`, the same for the real controller (controller.py, over
kazoo, run in a worker thread) and the simulated one (sim/controller.py, over SimZooKeeper).

An event runs the core (`Decision`); its partition states are written as compare-and-sets on
the state znodes' versions, fenced by the controller epoch's znode version (a deposed
controller's write raises `ControllerMovedError`); the results are committed into the core,
which answers with the LeaderAndIsr / UpdateMetadata / StopReplica requests per broker. A lost
compare-and-set (a leader changed the ISR meanwhile) re-reads the partition and replays the
event, a bounded number of times. The KIP-966 marks the core keeps are then persisted when they
changed. The caller sends the requests, in order.

Broker changes take one path too: `on_broker_registrations` compares `/brokers/ids` with the
live brokers the core knows (at a failover the core knows none, so every registered broker
counts as started) and marks, KIP-966, every started or bounced broker whose registration says
it did not shut down cleanly; the caller then runs `broker_failure` / `broker_startup` for each.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from tidelog.controller.core import ControllerCore, ControllerRequest, Decision
from tidelog.controller.zk_data import BrokerInfo, LeaderIsrAndControllerEpoch, TopicPartitionT
from tidelog.controller.zk_interface import (
    NoTopicError,
    ZooKeeperClient,
    from_zk_state,
    to_zk_state,
)
from tidelog.protocol.errors import ErrorCode
from tidelog.replication.types import LeaderAndIsrPartitionState, ProposeIsr, TopicPartition

__all__ = ["MAX_EVENT_ATTEMPTS", "AlterPartitionOutcome", "BrokerChanges", "DecisionExecutor",
           "Executed"]

log = logging.getLogger(__name__)

MAX_EVENT_ATTEMPTS = 5


@dataclass(slots=True)
class Executed:
    """What one event did: its last decision, the requests to send (one batch per attempt,
    in order) and the partition states written."""

    decision: Decision
    requests: list[dict[int, list[ControllerRequest]]] = field(default_factory=list)
    written: list[LeaderAndIsrPartitionState] = field(default_factory=list)


@dataclass(slots=True)
class AlterPartitionOutcome:
    """An AlterPartition handled: what was done, the request's error, each partition's error
    and, for those answered NONE, the state they now have."""

    executed: Executed
    error: int
    errors: dict[TopicPartition, int]
    states: dict[TopicPartition, LeaderAndIsrPartitionState]

    @property
    def written(self) -> list[TopicPartition]:
        return [TopicPartition(s.topic, s.partition) for s in self.executed.written]

    def partition_answers(
            self) -> Iterator[tuple[TopicPartition, int, LeaderAndIsrPartitionState | None]]:
        """Each partition's answer: its error and no state, or NONE and the state it now has
        (a NONE with no state known is UNKNOWN_TOPIC_OR_PARTITION)."""
        for tp, error in self.errors.items():
            state = self.states.get(tp) if error == 0 else None
            if state is None:
                yield tp, error or int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION), None
            else:
                yield tp, 0, state


@dataclass(frozen=True, slots=True)
class BrokerChanges:
    """Kafka's BrokerChange event: registrations gone, new, or new under another broker epoch
    (a bounce: a failure, then a startup), each sorted by broker id."""

    dead: tuple[int, ...]
    started: tuple[int, ...]
    bounced: tuple[int, ...]

    def __bool__(self) -> bool:
        return bool(self.dead or self.started or self.bounced)


class DecisionExecutor:
    """Carries out one controller's decisions (one per controller epoch)."""

    def __init__(self, zk: ZooKeeperClient, core: ControllerCore, epoch_zk_version: int | None,
                 *, on_topic_gone: Callable[[str], object] = lambda topic: None,
                 kip966_unclean_restart_rule: bool = True,
                 kip841_eligibility: bool = True) -> None:
        self.zk = zk
        self.core = core
        self.epoch_zk_version = epoch_zk_version
        # A topic deleted while a partition of it was being created: the caller forgets it.
        self.on_topic_gone = on_topic_gone
        self._persisted_marks: dict[TopicPartitionT, tuple[int, ...]] = {}
        # Off only in the simulator's scenarios that show what goes wrong without the rule.
        self.kip966_unclean_restart_rule = kip966_unclean_restart_rule
        # AlterPartition's INELIGIBLE_REPLICA check (KIP-841/903); off as the line above.
        self.kip841_eligibility = kip841_eligibility

    # -- failover ----------------------------------------------------------------------------
    def load_unclean_marks(self) -> None:
        """The KIP-966 marks an earlier controller persisted, for the partitions assigned."""
        marks = self.zk.get_unclean_replicas()
        for tp, ids in marks.items():
            key = TopicPartition(*tp)
            if key in self.core.assignments and ids:
                self.core.unclean_restarted[key] = set(ids)
        self._persisted_marks = self._marks()

    def refresh(self, tps: Iterable[TopicPartition]) -> None:
        """Re-read these partitions' states into the core (as Kafka's removeReplicasFromIsr /
        electLeaderForPartitions decide on ZooKeeper's state, not on a cache a leader's ISR
        change may have made stale)."""
        core = self.core
        wanted = [tp for tp in tps if tp in core.assignments]
        if not wanted:
            return
        for tp, s in self.zk.get_partition_states(wanted).items():
            key = TopicPartition(*tp)
            core.refresh_partition(key, from_zk_state(key, s, core.assignments[key]))

    # -- broker changes ------------------------------------------------------------------------
    def on_broker_registrations(
            self, registered: Mapping[int, tuple[BrokerInfo, int]]) -> BrokerChanges:
        """`registered` (broker id -> (registration, broker epoch), as read from /brokers/ids)
        against the core's live brokers. A started or bounced broker whose registration says
        it did not shut down cleanly is marked now (KIP-966: its log may have lost an
        acknowledged tail; no clean leader candidate until back in an ISR under another
        leader), before any decision or partition re-read that could clear the mark."""
        known = self.core.live_brokers
        changes = BrokerChanges(
            dead=tuple(sorted(set(known) - set(registered))),
            started=tuple(sorted(b for b in registered if b not in known)),
            bounced=tuple(sorted(b for b, (_, epoch) in registered.items()
                                 if b in known and known[b] != epoch)))
        if self.kip966_unclean_restart_rule:
            for b in (*changes.bounced, *changes.started):
                if registered[b][0].clean_shutdown is False:
                    self.core.mark_unclean_restart(b)
        return changes

    def partitions_of(self, broker_id: int) -> list[TopicPartition]:
        """The partitions with a state that `broker_id` is a replica of."""
        core = self.core
        return sorted(tp for tp, rs in core.assignments.items()
                      if broker_id in rs and tp in core.partition_states)

    def broker_failure(self, broker_id: int) -> Executed:
        return self.execute(lambda: self.core.on_broker_failure(broker_id),
                            self.partitions_of(broker_id))

    def broker_startup(self, broker_id: int, broker_epoch: int) -> Executed:
        """Kafka's onBrokerStartup decides on its ControllerContext: the started broker's
        replicas go online with the cached states (their LeaderAndIsr), and only the partitions
        to elect (offline: no leader or a dead one) are re-read, as electLeaderForPartitions
        reads them. Leaders change only by this controller's own epoch-fenced writes, so the
        cached leader says which ones need it; a cached ISR a leader changed since only travels
        in the resent LeaderAndIsr / UpdateMetadata (as Kafka's), and any write of a stale
        version loses its compare-and-set and is re-read and replayed. A bounce (a registration
        under another broker epoch) is first a failure: every partition of the broker re-read,
        as Kafka's onBrokerFailure (removeReplicasFromIsr) reads them."""
        core = self.core
        if core.live_brokers.get(broker_id, broker_epoch) != broker_epoch:
            refresh = self.partitions_of(broker_id)
        else:
            refresh = [tp for tp in self.partitions_of(broker_id)
                       if core.partition_states[tp].leader not in core.live_brokers]
        return self.execute(lambda: core.on_broker_startup(broker_id, broker_epoch), refresh)

    # -- events ------------------------------------------------------------------------------
    def execute(self, event: Callable[[], Decision], refresh: Iterable[TopicPartition] = (),
                attempts: int = MAX_EVENT_ATTEMPTS) -> Executed:
        """Refresh `refresh`, run `event`, write, commit; replay on a lost compare-and-set."""
        core = self.core
        self.refresh(refresh)
        done: Executed | None = None
        for attempt in range(attempts):
            decision = event()
            results = self._write(decision) if decision.writes else {}
            if done is None:
                done = Executed(decision)
            done.decision = decision
            done.written.extend(
                w.state for w in decision.writes if results.get(w.tp) is not None)
            done.requests.append(core.commit(decision, results))
            failed = [w.tp for w in decision.writes if results.get(w.tp) is None]
            if not failed:
                break
            if attempt == attempts - 1:
                log.warning("controller %d: giving up on %d partition state writes",
                            core.controller_id, len(failed))
                break
            self.refresh(failed)
        self.persist_unclean_marks()
        assert done is not None
        return done

    def elect_leaders(self, partitions: Iterable[TopicPartition], election_type: int
                      ) -> tuple[Executed, dict[TopicPartition, tuple[int, str | None, int]]]:
        """An admin's ElectLeaders (Kafka's processReplicaLeaderElection): the partitions'
        states re-read (a leader may have changed an ISR meanwhile), the core's elections
        written; per partition (error code, message, leader elected)."""
        core = self.core
        partitions = list(partitions)
        outcome: dict[TopicPartition, tuple[int, str | None, int]] = {}

        def event() -> Decision:
            decision, results = core.elect_leaders(partitions, election_type)
            for tp, result in results.items():
                # A replay after a lost compare-and-set sees the partitions already elected
                # by the first attempt as not needing an election: they keep their result.
                previous = outcome.get(tp)
                if previous is None or previous[0] != 0 or result[0] == 0:
                    outcome[tp] = result
            return decision

        done = self.execute(event, [tp for tp in partitions if tp in core.partition_states])
        for tp, (code, _, leader) in list(outcome.items()):
            state = core.partition_states.get(tp)
            if code == 0 and (state is None or state.leader != leader):
                # The write lost every compare-and-set: nothing was elected.
                outcome[tp] = (int(ErrorCode.UNKNOWN_SERVER_ERROR), None, -1)
        return done, outcome

    def add_partitions(self, topic: str, assignment: Mapping[int, Iterable[int]]
                       ) -> Executed | None:
        """Kafka's processPartitionModifications: the partitions of the topic znode the core
        does not know yet are new, created like a new topic's (leader = first live replica,
        ISR = the live replicas). None when there is none."""
        core = self.core
        added = {p: tuple(r) for p, r in assignment.items()
                 if TopicPartition(topic, p) not in core.assignments}
        if not added:
            return None
        for p, replicas in sorted(added.items()):
            core.add_partition(TopicPartition(topic, p), replicas)
        log.info("controller %d: new partitions of %s: %s", core.controller_id, topic, added)
        return self.execute(core.initial_leaders)

    def on_isr_change_notifications(self) -> Executed | None:
        """Kafka's IsrChangeNotification event: read and delete the pending notifications,
        re-read the partitions they name, UpdateMetadata to every live broker. None when there
        was no notification."""
        zk, core = self.zk, self.core
        seqs = zk.get_all_isr_change_notifications()
        if not seqs:
            return None
        tps = zk.get_partitions_from_isr_change_notifications(seqs)
        zk.delete_isr_change_notifications(seqs, self.epoch_zk_version)
        known = sorted(TopicPartition(*tp) for tp in tps if TopicPartition(*tp) in core.assignments)
        states = {TopicPartition(*tp): from_zk_state(TopicPartition(*tp), s,
                                                     core.assignments[TopicPartition(*tp)])
                  for tp, s in zk.get_partition_states(known).items()}
        return self.execute(lambda: core.on_isr_change(states))

    def alter_partition(self, broker_id: int, broker_epoch: int,
                        proposals: Sequence[ProposeIsr]) -> AlterPartitionOutcome:
        """A leader's AlterPartition (KIP-497, Kafka's processAlterPartition): the core checks
        each proposal against its cached states and the accepted ones are written, a
        compare-and-set on the zk version the leader named; UpdateMetadata of the named
        partitions goes to every live broker, no LeaderAndIsr. A write that lost its
        compare-and-set is re-read and checked again (then INVALID_UPDATE_VERSION, as Kafka's
        badVersion answer). The answer names every partition: its error, or the state it now
        has (the new zk version is the partition epoch)."""
        core = self.core
        errors: dict[TopicPartition, int] = {}
        top: list[int] = []

        def event() -> Decision:
            decision, error, answers = core.alter_partition(
                broker_id, broker_epoch, proposals, check_eligibility=self.kip841_eligibility)
            top.append(error)
            errors.update(answers)
            return decision

        done = self.execute(event)
        states = {tp: core.partition_states[tp] for tp, e in errors.items()
                  if e == 0 and tp in core.partition_states}
        return AlterPartitionOutcome(done, top[-1], errors, states)

    # -- log dir failures (Kafka's JBOD handling in ZooKeeper mode) ----------------------------
    def on_log_dir_event_notifications(self) -> Executed | None:
        """Kafka's processLogDirEventNotification: LeaderAndIsr for every replica of the brokers
        whose log dir failed (their answers say which replicas are offline:
        `on_leader_and_isr_response`), then the handled notifications are deleted. None when
        there was no notification."""
        zk, core = self.zk, self.core
        seqs = zk.get_all_log_dir_event_notifications()
        if not seqs:
            return None
        try:
            brokers = zk.get_broker_ids_from_log_dir_events(seqs)
            log.info("controller %d: log dir failure on brokers %s", core.controller_id,
                     sorted(set(brokers)))
            return self.execute(lambda: core.on_log_dir_failure(brokers))
        finally:
            zk.delete_log_dir_event_notifications(seqs, self.epoch_zk_version)

    def leader_and_isr_response_matters(self, broker_id: int,
                                        errors: Mapping[TopicPartition, int]) -> bool:
        """A LeaderAndIsr answer is an event (Kafka's LeaderAndIsrResponseReceived) when it
        names KAFKA_STORAGE_ERROR, or comes from a broker with replicas offline (an answer
        without the error brings one back); others change nothing."""
        return (int(ErrorCode.KAFKA_STORAGE_ERROR) in errors.values()
                or broker_id in self.core.replicas_on_offline_dirs)

    def on_leader_and_isr_response(self, broker_id: int, broker_epoch: int,
                                   errors: Mapping[TopicPartition, int]) -> Executed | None:
        """Kafka's processLeaderAndIsrResponseReceived for an answer of `broker_id` to a
        LeaderAndIsr sent to its registration `broker_epoch`: replicas answered
        KAFKA_STORAGE_ERROR are offline (leaders elected elsewhere, out of the ISR, stopped).
        None when nothing became offline or the answer is from an earlier registration."""
        core = self.core
        if core.live_brokers.get(broker_id) != broker_epoch:
            return None
        offline = core.on_leader_and_isr_response(broker_id, errors)
        if not offline:
            return None
        log.warning("controller %d: replicas %s on broker %d are offline (log dir failed)",
                    core.controller_id, sorted(offline), broker_id)
        return self.execute(lambda: core.on_replicas_offline(broker_id, offline), offline)

    def _write(self, decision: Decision) -> dict[TopicPartition, int | None]:
        """Creates (per topic), then every compare-and-set pipelined: tp -> new zk version,
        None for a write that failed."""
        results: dict[TopicPartition, int | None] = {}
        creates: dict[str, dict[TopicPartitionT, LeaderIsrAndControllerEpoch]] = {}
        updates: list[tuple[TopicPartitionT, LeaderIsrAndControllerEpoch, int]] = []
        for w in decision.writes:
            if w.expected_zk_version < 0:
                creates.setdefault(w.tp.topic, {})[w.tp] = to_zk_state(w.state)
            else:
                updates.append((w.tp, to_zk_state(w.state), w.expected_zk_version))
        for topic, states in sorted(creates.items()):
            try:
                created = self.zk.create_partition_states(states, self.epoch_zk_version)
            except NoTopicError:
                self.on_topic_gone(topic)
                for tp in states:
                    results[TopicPartition(*tp)] = None
                continue
            for tp, ok in created.items():
                results[TopicPartition(*tp)] = 0 if ok else None
        if updates:
            for tp, (ok, version) in self.zk.update_leader_and_isr_many(
                    updates, self.epoch_zk_version).items():
                results[TopicPartition(*tp)] = version if ok else None
        return results

    # -- KIP-966 marks -------------------------------------------------------------------------
    def _marks(self) -> dict[TopicPartitionT, tuple[int, ...]]:
        return {(tp.topic, tp.partition): tuple(sorted(ids))
                for tp, ids in sorted(self.core.unclean_restarted.items()) if ids}

    def persist_unclean_marks(self) -> None:
        marks = self._marks()
        if marks != self._persisted_marks:
            self.zk.set_unclean_replicas(marks, self.epoch_zk_version)
            self._persisted_marks = marks
