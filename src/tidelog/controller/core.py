"""The controller's decisions, pure: cluster state and events in, ZooKeeper writes and
controller requests out.

Kafka's ZooKeeper-mode controller (seed 004) keeps a context — live brokers with their broker
epochs, every partition's (leader, leader epoch, ISR, zk version, controller epoch) and the
assignments — and reacts to broker startup and failure, ISR-change notifications and controlled
shutdown. This module is that reaction without any I/O:

1. an event method (`on_broker_startup`, `on_broker_failure`, `on_isr_change`,
   `controlled_shutdown`, `elect_preferred_leaders`) returns a `Decision`: the new leader/ISR of
   each partition to write to ZooKeeper as a compare-and-set on the zk version it was read at;
2. the shell performs the writes and hands the outcome to `commit(decision, results)`, which
   applies the writes that succeeded (bumping the zk version) and returns the LeaderAndIsr /
   UpdateMetadata / StopReplica requests to send, per broker. A write that failed its
   compare-and-set (a leader changed the ISR meanwhile) is re-read by the shell
   (`refresh_partition`) and the event replayed, as Kafka's controller retries.

Leader choice is `replication/election.py`'s rules, the same code the rest of tidelog uses. One
execute loop (`executor.DecisionExecutor`) carries the decisions out, over the simulated
ZooKeeper in the simulator and over kazoo in the real controller (controller.py).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace

from tidelog.protocol.errors import ErrorCode
from tidelog.replication import election
from tidelog.replication.isr_eligibility import ineligible_replicas_for_isr
from tidelog.replication.types import LeaderAndIsrPartitionState, ProposeIsr, TopicPartition

NO_LEADER = -1
# ElectLeadersRequest's election_type (Kafka's ElectionType)
ELECTION_PREFERRED = 0
ELECTION_UNCLEAN = 1
UNKNOWN_TOPIC_OR_PARTITION = int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
ELECTION_NOT_NEEDED = int(ErrorCode.ELECTION_NOT_NEEDED)
PREFERRED_LEADER_NOT_AVAILABLE = int(ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE)
ELIGIBLE_LEADERS_NOT_AVAILABLE = int(ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE)
KAFKA_STORAGE_ERROR = int(ErrorCode.KAFKA_STORAGE_ERROR)
NONE = int(ErrorCode.NONE)
STALE_BROKER_EPOCH = int(ErrorCode.STALE_BROKER_EPOCH)
NOT_CONTROLLER = int(ErrorCode.NOT_CONTROLLER)
FENCED_LEADER_EPOCH = int(ErrorCode.FENCED_LEADER_EPOCH)
INVALID_UPDATE_VERSION = int(ErrorCode.INVALID_UPDATE_VERSION)
INELIGIBLE_REPLICA = int(ErrorCode.INELIGIBLE_REPLICA)


@dataclass(frozen=True, slots=True)
class PartitionWrite:
    """Write `state` to the partition's state znode iff its version is still `expected_zk_version`."""

    tp: TopicPartition
    state: LeaderAndIsrPartitionState
    expected_zk_version: int


@dataclass(frozen=True, slots=True)
class LeaderAndIsrRequest:
    controller_id: int
    controller_epoch: int
    broker_epoch: int  # the receiver's broker epoch as the controller knows it (KIP-380)
    partition_states: tuple[LeaderAndIsrPartitionState, ...]
    live_leaders: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class UpdateMetadataRequest:
    controller_id: int
    controller_epoch: int
    broker_epoch: int
    partition_states: tuple[LeaderAndIsrPartitionState, ...]
    live_brokers: tuple[tuple[int, int], ...]  # (broker id, broker epoch)
    # Live brokers' replicas whose log dir failed, per partition (the dead brokers' replicas
    # are offline too: the channel adds them from `live_brokers`).
    offline_dir_replicas: tuple[tuple[TopicPartition, tuple[int, ...]], ...] = ()


