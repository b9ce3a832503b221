"""The simulated controller: `controller/core.py`'s decisions carried out over the simulated
ZooKeeper and network, by the execute loop the real controller runs (controller/executor.py).

As Kafka's ZooKeeper-mode controller it watches `/brokers/ids` (a registration that appears,
disappears or changes its creation zxid — the broker epoch — is a startup, a failure or a bounce)
and `/isr_change_notification` (then re-reads those partitions' states and sends UpdateMetadata;
no simulated broker writes one: their leaders send AlterPartition, `alter_partition`),
`/log_dir_event_notification` (then LeaderAndIsr to the broker whose log dir failed) and the
brokers' LeaderAndIsr answers (replicas answered KAFKA_STORAGE_ERROR are offline: leaders
elected elsewhere), each handled by the real controller's code in `DecisionExecutor`.
`DecisionExecutor` writes the leader/ISR changes to `/brokers/topics/<t>/partitions/<p>/state`
as compare-and-sets on the zk version, fenced by `/controller_epoch`'s version, and keeps the
KIP-966 marks in ZooKeeper; the requests it returns (LeaderAndIsr / UpdateMetadata /
StopReplica) travel the network like any other message. The controller is modelled as
co-located with ZooKeeper (its reads and writes are immediate). A controller failover is a new
`SimController` with a higher controller epoch, which re-reads everything, starts the registered
brokers and fails the dead ones the partition states still name (as the real controller's
failover); a write of the old one after that fails with `ControllerMovedError` and it resigns.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any
from uuid import UUID

from tidelog.controller import zk_data
from tidelog.controller.core import ControllerCore, Decision, StopReplicaRequest
from tidelog.controller.executor import (
    AlterPartitionOutcome,
    DecisionExecutor,
    Executed,
)
from tidelog.controller.reassignment import ApiError
from tidelog.controller.reassignment_manager import ReassignmentManager
from tidelog.controller.zk_interface import ControllerMovedError
from tidelog.coordinator.transaction.log import TRANSACTION_STATE_TOPIC_NAME
from tidelog.protocol.errors import ErrorCode
from tidelog.replication.types import ProposeIsr, TopicPartition
from tidelog.shell.alter_partition_manager import AlterPartitionAnswer, PartitionAnswer
from tidelog.sim.messages import CONTROLLER_NODE, ControllerMessage, ControllerResponse

if TYPE_CHECKING:  # pragma: no cover
    from tidelog.sim.cluster import SimCluster

BROKERS = zk_data.BROKER_IDS_PATH


def alter_partition_answer(outcome: AlterPartitionOutcome) -> AlterPartitionAnswer:
    """The controller's outcome as the leader's manager reads it (what the wire carries)."""
    return AlterPartitionAnswer(outcome.error, {
        tp: PartitionAnswer(error) if s is None else PartitionAnswer(
            0, s.leader, s.leader_epoch, tuple(s.isr), s.zk_version)
        for tp, error, s in outcome.partition_answers()})


class SimController:
    def __init__(self, cluster: SimCluster, controller_id: int = CONTROLLER_NODE) -> None:
        self.cluster = cluster
        self.zk = cluster.zk
        self.controller_id = controller_id
        # Kafka's registerControllerAndIncrementControllerEpoch, one step in the simulator.
        path = zk_data.CONTROLLER_EPOCH_PATH
        data, version = self.zk.get_data_and_version(path)
        epoch = (zk_data.decode_controller_epoch(data) if data is not None else 0) + 1
        if data is None:
            self.zk.create_path(path, zk_data.encode_controller_epoch(epoch))
        else:
            self.zk.conditional_update_path(path, zk_data.encode_controller_epoch(epoch), version)
        self.core = ControllerCore(
            controller_id, epoch,
            unclean_leader_election_enable=cluster.config.replication.unclean_leader_election_enable)
        self.executor = DecisionExecutor(
            self.zk, self.core, self.zk.get_data_and_version(path)[1],
            kip966_unclean_restart_rule=cluster.config.kip966_unclean_restart_rule,
            kip841_eligibility=cluster.config.kip841_eligibility)
        self.active = True
        self.sent_requests = 0
        # KIP-455 moves: the real controller's phases (controller/reassignment_manager.py).
        self.reassignments = ReassignmentManager(self)
        # StopReplica(delete=true) sent: (broker, partition) -> ZooKeeper's state then, for
        # the RemovedReplicaDeletedLate check (sim/invariants.py).
        self.on_delete_sent: Callable[[int, TopicPartition], None] | None = None

    @property
    def stats(self) -> Any:
        return self.core.stats

    # -- ReassignmentHost ------------------------------------------------------------------
    @property
    def controller_label(self) -> int:
        return self.controller_id

    def topic_id(self, topic: str) -> UUID | None:
        return None  # the simulated topic znode carries no id

    def topic_being_deleted(self, topic: str) -> bool:
        return False

    def start(self) -> None:
        core = self.core
        topic = self.cluster.config.topic
        # The assignment as ZooKeeper holds it: a move in progress has its full replica set.
        # `__transaction_state` too when the run has transactions (it is never moved).
        for t in (topic, TRANSACTION_STATE_TOPIC_NAME):
            for p, replicas in sorted((self.zk.get_topic_assignment(t) or {}).items()):
                core.add_partition(TopicPartition(t, p), replicas)
        self.executor.load_unclean_marks()
        self.executor.refresh(core.assignments)
        self._on_brokers_change("init", BROKERS)
        # Brokers that died unseen by the old controller (its watch came too late): failed now,
        # as the real controller's failover does.
        for b in core.offline_brokers():
            self._broker_failure(b)
        self._execute(core.initial_leaders)
        self._on_isr_changes("init", zk_data.ISR_CHANGE_NOTIFICATION_PATH)
        self._on_log_dir_events("init", zk_data.LOG_DIR_EVENT_NOTIFICATION_PATH)
        self._on_topic_change("init", zk_data.topic_path(topic))
        # Moves in progress resume from the topic znode (Kafka's failover).
        self._carry_out(lambda: self.reassignments.resume(self.executor, [topic]))

    def resign(self) -> None:
        self.active = False

    # -- watches --------------------------------------------------------------------------
    def _on_brokers_change(self, event: str, path: str) -> None:
        if not self.active:
            return
        zk, executor = self.zk, self.executor
        zk.get_children(BROKERS, watch=self._on_brokers_change)
        current = zk.get_all_brokers_and_epochs()
        changes = executor.on_broker_registrations(current)
        if event == "init":
            # A failover loads every registered broker as live before deciding anything (as the
            # real controller's): started one at a time, a partition led by a broker not loaded
            # yet was re-elected off it, its ISR shrunk to the brokers loaded so far.
            for b in changes.started:
                self.core.live_brokers[b] = current[b][1]
        for b in changes.dead:
            self._broker_failure(b)
        for b in sorted((*changes.started, *changes.bounced)):
            epoch = current[b][1]
            self.cluster.trace_add(("broker_startup", None, ("broker", b), ("epoch", epoch)))
            self._carry_out(lambda b=b, e=epoch: executor.broker_startup(b, e))
            if b in changes.bounced:
                self.cluster.nodes[b].failure_handled()  # a bounce: failure, then startup
            if event != "init":
                self._carry_out(lambda b=b: self.reassignments.on_broker_startup(executor, b))

    def _broker_failure(self, broker_id: int) -> None:
        self.cluster.trace_add(("broker_failure", None, ("broker", broker_id)))
        self._carry_out(lambda: self.executor.broker_failure(broker_id))
        self.cluster.nodes[broker_id].failure_handled()

    def _on_isr_changes(self, event: str, path: str) -> None:
        if not self.active:
            return
        self.zk.get_children(zk_data.ISR_CHANGE_NOTIFICATION_PATH, watch=self._on_isr_changes)
        self._carry_out(self.executor.on_isr_change_notifications)
        # A moving partition whose ISR now holds its target replicas completes.
        self._carry_out(lambda: self.reassignments.on_isr_change(self.executor))

    def alter_partition(self, broker_id: int, broker_epoch: int,
                        proposals: Sequence[ProposeIsr]) -> AlterPartitionAnswer:
        """A leader's AlterPartition (KIP-497), the real controller's event
        (`DecisionExecutor.alter_partition`): the answer goes back to the leader; a moving
        partition whose ISR now holds its target replicas completes (Kafka's
        maybeCompleteReassignment after the answer)."""
        outcome: AlterPartitionOutcome | None = None

        def run() -> Executed:
            nonlocal outcome
            outcome = self.executor.alter_partition(broker_id, broker_epoch, proposals)
            return outcome.executed

        if self.active:
            self.cluster.trace_add(("alter_partition", None, ("broker", broker_id),
                                    ("partitions", len(proposals))))
            self._carry_out(run, kind="isr")
        if outcome is None or not self.active:
            return AlterPartitionAnswer(int(ErrorCode.NOT_CONTROLLER))
        answer = alter_partition_answer(outcome)
        if any(tp in self.reassignments.reassigning for tp in outcome.written):
            # As the real controller (Controller._on_alter_partition): every moving partition
            # is looked at once a moving one's ISR was written.
            self._carry_out(lambda: self.reassignments.on_isr_change(self.executor))
        return answer

    def _on_log_dir_events(self, event: str, path: str) -> None:
        """A broker's log dir failed: LeaderAndIsr for its replicas, whose answers say which
        are offline (`on_response`)."""
        if not self.active:
            return
        self.zk.get_children(zk_data.LOG_DIR_EVENT_NOTIFICATION_PATH,
                             watch=self._on_log_dir_events)
        self._carry_out(self.executor.on_log_dir_event_notifications)

    def on_response(self, broker_id: int, msg: ControllerResponse) -> None:
        """A broker's answer to a LeaderAndIsr of this controller (Kafka's
        LeaderAndIsrResponseReceived when it matters)."""
        if not self.active or msg.controller_epoch != self.core.controller_epoch:
            return  # sent by an earlier controller: its channel is gone
        executor = self.executor
        if executor.leader_and_isr_response_matters(broker_id, msg.partition_errors):
            self._carry_out(lambda: executor.on_leader_and_isr_response(
                broker_id, msg.broker_epoch, msg.partition_errors))

    def _on_topic_change(self, event: str, path: str) -> None:
        """The topic znode changed: partitions it names that the controller does not know are
        new (CreatePartitions); the controller's own reassignment writes add none."""
        if not self.active:
            return
        self.zk.get(path, watch=self._on_topic_change)
        topic = self.cluster.config.topic
        assignment = self.zk.get_topic_assignment(topic) or {}
        self._carry_out(lambda: self.executor.add_partitions(topic, assignment))

    # -- admin requests (the fault injector's) ----------------------------------------------
    def reassign(self, targets: Mapping[TopicPartition, list[int] | None]
                 ) -> dict[TopicPartition, ApiError] | None:
        """AlterPartitionReassignments (a None target cancels); None: not the controller."""
        if not self.active:
            return None
        results: dict[TopicPartition, ApiError] = {}

        def run() -> Executed:
            answer, done = self.reassignments.alter(self.executor, targets)
            results.update(answer)
            return done

        self.cluster.trace_add(("reassign", None, tuple(
            (str(tp), None if t is None else tuple(t)) for tp, t in sorted(targets.items()))))
        self._carry_out(run)
        return results if self.active else None

    def elect_leaders(self, partitions: Iterable[TopicPartition], election_type: int
                      ) -> dict[TopicPartition, tuple[int, str | None, int]] | None:
        """ElectLeaders (preferred or unclean); None: not the controller."""
        if not self.active:
            return None
        outcome: dict[TopicPartition, tuple[int, str | None, int]] = {}

        def run() -> Executed:
            done, results = self.executor.elect_leaders(list(partitions), election_type)
            outcome.update(results)
            return done

        self._carry_out(run)
        return outcome if self.active else None

    def controlled_shutdown(self, broker_id: int) -> None:
        if self.active:
            self.cluster.trace_add(("controlled_shutdown", None, ("broker", broker_id)))
            self._execute(lambda: self.core.controlled_shutdown(broker_id))

    def elect_preferred_leaders(self) -> None:
        if self.active:
            self._execute(self.core.elect_preferred_leaders)

    # -- carrying out decisions -----------------------------------------------------------
    def _check_election(self, tp: TopicPartition, before: Any, leader: int) -> None:
        """ElectedFromIsr: a new leader comes from the ISR ZooKeeper held (unclean election
        aside); ElectedOfflineReplica: never a replica its broker answered
        KAFKA_STORAGE_ERROR for (its log dir failed)."""
        if leader < 0 or before is None or before.leader == leader:
            return
        fail = self.cluster.checker.fail
        if tp in self.core.replicas_on_offline_dirs.get(leader, ()):
            fail("ElectedOfflineReplica", tp, f"leader {leader} elected, its replica is on a "
                 "failed log dir")
        if (leader not in before.isr
                and not self.cluster.config.replication.unclean_leader_election_enable):
            fail("ElectedFromIsr", tp, f"leader {leader} elected outside the ISR "
                 f"{sorted(before.isr)}")

    def _execute(self, event: Callable[[], Decision]) -> None:
        # Like Kafka's controller (removeReplicasFromIsr, electLeaderForPartitions), decide on
        # the partition states as they are in ZooKeeper now, not on a cache that an ISR change
        # by a leader (not yet notified) may have made stale: every partition is re-read.
        self._carry_out(lambda: self.executor.execute(event, self.core.assignments))

    def _carry_out(self, run: Callable[[], Executed | None], kind: str | None = None) -> None:
        checking = self.cluster.checker.enabled
        # ZooKeeper's states before the event (what the executor re-reads and decides on).
        before = ({tp: self.cluster.zk_state(tp) for tp in self.core.assignments}
                  if checking else {})
        try:
            done = run()
        except ControllerMovedError:
            self.resign()  # another controller was elected meanwhile
            return
        if done is None:
            return
        for s in done.written:
            tp = TopicPartition(s.topic, s.partition)
            self.cluster.trace_add((kind or ("elect" if s.leader != -1 else "offline"), None,
                                    str(tp),
                                    ("leader", s.leader),
                                    ("epoch", s.leader_epoch), ("isr", tuple(s.isr))))
            if checking:
                self._check_election(tp, before.get(tp), s.leader)
                self.cluster.checker.note_partition_write(tp, before.get(tp), s)
        net = self.cluster.network
        for requests in done.requests:
            for broker, reqs in sorted(requests.items()):
                for r in reqs:
                    self.sent_requests += 1
                    if self.on_delete_sent is not None and isinstance(r, StopReplicaRequest) \
                            and r.delete_partitions:
                        for tp in r.partitions:
                            self.on_delete_sent(broker, tp)
                    net.send(CONTROLLER_NODE, broker, ControllerMessage(r))
