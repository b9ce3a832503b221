"""The simulated controller: `controller/core.py`'s decisions carried out over the simulated
ZooKeeper and network.

As Kafka's ZooKeeper-mode controller it watches `/brokers/ids` (a registration that appears,
disappears or changes its creation zxid — the broker epoch — is a startup, a failure or a bounce)
and `/isr_change_notification` (then re-reads those partitions' states and sends UpdateMetadata),
writes leader/ISR changes to `/brokers/topics/<t>/partitions/<p>/state` as compare-and-sets on
the zk version, and sends LeaderAndIsr / UpdateMetadata / StopReplica to the brokers over the
network. It is modelled as co-located with ZooKeeper (its reads and writes are immediate); its
requests to brokers travel the network like any other message. A controller failover is a new
`SimController` with a higher controller epoch (`/controller_epoch`), which re-reads everything.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from tidelog.controller.core import ControllerCore, Decision
from tidelog.replication.types import LeaderAndIsrPartitionState, TopicPartition
from tidelog.sim.messages import CONTROLLER_NODE, ControllerMessage
from tidelog.sim.zookeeper import ZkCode

if TYPE_CHECKING:  # pragma: no cover
    from tidelog.sim.cluster import SimCluster

BROKERS = "/brokers/ids"
ISR_CHANGES = "/isr_change_notification"
CONTROLLER_EPOCH = "/controller_epoch"
# KIP-966's marks (replicas back from an unclean shutdown, not caught up since) must survive a
# controller failover, as ELR state lives in the metadata log in Kafka: kept in ZooKeeper here.
UNCLEAN_REPLICAS = "/tidelog/unclean_replicas"


def state_path(tp: TopicPartition) -> str:
    return f"/brokers/topics/{tp.topic}/partitions/{tp.partition}/state"


def read_state(zk: Any, tp: TopicPartition) -> LeaderAndIsrPartitionState | None:
    got = zk.get(state_path(tp))
    if got is None or got[0] is None:
        return None
    data, stat = got
    return replace(data, zk_version=stat.version)


class SimController:
    def __init__(self, cluster: SimCluster, controller_id: int = CONTROLLER_NODE) -> None:
        self.cluster = cluster
        self.zk = cluster.zk
        self.controller_id = controller_id
        got = self.zk.get(CONTROLLER_EPOCH)
        epoch = (got[0] if got is not None else 0) + 1
        if got is None:
            self.zk.create(CONTROLLER_EPOCH, epoch)
        else:
            self.zk.set_data(CONTROLLER_EPOCH, epoch)
        self.core = ControllerCore(
            controller_id, epoch,
            unclean_leader_election_enable=cluster.config.replication.unclean_leader_election_enable)
        self.active = True
        self.sent_requests = 0

    @property
    def stats(self) -> Any:
        return self.core.stats

    def start(self) -> None:
        got = self.zk.get(UNCLEAN_REPLICAS)
        if got is not None and got[0]:
            self.core.unclean_restarted = {tp: set(bs) for tp, bs in got[0].items()}
        for tp, replicas in sorted(self.cluster.assignments.items()):
            self.core.add_partition(tp, replicas)
            state = read_state(self.zk, tp)
            if state is not None:
                self.core.refresh_partition(tp, state)
        self._on_brokers_change("init", BROKERS)
        self._execute(self.core.initial_leaders)
        self._on_isr_changes("init", ISR_CHANGES)

    def resign(self) -> None:
        self.active = False

    # -- watches --------------------------------------------------------------------------
    def _on_brokers_change(self, event: str, path: str) -> None:
        if not self.active:
            return
        zk = self.zk
        current: dict[int, int] = {}
        clean: dict[int, bool] = {}
        for child in zk.get_children(BROKERS, watch=self._on_brokers_change):
            got = zk.get(f"{BROKERS}/{child}")
            if got is None:
                continue
            current[int(child)] = got[1].czxid
            clean[int(child)] = bool((got[0] or {}).get("clean_shutdown", True))
        known = dict(self.core.live_brokers)
        for b in sorted(set(known) - set(current)):
            self.cluster.trace_add(("broker_failure", None, ("broker", b)))
            self._execute(lambda b=b: self.core.on_broker_failure(b))
            self.cluster.nodes[b].failure_handled()
        for b, epoch in sorted(current.items()):
            if known.get(b) == epoch:
                continue
            self.cluster.trace_add(("broker_startup", None, ("broker", b), ("epoch", epoch)))
            if not clean[b] and self.cluster.config.kip966_unclean_restart_rule:
                self.core.mark_unclean_restart(b)
            self._execute(lambda b=b, e=epoch: self.core.on_broker_startup(b, e))
            if b in known:
                self.cluster.nodes[b].failure_handled()  # a bounce: failure, then startup

    def _on_isr_changes(self, event: str, path: str) -> None:
        if not self.active:
            return
        zk = self.zk
        tps: set[TopicPartition] = set()
        for child in zk.get_children(ISR_CHANGES, watch=self._on_isr_changes):
            full = f"{ISR_CHANGES}/{child}"
            got = zk.get(full)
            if got is not None and got[0]:
                tps.update(TopicPartition(t, p) for t, p in got[0])
            zk.delete(full)
        if not tps:
            return
        states = {}
        for tp in sorted(tps):
            s = read_state(zk, tp)
            if s is not None:
                states[tp] = s
        self._execute(lambda: self.core.on_isr_change(states))

    def controlled_shutdown(self, broker_id: int) -> None:
        if self.active:
            self.cluster.trace_add(("controlled_shutdown", None, ("broker", broker_id)))
            self._execute(lambda: self.core.controlled_shutdown(broker_id))

    def elect_preferred_leaders(self) -> None:
        if self.active:
            self._execute(self.core.elect_preferred_leaders)

    # -- carrying out decisions -----------------------------------------------------------
    def _execute(self, event: Callable[[], Decision], attempts: int = 5) -> None:
        """Run `event`, write its decisions as compare-and-sets, send the resulting requests;
        re-read and replay on a lost compare-and-set (bounded)."""
        for attempt in range(attempts):
            # Like Kafka's controller (removeReplicasFromIsr, electLeaderForPartitions), decide
            # on the partition states as they are in ZooKeeper now, not on a cache that an ISR
            # change by a leader (not yet notified) may have made stale.
            self._refresh_states()
            decision = event()
            results: dict[TopicPartition, int | None] = {}
            failed: list[TopicPartition] = []
            for w in decision.writes:
                path = state_path(w.tp)
                if w.expected_zk_version < 0:
                    code, _ = self.zk.create(path, w.state)
                    results[w.tp] = 0 if code is ZkCode.OK else None
                else:
                    code, stat = self.zk.set_data(path, w.state, w.expected_zk_version)
                    results[w.tp] = stat.version if code is ZkCode.OK and stat else None
                if results[w.tp] is None:
                    failed.append(w.tp)
                else:
                    s = w.state
                    self.cluster.trace_add(("elect" if s.leader != -1 else "offline", None,
                                            str(w.tp), ("leader", s.leader),
                                            ("epoch", s.leader_epoch), ("isr", tuple(s.isr))))
            self._send(self.core.commit(decision, results))
            self._persist_unclean()
            if not failed or attempt == attempts - 1:
                return
            for tp in failed:
                s = read_state(self.zk, tp)
                if s is not None:
                    self.core.refresh_partition(tp, s)

    def _refresh_states(self) -> None:
        for tp in self.core.assignments:
            s = read_state(self.zk, tp)
            if s is not None and s != self.core.partition_states.get(tp):
                self.core.refresh_partition(tp, s)

    def _persist_unclean(self) -> None:
        marks = {tp: tuple(sorted(bs)) for tp, bs in sorted(self.core.unclean_restarted.items())
                 if bs}
        got = self.zk.get(UNCLEAN_REPLICAS)
        if got is None:
            if marks:
                self.zk.create(UNCLEAN_REPLICAS, marks)
        elif got[0] != marks:
            self.zk.set_data(UNCLEAN_REPLICAS, marks)

    def _send(self, requests: dict[int, list[Any]]) -> None:
        net = self.cluster.network
        for broker, reqs in sorted(requests.items()):
            for r in reqs:
                self.sent_requests += 1
                net.send(CONTROLLER_NODE, broker, ControllerMessage(r))