@dataclass(frozen=True, slots=True)
class StopReplicaRequest:
    controller_id: int
    controller_epoch: int
    broker_epoch: int
    partitions: tuple[TopicPartition, ...]
    delete_partitions: bool


ControllerRequest = LeaderAndIsrRequest | UpdateMetadataRequest | StopReplicaRequest


@dataclass(slots=True)
class Decision:
    writes: list[PartitionWrite] = field(default_factory=list)
    # Partitions whose LeaderAndIsr must be (re)sent even without a write (e.g. to a broker that
    # just started), with the brokers to send it to.
    resend: dict[TopicPartition, set[int]] = field(default_factory=dict)
    stop_replicas: dict[int, set[TopicPartition]] = field(default_factory=dict)
    # StopReplica(delete_partitions=true), after the LeaderAndIsr (a reassignment's removed
    # replicas); a broker not alive is skipped, as Kafka's channel does.
    delete_replicas: dict[int, set[TopicPartition]] = field(default_factory=dict)
    update_metadata: bool = False
    # Partitions the UpdateMetadata names besides those written, resent or stopped (Kafka's
    # addUpdateMetadataRequestForBrokers(brokers, partitions) sends only the partitions an event
    # touched): a dead broker's partitions (their offline replicas changed), the partitions of
    # ISR-change notifications, a moving partition whose assignment changed.
    metadata_partitions: set[TopicPartition] = field(default_factory=set)
    # Started brokers (Kafka's onBrokerStartup): before any other request of the event, every
    # live broker gets an UpdateMetadata naming the live brokers, these ones with every
    # partition's state as cached before the event's writes (a started broker's metadata cache
    # begins empty), the others with none.
    full_metadata_to: set[int] = field(default_factory=set)
    # Partitions that stay offline (no eligible leader): for the shell's statistics.
    offline: list[TopicPartition] = field(default_factory=list)
    # False: the written states go to the replicas in no LeaderAndIsr (an AlterPartition: the
    # leader has the answer, the followers need nothing; Kafka's processAlterPartition sends
    # UpdateMetadata only).
    leader_and_isr: bool = True


@dataclass(slots=True)
class ControllerStats:
    elections: int = 0
    unclean_elections: int = 0
    failed_elections: int = 0
    isr_removals: int = 0


