"""The simulated controller: `controller/core.py`'s decisions carried out over the simulated
ZooKeeper and network, by the execute loop the real controller runs (controller/executor.py).

As Kafka's ZooKeeper-mode controller it watches `/brokers/ids` (a registration that appears,
disappears or changes its creation zxid — the broker epoch — is a startup, a failure or a bounce)
and `/isr_change_notification` (then re-reads those partitions' states and sends UpdateMetadata).
`DecisionExecutor` writes the leader/ISR changes to `/brokers/topics/<t>/partitions/<p>/state`
as compare-and-sets on the zk version, fenced by `/controller_epoch`'s version, and keeps the
KIP-966 marks in ZooKeeper; the requests it returns (LeaderAndIsr / UpdateMetadata /
StopReplica) travel the network like any other message. The controller is modelled as
co-located with ZooKeeper (its reads and writes are immediate). A controller failover is a new
`SimController` with a higher controller epoch, which re-reads everything; a write of the old one
after that fails with `ControllerMovedError` and it resigns.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tidelog.controller import zk_data
from tidelog.controller.core import ControllerCore, Decision
from tidelog.controller.executor import DecisionExecutor, Executed
from tidelog.controller.zk_interface import ControllerMovedError
from tidelog.replication.types import TopicPartition
from tidelog.sim.messages import CONTROLLER_NODE, ControllerMessage

if TYPE_CHECKING:  # pragma: no cover
    from tidelog.sim.cluster import SimCluster

BROKERS = zk_data.BROKER_IDS_PATH


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
            kip966_unclean_restart_rule=cluster.config.kip966_unclean_restart_rule)
        self.active = True
        self.sent_requests = 0

    @property
    def stats(self) -> Any:
        return self.core.stats

    def start(self) -> None:
        core = self.core
        for tp, replicas in sorted(self.cluster.assignments.items()):
            core.add_partition(tp, replicas)
        self.executor.load_unclean_marks()
        self.executor.refresh(core.assignments)
        self._on_brokers_change("init", BROKERS)
        self._execute(core.initial_leaders)
        self._on_isr_changes("init", zk_data.ISR_CHANGE_NOTIFICATION_PATH)

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
        for b in changes.dead:
            self.cluster.trace_add(("broker_failure", None, ("broker", b)))
            self._carry_out(lambda b=b: executor.broker_failure(b))
            self.cluster.nodes[b].failure_handled()
        for b in sorted((*changes.started, *changes.bounced)):
            epoch = current[b][1]
            self.cluster.trace_add(("broker_startup", None, ("broker", b), ("epoch", epoch)))
            self._carry_out(lambda b=b, e=epoch: executor.broker_startup(b, e))
            if b in changes.bounced:
                self.cluster.nodes[b].failure_handled()  # a bounce: failure, then startup

    def _on_isr_changes(self, event: str, path: str) -> None:
        if not self.active:
            return
        self.zk.get_children(zk_data.ISR_CHANGE_NOTIFICATION_PATH, watch=self._on_isr_changes)
        self._carry_out(self.executor.on_isr_change_notifications)

    def controlled_shutdown(self, broker_id: int) -> None:
        if self.active:
            self.cluster.trace_add(("controlled_shutdown", None, ("broker", broker_id)))
            self._execute(lambda: self.core.controlled_shutdown(broker_id))

    def elect_preferred_leaders(self) -> None:
        if self.active:
            self._execute(self.core.elect_preferred_leaders)

    # -- carrying out decisions -----------------------------------------------------------
    def _execute(self, event: Callable[[], Decision]) -> None:
        # Like Kafka's controller (removeReplicasFromIsr, electLeaderForPartitions), decide on
        # the partition states as they are in ZooKeeper now, not on a cache that an ISR change
        # by a leader (not yet notified) may have made stale: every partition is re-read.
        self._carry_out(lambda: self.executor.execute(event, self.core.assignments))

    def _carry_out(self, run: Callable[[], Executed | None]) -> None:
        try:
            done = run()
        except ControllerMovedError:
            self.resign()  # another controller was elected meanwhile
            return
        if done is None:
            return
        for s in done.written:
            self.cluster.trace_add(("elect" if s.leader != -1 else "offline", None,
                                    str(TopicPartition(s.topic, s.partition)),
                                    ("leader", s.leader),
                                    ("epoch", s.leader_epoch), ("isr", tuple(s.isr))))
        net = self.cluster.network
        for requests in done.requests:
            for broker, reqs in sorted(requests.items()):
                for r in reqs:
                    self.sent_requests += 1
                    net.send(CONTROLLER_NODE, broker, ControllerMessage(r))
