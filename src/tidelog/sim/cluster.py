"""A whole simulated cluster: scheduler, network, ZooKeeper, controller, brokers, clients and
the invariant checker, all derived from one seed.

`SimCluster(SimConfig(seed=...))` builds it; `start()` boots the brokers and the controller;
`run_events(n)` / `run_for(ms)` advance virtual time (the invariants are checked after every
event); `heal()` ends every fault; `settle()` runs until the replicas converge; `final_checks()`
returns the end-of-run violations (NoAckedLoss, consumed data stable, convergence).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from tidelog.controller import zk_data
from tidelog.controller.zk_data import LeaderIsrAndControllerEpoch
from tidelog.controller.zk_interface import from_zk_state
from tidelog.coordinator.transaction.log import TRANSACTION_STATE_TOPIC_NAME
from tidelog.replication.config import ReplicationConfig
from tidelog.replication.partition import Partition
from tidelog.replication.types import LeaderAndIsrPartitionState, TopicPartition
from tidelog.sim.client import Consumer, Producer
from tidelog.sim.clock import Scheduler
from tidelog.sim.controller import SimController
from tidelog.sim.invariants import (
    InvariantChecker,
    Violation,
    batch_at,
    batch_signatures,
    check_replicas,
)
from tidelog.sim.lifecycle_invariants import LifecycleChecker
from tidelog.sim.messages import (
    CLIENT_BASE,
    CONTROLLER_CHANNEL_NODE,
    CONTROLLER_NODE,
    ZK_NODE,
    AlterPartitionMessage,
    AlterPartitionReply,
    ControllerResponse,
    ZkRequest,
    ZkResponse,
)
from tidelog.sim.network import LinkConfig, Network
from tidelog.sim.node import SimBroker
from tidelog.sim.producer_invariants import check_producers
from tidelog.sim.trace import Trace
from tidelog.sim.txn_workload import TxnWorkload
from tidelog.sim.zookeeper import SimZooKeeper, ZkCode
from tidelog.storage.log_config import LogConfig


@dataclass(slots=True)
class SimConfig:
    seed: int = 0
    brokers: int = 3
    topic: str = "t"
    partitions: int = 1
    replication_factor: int = 3
    replication: ReplicationConfig = field(default_factory=lambda: ReplicationConfig(
        replica_lag_time_max_ms=1000, replica_fetch_backoff_ms=100,
        replica_fetch_wait_max_ms=100))
    # The brokers' log defaults, as topic keys (Kafka's copyKafkaConfigToLog): the broker's
    # min.insync.replicas is here.
    log_properties: dict[str, Any] = field(default_factory=lambda: {
        "segment.bytes": 64 * 1024, "min.insync.replicas": 2})
    # The topic's own configuration (CreateTopics' configs), over the brokers' log defaults.
    topic_properties: dict[str, Any] = field(default_factory=dict)
    session_timeout_ms: int = 1500
    request_timeout_ms: int = 1000
    hw_checkpoint_ms: int = 500
    os_flush_ms: int = 1000
    # The log manager's tasks (shell/log_tasks.py), short enough to run many times in a run:
    # log.retention.check.interval.ms, log.flush.scheduler.interval.ms (flush.ms is the topic's),
    # log.flush.offset.checkpoint.interval.ms, producer.id.expiration.check.interval.ms; and
    # producer.id.expiration.ms (Kafka's default: a day); log.initial.task.delay.ms, when the
    # first three first run: no shorter than their periods, so every broker's first retention
    # check runs one period after its start, not at a point spread over the period by
    # ProcessScheduler (replicas would then delete their old segments at different times).
    log_initial_task_delay_ms: int = 3000
    log_retention_check_ms: int = 3000
    log_flush_scheduler_ms: int = 1000
    recovery_point_checkpoint_ms: int = 2000
    producer_id_expiration_check_ms: int = 5000
    producer_id_expiration_ms: int = 86_400_000
    link: LinkConfig = field(default_factory=LinkConfig)
    # Each broker's `log.dirs` (JBOD): with more than one, a failed dir takes only its
    # replicas offline; with one, the broker halts.
    log_dirs_per_broker: int = 1
    # KIP-966's lesson: a broker back from an unclean shutdown is no clean leader candidate.
    kip966_unclean_restart_rule: bool = True
    # KIP-841/903: brokers tell the core which brokers (and broker epochs) are alive, so that a
    # late fetch cannot re-add an offline or re-registered replica to the ISR.
    kip841_eligibility: bool = True
    # partition -> replicas (first = preferred leader); default: round robin from the partition
    assignments: dict[int, tuple[int, ...]] | None = None
    # Transactional producers, read_committed consumers and the transaction coordinator
    # (sim/txn_workload.py): the `__transaction_state` topic exists from the start.
    transactions: bool = False
    # Kafka's transaction.partition.verification.enable (KIP-890): off, a partition leader
    # appends a transactional batch without asking the coordinator whether its transaction
    # includes the partition (a late produce can then open a transaction nobody ends).
    transaction_partition_verification_enable: bool = True
    trace: bool = True
    trace_limit: int | None = 5000
    check_invariants: bool = True


class SimCluster:
    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        self.scheduler = Scheduler()
        self.network = Network(self.scheduler, random.Random(self.rng.getrandbits(64)),
                               config.link)
        self.zk = SimZooKeeper(self.scheduler)
        self.trace = Trace(config.trace, config.trace_limit)
        self.log_config = LogConfig.from_dict(config.log_properties)
        self.topic_log_config = LogConfig.from_dict(config.topic_properties, self.log_config)
        self.tps = [TopicPartition(config.topic, p) for p in range(config.partitions)]
        n = config.brokers
        rf = min(config.replication_factor, n)
        self.assignments = {tp: tuple((tp.partition + i) % n for i in range(rf)) for tp in self.tps}
        for p, replicas in (config.assignments or {}).items():
            self.assignments[TopicPartition(config.topic, p)] = tuple(replicas)
        # The topic's znode, as CreateTopics writes it (the controller creates partition
        # states only under an existing topic).
        self.zk.create_path(zk_data.topic_path(config.topic), zk_data.encode_topic_assignment(
            {tp.partition: rs for tp, rs in self.assignments.items()}))
        self.txn: TxnWorkload | None = None
        if config.transactions:
            self.txn = TxnWorkload(self)
            # Its partitions are never moved: `sync_topic` follows the data topic only.
            txn_assignments = self.txn.assignments()
            self.assignments.update(txn_assignments)
            self.zk.create_path(zk_data.topic_path(TRANSACTION_STATE_TOPIC_NAME),
                                zk_data.encode_topic_assignment(
                                    {tp.partition: rs for tp, rs in txn_assignments.items()}))
        self.network.register(ZK_NODE, self._zk_receive)
        self.network.register(CONTROLLER_NODE, self._controller_receive)
        self.network.register(CONTROLLER_CHANNEL_NODE, self._controller_channel_receive)
        self.nodes = [SimBroker(self, b) for b in range(n)]
        self.controller: SimController | None = None
        self.producers: list[Producer] = []
        self.consumers: list[Consumer] = []
        self.checker = InvariantChecker(
            self, lambda: self.scheduler.now_ms,
            lambda v: self.trace_add(("VIOLATION", None, v.invariant, str(v.tp), v.detail)))
        self.checker.enabled = config.check_invariants
        # Reassignment's own invariants (sim/lifecycle_invariants.py), reported as the others.
        self.lifecycle = LifecycleChecker(self, self.checker.fail)
        self.lifecycle.enabled = config.check_invariants
        if config.check_invariants:
            self.scheduler.after_event = self._after_event
        self._state_cache: dict[TopicPartition, tuple[Any, Any]] = {}
        self._paths: dict[TopicPartition, str] = {}
        # The topic znode as last read: `assignments` and `tps` follow it (reassignments,
        # partition additions); `moving` holds each moving partition's (adding, removing).
        self._topic_path = zk_data.topic_path(config.topic)
        self._topic_stat: Any = None
        self._synced_zxid = -1
        self.moving: dict[TopicPartition, tuple[tuple[int, ...], tuple[int, ...]]] = {}
        self.sync_topic()

    def _after_event(self) -> None:
        self.checker.check()
        self.lifecycle.check()
        for node in self.nodes:
            lm = node.log_manager
            if node.running and lm is not None and not lm.live_log_dirs:
                self.checker.fail("HaltWithoutLogDir", None, f"broker {node.broker_id} runs "
                                  "with every log dir offline")

    # -- lookups ----------------------------------------------------------------------------
    def sync_topic(self) -> bool:
        """Re-read the topic znode if it changed since the last look; True if it did."""
        self._synced_zxid = self.zk.zxid
        node = self.zk.nodes.get(self._topic_path)
        if node is None or node.stat is self._topic_stat:
            return False
        self._topic_stat = node.stat
        topic = self.config.topic
        parts, _ = zk_data.decode_topic_znode(topic, node.data)
        adding, removing = zk_data.decode_topic_reassignments(topic, node.data)
        for p, replicas in sorted(parts.items()):
            tp = TopicPartition(topic, p)
            if tp not in self.assignments:
                self.tps.append(tp)
            self.assignments[tp] = tuple(replicas)
        self.moving = {TopicPartition(topic, p): (tuple(adding.get(p, ())),
                                                  tuple(removing.get(p, ())))
                       for p in sorted(set(adding) | set(removing))}
        self._state_cache.clear()  # the states carry the replicas
        return True

    def node(self, broker_id: int) -> SimBroker | None:
        return self.nodes[broker_id] if 0 <= broker_id < len(self.nodes) else None

    def zk_state(self, tp: TopicPartition) -> LeaderAndIsrPartitionState | None:
        """The partition's state znode, cached until the znode changes (checked per event)."""
        if self.zk.zxid != self._synced_zxid:  # a znode changed: maybe the topic's
            self.sync_topic()
        path = self._paths.get(tp)
        if path is None:
            path = self._paths[tp] = zk_data.partition_state_path(tp)
        node = self.zk.nodes.get(path)
        if node is None or node.data is None:
            return None
        cached = self._state_cache.get(tp)
        if cached is not None and cached[0] is node.stat:
            return cached[1]
        state = from_zk_state(tp, LeaderIsrAndControllerEpoch.decode(tp, node.data,
                                                                     node.stat.version),
                              self.assignments[tp])
        self._state_cache[tp] = (node.stat, state)
        return state

    def leader_of(self, tp: TopicPartition) -> tuple[int, int]:
        """(leader, leader epoch) as a client's metadata would say: from ZooKeeper."""
        s = self.zk_state(tp)
        return (-1, -1) if s is None else (s.leader, s.leader_epoch)

    def acting_leader(self, tp: TopicPartition) -> SimBroker | None:
        """The running broker that leads `tp` in the ZooKeeper state's epoch, if any."""
        s = self.zk_state(tp)
        if s is None or s.leader < 0:
            return None
        node = self.nodes[s.leader]
        p = node.partition(tp)
        if not node.running or p is None or not p.is_leader or p.leader_epoch != s.leader_epoch:
            return None
        return node

    # -- ClusterView (sim/invariants.py) ------------------------------------------------------
    def partitions(self) -> list[TopicPartition]:
        self.sync_topic()
        return self.tps

    def assigned_replicas(self, tp: TopicPartition) -> tuple[int, ...]:
        return self.assignments[tp]

    def leader_high_watermark(self, tp: TopicPartition) -> int | None:
        leader = self.acting_leader(tp)
        p = leader.partition(tp) if leader is not None else None
        return None if p is None else p.high_watermark

    def running(self, broker_id: int) -> bool:
        return self.nodes[broker_id].running

    def replica(self, broker_id: int, tp: TopicPartition) -> LogReplica | None:
        node = self.node(broker_id)
        log = None if node is None or not node.readable(tp) else node.log(tp)
        return None if log is None else LogReplica(log)

    # -- LiveClusterView: what the per-event checks read -----------------------------------
    def acting_leaders(self) -> Iterator[tuple[int, TopicPartition, int, int, Any, Any]]:
        for node in self.nodes:
            core = node.core
            if core is None or not node.running:
                continue
            bid = node.broker_id
            for tp, p in core.partitions.items():
                # Plain attributes rather than the Partition properties: this runs per event.
                if p.leader_id == bid and node.readable(tp):
                    yield bid, tp, p.leader_epoch, p.log.high_watermark, p.isr, p.pending_isr

    def working(self, broker_id: int, tp: TopicPartition) -> bool:
        node = self.node(broker_id)
        return node is not None and node.running and node.readable(tp)

    def _member_partition(self, broker_id: int, tp: TopicPartition) -> Partition | None:
        if not 0 <= broker_id < len(self.nodes):
            return None
        node = self.nodes[broker_id]
        core = node.core
        if core is None or not node.running or not node.readable(tp):
            return None
        return core.partitions.get(tp)

    def member_log_end_offset(self, broker_id: int, tp: TopicPartition) -> int | None:
        p = self._member_partition(broker_id, tp)
        return None if p is None else p.log.log_end_offset

    def member_leader_epoch(self, broker_id: int, tp: TopicPartition) -> int | None:
        p = self._member_partition(broker_id, tp)
        return None if p is None else p.leader_epoch

    def exempt(self, broker_id: int, tp: TopicPartition, leader_epoch: int) -> bool:
        return self.nodes[broker_id].is_dirty(tp, leader_epoch) or (
            self.lifecycle.deleted_for(broker_id, tp, leader_epoch))

    def trace_add(self, entry: tuple[Any, ...]) -> None:
        if self.trace.enabled:
            self.trace.add((self.scheduler.now_ms, *entry))

    # -- life -----------------------------------------------------------------------------
    def start(self, controller_delay_ms: int = 20) -> None:
        self.zk.start()
        for node in self.nodes:
            node.start()
        self.scheduler.schedule(controller_delay_ms, self._start_controller)

    def _start_controller(self) -> None:
        old = self.controller
        if old is not None:
            old.resign()
            # The brokers' connections to the old controller die with it: an AlterPartition
            # on its way there is lost (its leader sends it again to the new one after
            # request_timeout_ms); answers already sent still arrive.
            self.network.set_up(CONTROLLER_CHANNEL_NODE, True)
        self.controller = SimController(self)
        self.controller.on_delete_sent = self.lifecycle.on_delete_sent
        if old is not None:
            self.controller.core.stats = old.core.stats  # counters for the whole run
        self.trace_add(("controller", None, ("epoch", self.controller.core.controller_epoch)))
        self.controller.start()

    def failover_controller(self) -> None:
        self._start_controller()

    def add_producer(self, tp: TopicPartition, acks: int, idempotent: bool = True) -> Producer:
        p = Producer(CLIENT_BASE + len(self.producers) + 100 * len(self.consumers), tp, acks,
                     self.scheduler, self.network, self.leader_of, idempotent=idempotent)
        self.producers.append(p)
        return p

    def add_consumer(self, tp: TopicPartition) -> Consumer:
        c = Consumer(CLIENT_BASE + 1000 + len(self.consumers), tp, self.scheduler,
                     self.network, self.leader_of)
        self.consumers.append(c)
        c.start()
        return c

    def run_events(self, n: int) -> int:
        return self.scheduler.run_events(n)

    def run_for(self, ms: int, max_events: int | None = None) -> int:
        return self.scheduler.run_for(ms, max_events)

    def heal(self) -> None:
        """End every fault: links healed, paused brokers resumed, stopped ones restarted."""
        self.network.heal()
        for node in self.nodes:
            if node.disk_failed:
                node.file_io.heal()
                node.failed_dirs.clear()
                if node.running:
                    node.stop("kill")  # a failed log dir comes back only with a restart
            if node.paused:
                node.resume()
            if not node.running:
                node.start()
        self.trace_add(("heal", None))

    def offline_by_kip966(self, tp: TopicPartition) -> bool:
        """No leader because every ISR member came back from an unclean shutdown: KIP-966's
        rule keeps the partition offline rather than risk electing a replica that lost acked
        data (Kafka without ELR does the same). Unavailable, not unsafe."""
        s = self.zk_state(tp)
        ctl = self.controller
        if s is None or s.leader != -1 or ctl is None:
            return False
        dirty = ctl.core.unclean_restarted.get(tp, set())
        return bool(s.isr) and all(r in dirty for r in s.isr)

    def converged(self) -> bool:
        self.sync_topic()
        for tp in self.tps:
            if self.offline_by_kip966(tp):
                continue
            if any(p.in_flight for p in self.producers if p.tp == tp):
                return False  # retries still to land: the logs will change again
            s = self.zk_state(tp)
            leader = self.acting_leader(tp)
            if s is None or leader is None or tp in self.moving:
                return False
            lp = leader.partition(tp)
            replicas = self.assignments[tp]
            if set(s.isr) != set(replicas) or set(lp.isr) != set(replicas):
                return False
            leo = lp.log_end_offset
            if lp.high_watermark != leo:
                return False
            for r in replicas:
                node = self.nodes[r]
                if not node.running or node.log_end_offset(tp) != leo:
                    return False
        return True

    def settle(self, max_ms: int = 60_000, step_ms: int = 200) -> bool:
        """Run until every replica converged (bounded by `max_ms` of virtual time)."""
        waited = 0
        while waited < max_ms:
            # A fault's own follow-up scheduled before the heal (the stop that ends a controlled
            # shutdown, a disk repair's restart) may still take a broker down: bring it back.
            for node in self.nodes:
                if node.paused:
                    node.resume()
                if not node.running:
                    node.start()
            if self.converged():
                return True
            self.run_for(step_ms)
            waited += step_ms
        return self.converged()

    def consumers_caught_up(self) -> bool:
        for cons in self.consumers:
            leader = self.acting_leader(cons.tp)
            if leader is not None and cons.position < leader.partition(cons.tp).high_watermark:
                return False
        return True

    def drain_consumers(self, max_ms: int = 5000, step_ms: int = 100) -> bool:
        waited = 0
        while not self.consumers_caught_up() and waited < max_ms:
            self.run_for(step_ms)
            waited += step_ms
        return self.consumers_caught_up()

    # -- end of run -----------------------------------------------------------------------
    def _consumer_hw_must_be_monotonic(self) -> bool:
        """DESIGN's strict MonotonicHighWatermark: the HW a consumer observes never goes back
        (the core's consumer HW guard; without it, Kafka's Fetch lets it), unless data itself
        may be lost: a power loss or an unclean election can take back a published HW."""
        rc = self.config.replication
        return not rc.unclean_leader_election_enable and not any(
            n.had_lossy_crash for n in self.nodes)

    def final_checks(self) -> list[Violation]:
        """NoAckedLoss, consumed data stable, replicas identical batch by batch."""
        out: list[Violation] = []
        now = self.scheduler.now_ms

        def fail(name: str, tp: TopicPartition | None, detail: str) -> None:
            out.append(Violation(now, name, tp, detail))

        # The replica checks the real-process fault tests run too (one ClusterView each).
        for name, tp, detail in check_replicas(
                self, converged=True, exempt=self.exempt):
            fail(name, tp, detail)
        for tp in self.tps:
            leader = self.acting_leader(tp)
            if leader is None and self.offline_by_kip966(tp):
                # Acked data must still be on some replica's disk.
                held: set[tuple[int, int]] = set()
                for r in self.assignments[tp]:
                    log = self.nodes[r].log(tp)
                    if log is not None:
                        held.update((sig[0], sig[3]) for sig in batch_signatures(log))
                for prod in self.producers:
                    if prod.tp == tp and prod.acks == -1:
                        for crc, offset in prod.acked.items():
                            if (offset, crc) not in held:
                                fail("NoAckedLoss", tp, f"acked write at offset {offset} is on "
                                     "no replica (partition offline)")
                continue
            if leader is None:
                fail("Converged", tp, "no leader after healing")
                continue
            by_offset = {sig[0]: sig for sig in batch_signatures(leader.log(tp))}
            # Below the log start offset, retention (or DeleteRecords) removed it: not a loss.
            start = leader.log(tp).log_start_offset
            for prod in self.producers:
                if prod.tp != tp or prod.acks != -1:
                    continue
                for crc, offset in prod.acked.items():
                    if offset < start:
                        continue
                    sig = by_offset.get(offset)
                    if sig is None or sig[3] != crc:
                        fail("NoAckedLoss", tp, f"acked write at offset {offset} (crc {crc:#x}) "
                             f"is gone: log has {sig}")
            acked_all = {off for prod in self.producers if prod.tp == tp and prod.acks == -1
                         for off in prod.acked.values()}
            for cons in self.consumers:
                if cons.tp != tp:
                    continue
                if cons.position >= leader.partition(tp).high_watermark:
                    missing = sorted(acked_all - set(cons.consumed))
                    if missing:
                        fail("AckedConsumed", tp, f"{len(missing)} acked offsets never consumed, "
                             f"first {missing[0]}")
                else:
                    fail("ConsumerStuck", tp, f"consumer at {cons.position} never reached HW "
                         f"{leader.partition(tp).high_watermark}")
                for offset, crc in cons.consumed.items():
                    if offset < start:
                        continue
                    sig = by_offset.get(offset)
                    if sig is None or sig[3] != crc:
                        fail("ConsumedStable", tp, f"consumed offset {offset} changed: {sig}")
                for prev, got in cons.offset_violations[:3]:
                    fail("ConsumerOffsets", tp, f"consumer at {prev} received offset {got}")
                if cons.hw_regressions and self._consumer_hw_must_be_monotonic():
                    fail("MonotonicHighWatermark", tp, f"a consumer saw the HW go back "
                         f"{cons.hw_regressions} time(s) across leader changes")
        out.extend(check_producers(self))  # NoDuplicates, InOrderSequences, NoDuplicateAck
        return out

    def _controller_receive(self, src: int, msg: Any) -> None:
        if isinstance(msg, ControllerResponse) and self.controller is not None:
            self.controller.on_response(src, msg)

    def _controller_channel_receive(self, src: int, msg: Any) -> None:
        if isinstance(msg, AlterPartitionMessage):
            answer = (self.controller.alter_partition(src, msg.broker_epoch, msg.proposals)
                      if self.controller is not None else None)
            if answer is not None:  # no controller: no answer, the leader's request times out
                self.network.send(CONTROLLER_CHANNEL_NODE, src,
                                  AlterPartitionReply(msg.corr_id, answer))

    # -- ZooKeeper server ---------------------------------------------------------------------
    def _zk_receive(self, src: int, msg: Any) -> None:
        if not isinstance(msg, ZkRequest):
            return
        zk = self.zk
        op = msg.op
        sid = msg.session_id
        kind = op[0]
        if kind == "connect":
            sid = zk.create_session(op[1])
            self.network.send(ZK_NODE, src, ZkResponse(msg.corr_id, sid, op, "ok", sid))
            return
        if not zk.touch(sid):
            if kind != "ping" or sid:
                self.network.send(ZK_NODE, src, ZkResponse(msg.corr_id, sid, op,
                                                           "session_expired"))
            return
        if kind == "ping":
            return
        if kind == "register":
            code, path = zk.create(f"/brokers/ids/{op[1]}", op[2], session_id=sid)
            stat = zk.exists(path)
            if code is ZkCode.NODE_EXISTS and stat is not None and stat.ephemeral_owner == sid:
                # Kafka's checkedEphemeralCreate: our own earlier create (its answer was lost).
                code = ZkCode.OK
            result = stat.czxid if code is ZkCode.OK and stat is not None else None
            self.network.send(ZK_NODE, src, ZkResponse(msg.corr_id, sid, op, code.value, result))
        elif kind == "log_dir_event":
            zk.propagate_log_dir_event(src, session_id=sid)
            self.network.send(ZK_NODE, src, ZkResponse(msg.corr_id, sid, op, "ok"))


class LogReplica:
    """A simulated replica's log as the replica checks read it."""

    __slots__ = ("log",)

    def __init__(self, log: Any) -> None:
        self.log = log

    @property
    def log_end_offset(self) -> int:
        return int(self.log.log_end_offset)

    def batches(self, start: int = 0, end: int | None = None) -> list[tuple[int, int, int, int]]:
        return batch_signatures(self.log, start, end)

    def batch_at(self, offset: int) -> tuple[int, int, int, int] | None:
        return batch_at(self.log, offset)