class ControllerCore:
    def __init__(self, controller_id: int, controller_epoch: int, *,
                 unclean_leader_election_enable: bool = False) -> None:
        self.controller_id = controller_id
        self.controller_epoch = controller_epoch
        self.unclean_leader_election_enable = unclean_leader_election_enable
        self.live_brokers: dict[int, int] = {}  # broker id -> broker epoch
        self.shutting_down: set[int] = set()
        self.assignments: dict[TopicPartition, tuple[int, ...]] = {}
        # A partition being reassigned: (adding, removing) beside its RS in `assignments`
        # (Kafka's partitionFullReplicaAssignment), carried by every LeaderAndIsr sent for it.
        self.reassigning: dict[TopicPartition, tuple[tuple[int, ...], tuple[int, ...]]] = {}
        self.partition_states: dict[TopicPartition, LeaderAndIsrPartitionState] = {}
        # Brokers that came back after an unclean shutdown and have not caught up yet: not clean
        # leader candidates (KIP-966's lesson). The shell reports them.
        self.unclean_restarted: dict[TopicPartition, set[int]] = {}
        # Replicas a live broker answered KAFKA_STORAGE_ERROR for (their log dir failed):
        # offline, as dead brokers' replicas are, until the broker registers again (Kafka's
        # replicasOnOfflineDirs).
        self.replicas_on_offline_dirs: dict[int, set[TopicPartition]] = {}
        self.stats = ControllerStats()
        # New partitions are created by `initial_leaders` once the brokers known at start are
        # loaded; after that a broker startup also brings up partitions still without state.
        self.initialized = False

    # -- state loading -------------------------------------------------------------------
    def add_partition(self, tp: TopicPartition, replicas: Iterable[int]) -> None:
        self.assignments[tp] = tuple(replicas)

    def refresh_partition(self, tp: TopicPartition, state: LeaderAndIsrPartitionState) -> None:
        """The partition's state as just read from ZooKeeper (after a failed compare-and-set or
        an ISR-change notification)."""
        self.partition_states[tp] = state
        self._note_caught_up(tp, state)

    def initial_leaders(self) -> Decision:
        """New partitions: leader = first live assigned replica, ISR = live assigned replicas."""
        self.initialized = True
        d = Decision(update_metadata=True)
        for tp in sorted(self.assignments):
            if tp in self.partition_states:
                continue
            w = self._new_partition(tp)
            if w is None:
                d.offline.append(tp)
            else:
                d.writes.append(w)
        return d

    def _new_partition(self, tp: TopicPartition) -> PartitionWrite | None:
        """Kafka's NewPartition -> OnlinePartition: leader = first live assigned replica,
        ISR = the live assigned replicas; None while no replica is alive."""
        replicas = self.assignments[tp]
        live = [r for r in replicas if self.is_replica_online(r, tp)
                and r not in self.shutting_down]
        if not live:
            return None
        state = LeaderAndIsrPartitionState(
            topic=tp.topic, partition=tp.partition, controller_epoch=self.controller_epoch,
            leader=live[0], leader_epoch=0, isr=tuple(live), zk_version=0,
            replicas=tuple(replicas), is_new=True)
        self.stats.elections += 1
        return PartitionWrite(tp, state, -1)

    # -- events --------------------------------------------------------------------------
    def on_broker_startup(self, broker_id: int, broker_epoch: int) -> Decision:
        """A broker registered (or re-registered with a new epoch: treated as bounced)."""
        d = Decision(update_metadata=True, full_metadata_to={broker_id})
        if broker_id in self.live_brokers and self.live_brokers[broker_id] != broker_epoch:
            # KIP-380: a new registration of a live broker is a failure then a startup.
            failed = self.on_broker_failure(broker_id)
            d.writes.extend(failed.writes)
            d.offline.extend(failed.offline)
            d.metadata_partitions |= failed.metadata_partitions
        self.live_brokers[broker_id] = broker_epoch
        self.shutting_down.discard(broker_id)
        self.replicas_on_offline_dirs.pop(broker_id, None)  # a new process, its dirs reloaded
        written = {w.tp for w in d.writes}
        # The writes by partition, in order (an election replaces the failure's write and goes
        # last): a bounce's list looked through per partition was quadratic.
        writes = {w.tp: w for w in d.writes}
        for tp, replicas in sorted(self.assignments.items()):
            if broker_id not in replicas:
                continue
            pending = writes.get(tp)
            state = pending.state if pending is not None else self.partition_states.get(tp)
            if state is None:
                # A new partition none of whose replicas was alive so far.
                w = self._new_partition(tp) if self.initialized else None
                if w is not None:
                    writes[tp] = w
                continue
            if state.leader == NO_LEADER or state.leader not in self.live_brokers:
                w = self._elect(tp, state, reason="offline")
                if w is not None:
                    writes.pop(tp, None)
                    writes[tp] = w
                    continue
                d.offline.append(tp)
            if tp not in written:
                d.resend.setdefault(tp, set()).add(broker_id)
        d.writes = list(writes.values())
        return d

    def on_broker_failure(self, broker_id: int) -> Decision:
        """A broker's registration disappeared: move leadership off it, shrink it out of ISRs."""
        d = Decision(update_metadata=True)
        self.live_brokers.pop(broker_id, None)
        self.shutting_down.discard(broker_id)
        self.replicas_on_offline_dirs.pop(broker_id, None)
        for tp, replicas in sorted(self.assignments.items()):
            if broker_id not in replicas:
                continue
            state = self.partition_states.get(tp)
            if state is None:
                continue
            # Kafka's OfflineReplica transition names every partition of the broker in the
            # UpdateMetadata, changed or not: its offline replicas changed.
            d.metadata_partitions.add(tp)
            if state.leader == broker_id or state.leader not in self.live_brokers:
                w = self._elect(tp, state, reason="offline")
                if w is None:
                    w = self._remove_from_isr(tp, state, broker_id, leaderless=True)
                    d.offline.append(tp)
                if w is not None:
                    d.writes.append(w)
            elif broker_id in state.isr:
                w = self._remove_from_isr(tp, state, broker_id, leaderless=False)
                if w is not None:
                    d.writes.append(w)
        return d

    def offline_brokers(self) -> list[int]:
        """The brokers not alive that a partition state or assignment names. A new controller
        fails each one (Kafka's failover: replicaStateMachine.startup moves their replicas to
        OfflineReplica), so that a partition whose leader died unseen by the old controller gets
        a leader or none (-1), and no replica is told to follow, or lead, a dead leader's
        cached epoch."""
        return sorted({b for tp, s in self.partition_states.items()
                       for b in (s.leader, *s.isr, *self.assignments.get(tp, ()))
                       if b >= 0 and b not in self.live_brokers})

    def is_replica_online(self, broker_id: int, tp: TopicPartition) -> bool:
        """Kafka's isReplicaOnline: a live broker whose log dir holding ``tp`` has not failed."""
        return (broker_id in self.live_brokers
                and tp not in self.replicas_on_offline_dirs.get(broker_id, ()))

    def on_log_dir_failure(self, broker_ids: Iterable[int]) -> Decision:
        """Log dir event notifications (Kafka's onBrokerLogDirFailure): LeaderAndIsr with the
        current state for every replica of these brokers, to learn from their answers which
        replicas are offline (`on_leader_and_isr_response`)."""
        d = Decision(update_metadata=True)
        brokers = {b for b in broker_ids if b in self.live_brokers}
        for tp, replicas in sorted(self.assignments.items()):
            hit = brokers.intersection(replicas)
            if hit and tp in self.partition_states:
                d.resend.setdefault(tp, set()).update(hit)
        return d

    def on_leader_and_isr_response(self, broker_id: int,
                                   errors: Mapping[TopicPartition, int]) -> set[TopicPartition]:
        """Kafka's processLeaderAndIsrResponseReceived: replicas answered KAFKA_STORAGE_ERROR
        are offline, those answered NONE online again. Returns the newly offline ones, for
        `on_replicas_offline` (an event the executor may replay, so it changes no state)."""
        if broker_id not in self.live_brokers:
            return set()
        before = self.replicas_on_offline_dirs.get(broker_id, set())
        now = {tp for tp in before if errors.get(tp) != 0}
        now |= {tp for tp, code in errors.items() if code == KAFKA_STORAGE_ERROR}
        if now:
            self.replicas_on_offline_dirs[broker_id] = now
        else:
            self.replicas_on_offline_dirs.pop(broker_id, None)
        return now - before

    def on_replicas_offline(self, broker_id: int, tps: Iterable[TopicPartition]) -> Decision:
        """Kafka's onReplicasBecomeOffline for one broker's replicas (already recorded offline
        by `on_leader_and_isr_response`): a partition it led gets a
        leader among the online replicas (none: leaderless, as an offline partition); the
        replica leaves the ISR (the last member stays, as Kafka's); the broker stops the
        replicas (StopReplica without deletion, Kafka's OfflineReplica transition). With nothing
        to write, UpdateMetadata still tells every broker (the replicas' offline state)."""
        offline = {tp for tp in tps if tp in self.partition_states}
        d = Decision(update_metadata=True, metadata_partitions=set(offline))
        for tp in sorted(offline):
            state = self.partition_states[tp]
            if state.leader == broker_id or not self.is_replica_online(state.leader, tp):
                # (the election's ISR holds online replicas only)
                w = self._elect(tp, state, reason="offline")
                if w is None:
                    w = self._remove_from_isr(tp, state, broker_id, leaderless=True)
                    d.offline.append(tp)
            else:
                w = self._remove_from_isr(tp, state, broker_id, leaderless=False)
            if w is not None:
                d.writes.append(w)
        if offline and broker_id in self.live_brokers:
            d.stop_replicas[broker_id] = offline
        return d

    def controlled_shutdown(self, broker_id: int) -> Decision:
        """Move every leadership off `broker_id` and shrink it out of every ISR; then stop its
        replicas (without deleting them)."""
        d = Decision(update_metadata=True)
        self.shutting_down.add(broker_id)
        stop: set[TopicPartition] = set()
        for tp, replicas in sorted(self.assignments.items()):
            if broker_id not in replicas:
                continue
            state = self.partition_states.get(tp)
            if state is None:
                continue
            stop.add(tp)
            if state.leader == broker_id:
                w = self._elect(tp, state, reason="controlled_shutdown")
                if w is not None:
                    d.writes.append(w)
                    continue
            if broker_id in state.isr and len(state.isr) > 1:
                w = self._remove_from_isr(tp, state, broker_id, leaderless=False)
                if w is not None:
                    d.writes.append(w)
        if stop:
            d.stop_replicas[broker_id] = stop
        return d

    def on_isr_change(self, states: Mapping[TopicPartition, LeaderAndIsrPartitionState]) -> Decision:
        """ISR-change notifications: the re-read states, then UpdateMetadata of those
        partitions to every live broker (Kafka's processIsrChangeNotification)."""
        for tp, state in states.items():
            self.partition_states[tp] = state
            self._note_caught_up(tp, state)
        return Decision(update_metadata=True, metadata_partitions=set(states))

    def alter_partition(self, broker_id: int, broker_epoch: int,
                        proposals: Iterable[ProposeIsr], *, check_eligibility: bool = True
                        ) -> tuple[Decision, int, dict[TopicPartition, int]]:
        """A leader's AlterPartition (KIP-497; Kafka's tryProcessAlterPartition on its
        ControllerContext): (the writes, the request's error, each partition's error: NONE for
        one answered with its state after the writes). Each proposal is checked against the
        cached state, which only this controller's writes change: a broker epoch not the
        sender's registration -> STALE_BROKER_EPOCH for the whole request; an unknown partition
        -> UNKNOWN_TOPIC_OR_PARTITION; a leader or partition epoch (zk version) above the
        cache's -> NOT_CONTROLLER (this controller is behind); a lower leader epoch ->
        FENCED_LEADER_EPOCH; the state already as proposed -> answered as it is (a retry);
        a lower zk version -> INVALID_UPDATE_VERSION; a member not registered, shutting down
        or registered under another broker epoch than the leader names -> INELIGIBLE_REPLICA
        (KIP-841/903; ``check_eligibility`` False only in the simulator's scenarios without
        the rule). The rest is written with this controller's epoch; every partition named
        goes in an UpdateMetadata, except for a refused request (Kafka answers it at once)."""
        if self.live_brokers.get(broker_id) != broker_epoch:
            return Decision(), STALE_BROKER_EPOCH, {}
        d = Decision(update_metadata=True, leader_and_isr=False)
        errors: dict[TopicPartition, int] = {}
        for prop in proposals:
            tp = prop.tp
            state = self.partition_states.get(tp)
            if state is None or tp not in self.assignments:
                errors[tp] = UNKNOWN_TOPIC_OR_PARTITION
                continue
            d.metadata_partitions.add(tp)
            new_isr = tuple(sorted(prop.new_isr))
            if prop.zk_version > state.zk_version or prop.leader_epoch > state.leader_epoch:
                errors[tp] = NOT_CONTROLLER
            elif prop.leader_epoch < state.leader_epoch:
                errors[tp] = FENCED_LEADER_EPOCH
            elif broker_id == state.leader and new_isr == tuple(sorted(state.isr)):
                errors[tp] = NONE
            elif prop.zk_version < state.zk_version:
                errors[tp] = INVALID_UPDATE_VERSION
            elif check_eligibility and ineligible_replicas_for_isr(
                    prop.isr_with_broker_epochs or tuple((b, -1) for b in new_isr),
                    lambda b: None if b in self.shutting_down else self.live_brokers.get(b)):
                errors[tp] = INELIGIBLE_REPLICA
            else:
                errors[tp] = NONE
                d.writes.append(PartitionWrite(tp, replace(
                    state, leader=broker_id, isr=new_isr,
                    controller_epoch=self.controller_epoch, is_new=False), state.zk_version))
        return d, NONE, errors

    def elect_offline_leaders(self, topics: Collection[str]) -> Decision:
        """Elect a leader for every partition of `topics` without a live one (Kafka's
        triggerOnlinePartitionStateChange after unclean.leader.election.enable was turned on
        for a topic: its offline partitions may now take an out-of-sync leader)."""
        d = Decision(update_metadata=True)
        for tp, state in sorted(self.partition_states.items()):
            if tp.topic not in topics:
                continue
            if state.leader != NO_LEADER and state.leader in self.live_brokers:
                continue
            w = self._elect(tp, state, reason="offline")
            if w is None:
                d.offline.append(tp)
            else:
                d.writes.append(w)
        return d

    def elect_preferred_leaders(self) -> Decision:
        d = Decision(update_metadata=True)
        for tp, state in sorted(self.partition_states.items()):
            w = self._elect(tp, state, reason="preferred")
            if w is not None and w.state.leader != state.leader:
                d.writes.append(w)
        return d

    def elect_leaders(self, partitions: Iterable[TopicPartition], election_type: int
                      ) -> tuple[Decision, dict[TopicPartition, tuple[int, str | None, int]]]:
        """An admin's ElectLeaders (Kafka's processReplicaLeaderElection, AdminClientTriggered):
        per partition (error code, message, the leader elected). PREFERRED (0) moves the
        leadership to the first assigned replica if it is alive and in the ISR; UNCLEAN (1)
        elects a leader for a partition without a live one, out of the ISR if need be.
        ELECTION_NOT_NEEDED when the partition already has such a leader; a failed election is
        PREFERRED_LEADER_NOT_AVAILABLE / ELIGIBLE_LEADERS_NOT_AVAILABLE."""
        d = Decision(update_metadata=True)
        out: dict[TopicPartition, tuple[int, str | None, int]] = {}
        preferred = election_type == ELECTION_PREFERRED
        for tp in partitions:
            state = self.partition_states.get(tp)
            replicas = self.assignments.get(tp)
            if replicas is None:
                out[tp] = (UNKNOWN_TOPIC_OR_PARTITION, "The partition does not exist.", -1)
                continue
            live = state is not None and state.leader != NO_LEADER \
                and state.leader in self.live_brokers
            if state is not None and (state.leader == replicas[0] if preferred else live):
                out[tp] = (ELECTION_NOT_NEEDED, None, -1)
                continue
            w = None if state is None else self._elect(
                tp, state, reason="preferred" if preferred else "unclean")
            if w is None:
                strategy = ("PreferredReplicaPartitionLeaderElectionStrategy" if preferred
                            else "OfflinePartitionLeaderElectionStrategy(true)")
                out[tp] = (PREFERRED_LEADER_NOT_AVAILABLE if preferred
                           else ELIGIBLE_LEADERS_NOT_AVAILABLE,
                           f"Failed to elect leader for partition {tp.topic}-{tp.partition}"
                           f" under strategy {strategy}", -1)
                continue
            d.writes.append(w)
            out[tp] = (0, None, w.state.leader)
        return d, out

    def unclean_enabled_for(self, topic: str) -> bool:
        """unclean.leader.election.enable as it applies to `topic`."""
        return self.unclean_leader_election_enable

    def mark_unclean_restart(self, broker_id: int) -> None:
        """`broker_id` registered after an unclean shutdown: until it is back in a partition's
        ISR under another leader, it is no clean leader candidate for that partition."""
        for tp, replicas in self.assignments.items():
            if broker_id in replicas:
                self.unclean_restarted.setdefault(tp, set()).add(broker_id)

    def _note_caught_up(self, tp: TopicPartition, state: LeaderAndIsrPartitionState) -> None:
        dirty = self.unclean_restarted.get(tp)
        if dirty and state.leader not in (NO_LEADER, None):
            dirty.difference_update(b for b in state.isr if b != state.leader)

    # -- commit ----------------------------------------------------------------------------
    def commit(self, decision: Decision,
               results: Mapping[TopicPartition, int | None]) -> dict[int, list[ControllerRequest]]:
        """Apply the writes that succeeded (`results[tp]` = new zk version, None = failed) and
        build the requests to send per broker."""
        out: dict[int, list[ControllerRequest]] = {}
        live = tuple(sorted(self.live_brokers.items()))
        offline = self._offline_replicas()
        if decision.full_metadata_to:
            # Kafka's onBrokerStartup sends this UpdateMetadata before the started broker's
            # LeaderAndIsr: the broker knows the live brokers and this controller (where its
            # leaders send AlterPartition) and has a metadata cache when its replicas start.
            everything = tuple(s for _, s in sorted(self.partition_states.items()))
            for broker, epoch in live:
                out[broker] = [UpdateMetadataRequest(
                    self.controller_id, self.controller_epoch, epoch,
                    everything if broker in decision.full_metadata_to else (), live, offline)]
        leader_and_isr: dict[int, list[LeaderAndIsrPartitionState]] = {}
        for w in decision.writes:
            version = results.get(w.tp)
            if version is None:
                continue
            state = replace(w.state, zk_version=version)
            self.partition_states[w.tp] = state
            self._note_caught_up(w.tp, state)
            if not decision.leader_and_isr:
                continue
            for r in self.assignments.get(w.tp, ()):
                if self.is_replica_online(r, w.tp) and r not in self.shutting_down:
                    leader_and_isr.setdefault(r, []).append(state)
        # (a set per broker: a started broker's 10,000 resent partitions each looked through
        # its list took 2 s of the controller's CPU)
        written_to = {r: {s.tp for s in states} for r, states in leader_and_isr.items()}
        for tp, brokers in decision.resend.items():
            state = self.partition_states.get(tp)
            if state is None:
                continue
            for r in brokers:
                if r in self.live_brokers and tp not in written_to.get(r, ()):
                    leader_and_isr.setdefault(r, []).append(state)
        for broker, states in sorted(leader_and_isr.items()):
            leaders = tuple(sorted({s.leader for s in states if s.leader in self.live_brokers}))
            out.setdefault(broker, []).append(LeaderAndIsrRequest(
                self.controller_id, self.controller_epoch, self.live_brokers[broker],
                tuple(self._with_reassignment(s, broker) for s in states), leaders))
        for stops, delete in ((decision.stop_replicas, False), (decision.delete_replicas, True)):
            for broker, tps in sorted(stops.items()):
                if broker in self.live_brokers:
                    out.setdefault(broker, []).append(StopReplicaRequest(
                        self.controller_id, self.controller_epoch, self.live_brokers[broker],
                        tuple(sorted(tps)), delete))
        if decision.update_metadata:
            # The partitions the event touched, not all of them: at 10,000 partitions a full
            # UpdateMetadata per ISR-change notification kept the controller and every broker
            # busy for seconds each. The brokers' metadata caches merge what they receive.
            touched = {w.tp for w in decision.writes if results.get(w.tp) is not None}
            touched.update(decision.resend, decision.metadata_partitions)
            for stopped in (*decision.stop_replicas.values(), *decision.delete_replicas.values()):
                touched.update(stopped)
            changed = tuple(self.partition_states[tp] for tp in sorted(touched)
                            if tp in self.partition_states)
            for broker, epoch in live:
                out.setdefault(broker, []).append(UpdateMetadataRequest(
                    self.controller_id, self.controller_epoch, epoch, changed, live, offline))
        return out

    def _offline_replicas(self) -> tuple[tuple[TopicPartition, tuple[int, ...]], ...]:
        """UpdateMetadata's offline replicas: per partition, the brokers whose log dir holding
        it failed."""
        offline_dirs: dict[TopicPartition, list[int]] = {}
        for broker, tps in sorted(self.replicas_on_offline_dirs.items()):
            for tp in tps:
                offline_dirs.setdefault(tp, []).append(broker)
        return tuple((tp, tuple(bs)) for tp, bs in sorted(offline_dirs.items()))

    def _with_reassignment(self, state: LeaderAndIsrPartitionState,
                           broker: int) -> LeaderAndIsrPartitionState:
        """Kafka's addLeaderAndIsrRequestForBrokers: the full replica assignment; to a joining
        replica the partition is new (Kafka's NewReplica transition), so its broker creates
        the log even while one of its log dirs is offline."""
        moving = self.reassigning.get(state.tp)
        if moving is None:
            return state
        adding, removing = moving
        return replace(state, adding_replicas=adding, removing_replicas=removing,
                       is_new=state.is_new or broker in adding)

    # -- rules -----------------------------------------------------------------------------
    def _elect(self, tp: TopicPartition, state: LeaderAndIsrPartitionState,
               reason: str) -> PartitionWrite | None:
        replicas = tuple(self.assignments.get(tp, state.replicas))
        online = {b for b in self.live_brokers if self.is_replica_online(b, tp)}
        live = online - self.shutting_down
        if reason == "controlled_shutdown":
            result = election.controlled_shutdown_leader_election(
                replicas, state.isr, online, self.shutting_down)
        elif reason == "preferred":
            # Not onto a replica back from an unclean shutdown (KIP-966), as offline elections.
            result = election.preferred_replica_leader_election(
                replicas, state.isr, live - self.unclean_restarted.get(tp, set()))
        else:
            # "unclean": an admin's UNCLEAN election allows an out-of-sync leader whatever
            # unclean.leader.election.enable says.
            result = election.offline_partition_leader_election(
                replicas, state.isr, live,
                reason == "unclean" or self.unclean_leader_election_enable,
                not_clean_candidates=tuple(sorted(self.unclean_restarted.get(tp, ()))))
        if result.leader is None:
            self.stats.failed_elections += 1
            return None
        self.stats.elections += 1
        if result.unclean:
            self.stats.unclean_elections += 1
        new = replace(state, leader=result.leader, leader_epoch=state.leader_epoch + 1,
                      isr=tuple(result.isr), controller_epoch=self.controller_epoch,
                      replicas=replicas, is_new=False)
        return PartitionWrite(tp, new, state.zk_version)

    def _remove_from_isr(self, tp: TopicPartition, state: LeaderAndIsrPartitionState,
                         broker_id: int, leaderless: bool) -> PartitionWrite | None:
        # Kafka keeps the last member in the ISR, so that it can lead again when it returns.
        leader, isr = election.remove_replica_from_isr(state.leader, state.isr, broker_id)
        if leaderless:
            leader = NO_LEADER
        if tuple(isr) == tuple(state.isr) and leader == state.leader:
            return None
        if len(isr) < len(state.isr):
            self.stats.isr_removals += 1
        new = replace(state, leader=leader, leader_epoch=state.leader_epoch + 1, isr=tuple(isr),
                      controller_epoch=self.controller_epoch, is_new=False)
        return PartitionWrite(tp, new, state.zk_version)
