"""A simulated broker: the shared shell (`shell.ReplicaManager` and its
`ReplicaFetcherManager`, the broker that ships) over the real storage engine (`LogManager`) on a
crash-able `MemoryFileIO`. The node supplies only what the shell asks of a driver: a clock and a
scheduler (virtual time, frozen while the process is paused, gone with the process), the
transport of the shell's `AlterPartitionManager` to the controller (AlterPartition over the
simulated network, `SimAlterPartitionTransport`) and the transport to leaders (one
`LeaderEndPoint` per fetcher).

Besides, it routes requests to the shell and answers them, keeps its ZooKeeper session alive
and runs the page cache's writeback (every `os_flush_ms`, which decides what a lossy crash
loses).

Process life: `start()` opens the logs (recovering them; the LogManager reads the HW
checkpoint), connects to ZooKeeper and registers `/brokers/ids/<id>` as an ephemeral znode whose
creation zxid is the broker epoch. `stop(kind)` is a clean shutdown ("clean": logs flushed,
checkpointed and closed, session closed), a process kill ("kill": unflushed writes stay in the
page cache, the ZooKeeper session lingers until it expires) or a power loss ("lossy":
`MemoryFileIO.crash` drops what was not flushed, optionally tearing the last write). `pause()`
freezes the process (a long GC / SIGSTOP): it handles nothing and pings nobody, so its session
may expire; on `resume()` it processes its backlog (messages and timers that came due) as a
zombie until it learns better.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tidelog.controller import zk_data
from tidelog.controller.core import (
    LeaderAndIsrRequest,
    StopReplicaRequest,
    UpdateMetadataRequest,
)
from tidelog.protocol.records.batch import iter_batches
from tidelog.replication.errors import Errors
from tidelog.replication.fetcher import (
    FetcherRequest,
    FetchRequest,
    ListOffsetsRequest,
    OffsetsForLeaderEpochRequest,
)
from tidelog.replication.replica_manager import ReplicaManager as ReplicaManagerCore
from tidelog.replication.types import (
    CompleteFetch,
    CompleteProduce,
    ProposeIsr,
    TopicPartition,
)
from tidelog.shell.alter_partition_manager import AlterPartitionAnswer, AlterPartitionManager
from tidelog.shell.log_tasks import LogTaskIntervals
from tidelog.shell.replica_manager import ReplicaManager
from tidelog.sim.clock import Timer
from tidelog.sim.disk import MemoryFileIO
from tidelog.sim.messages import (
    CONTROLLER_CHANNEL_NODE,
    CONTROLLER_NODE,
    ZK_NODE,
    AlterPartitionMessage,
    AlterPartitionReply,
    ConsumerFetchRequest,
    ConsumerFetchResponse,
    ControllerMessage,
    ControllerResponse,
    ProduceRequest,
    ProduceResponse,
    ReplicaFetchRequest,
    ReplicaFetchResponse,
    ZkRequest,
    ZkResponse,
)
from tidelog.sim.txn_node import SimTxnHost
from tidelog.storage.errors import KafkaStorageError
from tidelog.storage.log_manager import LogManager
from tidelog.storage.producer_state_manager import VerificationGuard

if TYPE_CHECKING:  # pragma: no cover
    from tidelog.sim.cluster import SimCluster


@dataclass(slots=True)
class BrokerStats:
    isr_shrinks: int = 0
    isr_expands: int = 0
    isr_update_failures: int = 0
    restarts: int = 0
    registrations: int = 0
    stale_requests_refused: int = 0


class ProcessScheduler:
    """The shell's `Time` and `Scheduler` for one process of a node: virtual time; a timer
    that comes due while the process is paused waits in its backlog, a periodic run is skipped;
    nothing of an earlier process ever runs."""

    __slots__ = ("incarnation", "node")

    def __init__(self, node: SimBroker) -> None:
        self.node = node
        self.incarnation = node.incarnation

    def milliseconds(self) -> int:
        return self.node.scheduler.now_ms

    def schedule(self, name: str, fn: Callable[[], Any], delay_ms: int,
                 period_ms: int = -1) -> Timer | _PeriodicTask:
        node = self.node
        if period_ms <= 0:
            return node.scheduler.schedule(delay_ms, self._once, fn)
        # Processes do not start on the same millisecond: spread each periodic task's first
        # run over its period (from the run's seed), or every broker's tasks fire together.
        first = max(delay_ms, node.cluster.rng.randint(1, period_ms))
        task = _PeriodicTask()
        task.timer = node.scheduler.schedule(first, self._periodic, fn, period_ms, task)
        return task

    def _alive(self) -> bool:
        return self.node.running and self.node.incarnation == self.incarnation

    def _once(self, fn: Callable[[], Any]) -> None:
        if not self._alive():
            return
        if self.node.paused:
            self.node._backlog.append((-1, _Deferred(fn)))
            return
        fn()

    def _periodic(self, fn: Callable[[], Any], period_ms: int, task: _PeriodicTask) -> None:
        if not self._alive() or task.cancelled:
            return
        if not self.node.paused:
            fn()
        task.timer = self.node.scheduler.schedule(period_ms, self._periodic, fn, period_ms, task)


class _PeriodicTask:
    __slots__ = ("cancelled", "timer")

    def __init__(self) -> None:
        self.timer: Timer | None = None
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True
        if self.timer is not None:
            self.timer.cancel()


class SimLeaderEndPoint:
    """A fetcher's requests to its leader over the simulated network; an answer not back within
    `request_timeout_ms` fails the request."""

    __slots__ = ("corr_ids", "node", "source_broker")

    def __init__(self, node: SimBroker, source_broker: int) -> None:
        self.node = node
        self.source_broker = source_broker
        self.corr_ids: set[int] = set()

    def send(self, request: FetcherRequest, on_done: Callable[[Any | None], None]) -> None:
        node = self.node
        node._corr += 1
        corr = node._corr
        timer = node.process.schedule("replica-request-timeout", lambda: self._timeout(corr),
                                      node.cluster.config.request_timeout_ms)
        node._inflight[corr] = (self, on_done, timer)
        self.corr_ids.add(corr)
        node.network.send(node.broker_id, self.source_broker,
                          ReplicaFetchRequest(corr, node.broker_epoch, request))

    def _timeout(self, corr: int) -> None:
        entry = self.node._inflight.pop(corr, None)
        if entry is not None:
            self.corr_ids.discard(corr)
            entry[1](None)

    def answered(self, corr: int) -> None:
        self.corr_ids.discard(corr)

    def close(self) -> None:
        for corr in self.corr_ids:
            entry = self.node._inflight.pop(corr, None)
            if entry is not None:
                entry[2].cancel()
        self.corr_ids.clear()


class SimBroker:
    def __init__(self, cluster: SimCluster, broker_id: int) -> None:
        self.cluster = cluster
        self.broker_id = broker_id
        self.scheduler = cluster.scheduler
        self.network = cluster.network
        self.config = cluster.config.replication
        self.file_io = MemoryFileIO()
        # Its log dirs (`log.dirs`), all on the one simulated disk; the `disk` fault fails one.
        k = cluster.config.log_dirs_per_broker
        self.log_dirs = ([f"/data/broker-{broker_id}"] if k == 1 else
                         [f"/data/broker-{broker_id}/dir-{i}" for i in range(k)])
        for d in self.log_dirs:
            self.file_io.makedirs(d, durable=True)  # set up before the broker first runs
        self.running = False
        self.paused = False
        self.incarnation = 0
        self.process = ProcessScheduler(self)
        self.log_manager: LogManager | None = None
        self.rm: ReplicaManager | None = None
        self.core: ReplicaManagerCore | None = None
        self.session_id = 0
        self.broker_epoch = -1
        self.clean_shutdown = True  # how the previous process ended
        # Partitions whose log this broker lost in a power loss -> the first leader epoch
        # written after the controller handled this broker's failure (None: not yet). Leaders of
        # older epochs may still count on data that is gone.
        self.dirty: dict[TopicPartition, int | None] = {}
        self.had_lossy_crash = False  # a power loss may take back what consumers already saw
        self._backlog: list[tuple[int, Any]] = []
        # Log dirs failing now (the `disk` fault): their data cannot be read or written.
        self.failed_dirs: set[str] = set()
        self.halts = 0  # processes halted with no log dir left (Kafka's Exit.halt(1))
        self._corr = 0
        # corr -> (endpoint, on_done, timer) of a fetcher's request
        self._inflight: dict[int, tuple[SimLeaderEndPoint, Callable[[Any | None], None], Any]] = {}
        # corr -> (on_done, timer) of an AlterPartition to the controller
        self._alter_inflight: dict[int, tuple[Callable[[AlterPartitionAnswer | None], None],
                                              Any]] = {}
        self.alter_partition: AlterPartitionManager | None = None
        # corr -> (op, timer, on_result) of a ZooKeeper request
        self._zk_inflight: dict[int, tuple[tuple[Any, ...], Any, Callable[[Any], None] | None]] = {}
        self.stats = BrokerStats()
        self.txn: SimTxnHost | None = None  # the transaction coordinator (runs with txns)
        self.network.register(broker_id, self.receive)
        self.network.set_up(broker_id, False)

    # ---------------------------------------------------------------- process life
    def start(self) -> None:
        if self.running:
            return
        now = self.scheduler.now_ms
        cfg = self.cluster.config
        log_manager = LogManager(
            self.log_dirs, self.cluster.log_config, self.file_io, now_ms=now,
            topic_configs={cfg.topic: self.cluster.topic_log_config},
            producer_id_expiration_ms=cfg.producer_id_expiration_ms)
        if not log_manager.live_log_dirs:
            # As the broker's startup (server.py): no usable log dir, no broker.
            self.trace("start_failed", "no usable log dir")
            return
        self.running = True
        self.paused = False
        self.incarnation += 1
        self.process = ProcessScheduler(self)
        self.stats.restarts += 1
        self.network.set_up(self.broker_id, True)
        self.log_manager = log_manager
        self._inflight.clear()
        self._alter_inflight.clear()
        self._zk_inflight.clear()
        self._backlog.clear()
        self.broker_epoch = -1
        self.session_id = 0
        # The replica manager serves before the broker is registered, as Kafka's does; the
        # broker epoch is filled in when the registration's answer comes back.
        self.alter_partition = AlterPartitionManager(
            self.broker_id, SimAlterPartitionTransport(self), self.process,
            lambda: self.broker_epoch)
        self.rm = ReplicaManager(
            self.broker_id, self.log_manager, self.config, time=self.process,
            scheduler=self.process, alter_partition_manager=self.alter_partition,
            leader_end_point=lambda source, _fetcher_id: SimLeaderEndPoint(self, source),
            high_watermark_checkpoint_interval_ms=cfg.hw_checkpoint_ms,
            log_task_intervals=LogTaskIntervals(
                log_retention_check_interval_ms=cfg.log_retention_check_ms,
                log_flush_scheduler_interval_ms=cfg.log_flush_scheduler_ms,
                recovery_point_checkpoint_interval_ms=cfg.recovery_point_checkpoint_ms,
                producer_id_expiration_check_interval_ms=cfg.producer_id_expiration_check_ms,
                log_initial_task_delay_ms=cfg.log_initial_task_delay_ms),
            log_dir_failure=SimLogDirFailureHandling(self))
        self.core = self.rm.core
        self.trace("start", ("clean", self.clean_shutdown))
        self._zk_send(("connect", cfg.session_timeout_ms))
        self.rm.startup()
        if self.cluster.txn is not None:
            self.txn = SimTxnHost(self)
        self.process.schedule("zookeeper-ping", self._ping, 0, max(1, cfg.session_timeout_ms // 3))
        self.process.schedule("page-cache-writeback", self.flush_logs, 0, cfg.os_flush_ms)

    def stop(self, kind: str = "clean", tear: bool | None = None) -> None:
        """kind: "clean" (SIGTERM after controlled shutdown), "kill" (kill -9: the page cache
        survives), "lossy" (power loss: unflushed writes are lost, the last may be torn)."""
        if not self.running:
            return
        self.trace("stop", kind)
        if self.txn is not None:
            self.txn.shutdown()
            self.txn = None
        if self.rm is not None:
            self.rm.shutdown()
        if self.alter_partition is not None:
            self.alter_partition.shutdown()
            self.alter_partition = None
        if kind == "clean" and self.log_manager is not None:
            self.log_manager.shutdown()  # flushes, writes the checkpoints, then the marker
            if self.session_id:
                self.cluster.zk.close_session(self.session_id)
        if kind == "lossy":
            if tear is None:
                tear = self.cluster.rng.random() < 0.5
            self.file_io.crash(self.cluster.rng, tear)
        self.clean_shutdown = kind == "clean"
        self.running = False
        self.paused = False
        self.network.set_up(self.broker_id, False)
        self.log_manager = None
        self.rm = None
        self.core = None
        if kind == "lossy":
            self.had_lossy_crash = True
            for tp in self.cluster.assignments:  # `__transaction_state` too, when there
                self.dirty[tp] = None

    def pause(self) -> None:
        if self.running and not self.paused:
            self.paused = True
            self.trace("pause")

    def resume(self) -> None:
        if self.running and self.paused:
            self.paused = False
            self.trace("resume", ("backlog", len(self._backlog)))
            backlog, self._backlog = self._backlog, []
            for src, msg in backlog:
                if self.running and not self.paused:
                    self._handle(src, msg)

    def halt(self, reason: str) -> None:
        """Kafka's Exit.halt(1): the process ends at once, no shutdown hook (the page cache
        survives, as a kill -9)."""
        self.halts += 1
        self.trace("halt", reason)
        self.stop("kill")

    def trace(self, kind: str, *details: Any) -> None:
        self.cluster.trace_add((kind, self.broker_id, *details))

    # ---------------------------------------------------------------- views (invariants)
    def leader_views(self) -> Iterator[tuple[TopicPartition, tuple[int, int, Any, Any]]]:
        core = self.core
        if core is None:
            return
        for tp, p in core.partitions.items():
            if p.is_leader:
                yield tp, (p.leader_epoch, p.high_watermark, p.isr, p.maximal_isr)

    def log(self, tp: TopicPartition) -> Any:
        if self.log_manager is None:
            return None
        return self.log_manager.get_log(tp.topic, tp.partition)

    def log_end_offset(self, tp: TopicPartition) -> int | None:
        log = self.log(tp)
        return None if log is None else log.log_end_offset

    def is_dirty(self, tp: TopicPartition, leader_epoch: int) -> bool:
        """True if a leader in `leader_epoch` may still count on data this broker lost in a
        power loss (its view of this replica predates the crash). A lossy crash of an ISR
        member breaks ValidHighWatermark/StrongIsr for such a leader in Kafka too; what must
        hold then is NoAckedLoss (checked at the end)."""
        if tp not in self.dirty:
            return False
        handled_in = self.dirty[tp]
        return handled_in is None or leader_epoch < handled_in

    def failure_handled(self) -> None:
        """The controller has handled this broker's failure (or bounce): leader epochs from now
        on were decided without counting on its lost data."""
        for tp, handled_in in self.dirty.items():
            if handled_in is None:
                state = self.cluster.zk_state(tp)
                self.dirty[tp] = state.leader_epoch if state is not None else 0

    def recovering(self) -> bool:
        """Lost data in a power loss and not yet back in the ISR of a running leader of a newer
        epoch (the fault injector allows one such broker at a time)."""
        for tp, handled_in in self.dirty.items():
            leader = self.cluster.acting_leader(tp)
            p = leader.partition(tp) if leader is not None else None
            if (not self.running or p is None or handled_in is None
                    or p.leader_epoch < handled_in or self.broker_id not in p.isr):
                return True
        return False

    def partition(self, tp: TopicPartition) -> Any:
        return None if self.core is None else self.core.partitions.get(tp)

    @property
    def disk_failed(self) -> bool:
        return bool(self.failed_dirs)

    def readable(self, tp: TopicPartition) -> bool:
        """Its log of `tp` is not in a failing dir: the invariant checks read only such logs
        (their read of a failing dir would report it, ahead of the broker's own I/O)."""
        lm = self.log_manager
        if not self.failed_dirs or lm is None:
            return True
        return lm.log_dir_of.get(tp) not in self.failed_dirs

    # ---------------------------------------------------------------- messages
    def receive(self, src: int, msg: Any) -> None:
        if not self.running:
            return
        if self.paused:
            self._backlog.append((src, msg))
            return
        self._handle(src, msg)

    def _handle(self, src: int, msg: Any) -> None:
        if isinstance(msg, _Deferred):
            msg.fn()
            return
        if self.broker_epoch < 0 and not isinstance(msg, ZkResponse | _Retry):
            # Kafka processes requests only once the broker is registered (they wait in the
            # socket backlog); then a request meant for the previous process's registration is
            # refused by its older broker epoch.
            self._backlog.append((src, msg))
            return
        if isinstance(msg, ReplicaFetchRequest):
            self._on_replica_request(src, msg)
        elif isinstance(msg, ReplicaFetchResponse):
            self._on_replica_response(msg)
        elif isinstance(msg, ProduceRequest):
            self._on_produce(src, msg)
        elif isinstance(msg, ConsumerFetchRequest):
            self._on_consumer_fetch(src, msg)
        elif isinstance(msg, ZkResponse):
            self._on_zk_response(msg)
        elif isinstance(msg, AlterPartitionReply):
            self._on_alter_partition_reply(msg)
        elif isinstance(msg, ControllerMessage):
            self._on_controller(msg.request)
        elif isinstance(msg, _Retry):
            self._zk_send(msg.op, msg.on_result)
        elif self.txn is not None:
            self.txn.receive(src, msg)

    # -- produce / consume ---------------------------------------------------------------
    def _on_produce(self, src: int, msg: ProduceRequest) -> None:
        if self.rm is not None and self.txn is not None and msg.transactional_id is not None:
            # KIP-890 (transaction.partition.verification.enable, on as Kafka's default): the
            # batch of a producer with no transaction open here waits for its coordinator.
            self.txn.verify_produce(src, msg, lambda guards: self._append(src, msg, guards))
        else:
            self._append(src, msg, None)

    def _append(self, src: int, msg: ProduceRequest,
                guards: Mapping[TopicPartition, VerificationGuard] | None) -> None:
        rm = self.rm
        if rm is None:
            self.network.send(self.broker_id, src, ProduceResponse(
                msg.corr_id, msg.tp, int(Errors.NOT_LEADER_OR_FOLLOWER), -1))
            return
        tp = msg.tp

        def answer(done: CompleteProduce) -> None:
            r = done.results[tp]
            if r.error == Errors.NONE:  # only acks=all produces wait
                self._check_min_isr_ack(tp)
            self.network.send(self.broker_id, src, ProduceResponse(msg.corr_id, tp,
                                                                   int(r.error), r.base_offset))

        out = rm.append_records(msg.acks, {tp: msg.records}, msg.timeout_ms,
                                ("p", src, msg.corr_id), answer, verification_guards=guards)
        if out.delayed:
            return
        assert out.results is not None
        r = out.results[tp]
        if r.error == Errors.NONE:
            self.trace("append", str(tp), ("offset", r.base_offset), ("acks", msg.acks))
            if msg.acks == -1:
                self._check_min_isr_ack(tp)
        self.network.send(self.broker_id, src, ProduceResponse(msg.corr_id, tp,
                                                               int(r.error), r.base_offset))

    def _check_min_isr_ack(self, tp: TopicPartition) -> None:
        """MinIsrAck: an acks=all write is acknowledged only while the ISR the leader counts
        (current members plus pending additions) has at least the topic's min.insync.replicas,
        taken from the cluster's topic configuration, not from the broker's."""
        p = self.partition(tp)
        if p is None:
            return
        # Kafka's effectiveMinIsr: the topic's value, capped at the replication factor.
        min_isr = min(self.cluster.topic_log_config.min_insync_replicas,
                      len(self.cluster.assignments[tp]))
        if len(p.maximal_isr) < min_isr:
            self.cluster.checker.fail(
                "MinIsrAck", tp, f"leader {self.broker_id} acknowledged an acks=all write with "
                f"ISR {sorted(p.maximal_isr)} < min.insync.replicas {min_isr}")

    def _on_consumer_fetch(self, src: int, msg: ConsumerFetchRequest) -> None:
        rm = self.rm
        if rm is None:
            self.network.send(self.broker_id, src, ConsumerFetchResponse(
                msg.corr_id, msg.tp, int(Errors.NOT_LEADER_OR_FOLLOWER), -1, b""))
            return
        tp = msg.tp
        out = rm.fetch_messages(
            -1, msg.max_wait_ms, 1, 1 << 20,
            {tp: (msg.fetch_offset, msg.current_leader_epoch, -1, 1 << 20)},
            ("c", src, msg.corr_id),
            lambda done: self._reply_consumer(src, msg.corr_id, tp, done.results[tp]),
            isolation_level=msg.isolation_level)
        if not out.delayed:
            assert out.results is not None
            self._reply_consumer(src, msg.corr_id, tp, out.results[tp])

    def _reply_consumer(self, src: int, corr: int, tp: TopicPartition, data: Any) -> None:
        records = bytes(data.records) if data.records else b""
        if data.error == Errors.NONE and records:
            p = self.partition(tp)
            hw = p.high_watermark if p is not None else -1
            for b in iter_batches(records):
                if b.last_offset >= hw:
                    self.cluster.checker.fail(
                        "ConsumersBelowHw", tp,
                        f"broker {self.broker_id} served offset {b.last_offset} at HW {hw}")
                    break
        self.network.send(self.broker_id, src, ConsumerFetchResponse(
            corr, tp, int(data.error), data.high_watermark, records, data.last_stable_offset,
            data.aborted_transactions))

    # -- replication requests (leader side) ------------------------------------------------
    def _on_replica_request(self, src: int, msg: ReplicaFetchRequest) -> None:
        rm = self.rm
        if rm is None:
            return  # not serving yet: the follower's request times out
        req = msg.request
        resp: Any
        if isinstance(req, FetchRequest):
            def answer(done: CompleteFetch) -> None:
                self.network.send(self.broker_id, src,
                                  ReplicaFetchResponse(msg.corr_id, req, dict(done.results)))

            out = rm.fetch_messages(req.replica_id, req.max_wait_ms, req.min_bytes,
                                    req.max_bytes, req.fetch_args(), ("f", src, msg.corr_id),
                                    answer, broker_epoch=req.broker_epoch)
            if out.delayed:
                return
            assert out.results is not None
            resp = dict(out.results)
        elif isinstance(req, OffsetsForLeaderEpochRequest):
            resp = rm.core.last_offset_for_leader_epoch(req.replica_id, req.partitions)
        elif isinstance(req, ListOffsetsRequest):
            resp = rm.core.list_offsets(req.replica_id, req.partitions)
        else:
            return
        self.network.send(self.broker_id, src, ReplicaFetchResponse(msg.corr_id, req, resp))

    # -- replication responses (follower side) ---------------------------------------------
    def _on_replica_response(self, msg: ReplicaFetchResponse) -> None:
        entry = self._inflight.pop(msg.corr_id, None)
        if entry is None:
            return  # a duplicate, a late answer, or an answer to an earlier process
        endpoint, on_done, timer = entry
        timer.cancel()
        endpoint.answered(msg.corr_id)
        on_done(msg.response)

    # -- controller requests ------------------------------------------------------------
    def _on_controller(self, req: Any) -> None:
        rm = self.rm
        if rm is None:
            return
        if isinstance(req, LeaderAndIsrRequest):
            res = rm.become_leader_or_follower(req.controller_id, req.controller_epoch,
                                               req.broker_epoch, req.partition_states,
                                               req.live_leaders)
            error = res.error
            if error == Errors.NONE:
                errors: dict[TopicPartition, int] = {}
                for s in req.partition_states:
                    err = res.partition_errors.get(s.tp, Errors.NONE)
                    errors[s.tp] = int(err)
                    role = "leader" if s.leader == self.broker_id else "follower"
                    self.trace("leader_and_isr", str(s.tp), role, ("epoch", s.leader_epoch),
                               ("isr", tuple(s.isr)), ("err", int(err)))
                # The answer (an answer with a request-level error names no partition, and
                # the controller ignores it).
                self.network.send(self.broker_id, CONTROLLER_NODE, ControllerResponse(
                    req.controller_epoch, req.broker_epoch, errors))
        elif isinstance(req, UpdateMetadataRequest):
            error = rm.update_metadata(
                req.broker_epoch,
                req.live_brokers if self.cluster.config.kip841_eligibility else None)
        elif isinstance(req, StopReplicaRequest):
            error = rm.stop_replicas(req.controller_id, req.controller_epoch, req.broker_epoch,
                                     {tp: req.delete_partitions for tp in req.partitions}).error
        else:
            return
        if self.txn is not None and not isinstance(req, UpdateMetadataRequest):
            self.txn.sync()  # leadership of `__transaction_state` partitions may have changed
        if error == Errors.STALE_BROKER_EPOCH:
            self.stats.stale_requests_refused += 1
            self.trace("stale_broker_epoch", type(req).__name__, req.broker_epoch)

    # -- AlterPartition: the transport of the shell's AlterPartitionManager -----------------
    def _on_alter_partition_reply(self, msg: AlterPartitionReply) -> None:
        entry = self._alter_inflight.pop(msg.corr_id, None)
        if entry is None:
            return  # a late answer (the request timed out and was sent again)
        on_done, timer = entry
        timer.cancel()
        answer: AlterPartitionAnswer = msg.answer
        for tp, part in sorted(answer.partitions.items()):
            if part.error == 0:
                p = self.partition(tp)
                old = set(p.isr) if p is not None else set()
                new = set(part.isr)
                if new - old:
                    self.stats.isr_expands += 1
                if old - new:
                    self.stats.isr_shrinks += 1
                self.trace("isr_update", str(tp), ("isr", tuple(part.isr)),
                           ("zkv", part.partition_epoch))
            else:
                self.stats.isr_update_failures += 1
                self.trace("isr_update_failed", str(tp), ("err", part.error))
        on_done(answer)

    # -- ZooKeeper: the session ------------------------------------------------------------
    def _zk_send(self, op: tuple[Any, ...],
                 on_result: Callable[[Any], None] | None = None) -> None:
        self._corr += 1
        corr = self._corr
        timer = self.scheduler.schedule(self.cluster.config.request_timeout_ms,
                                        self._on_zk_timeout, corr, self.incarnation)
        self._zk_inflight[corr] = (op, timer, on_result)
        self.network.send(self.broker_id, ZK_NODE, ZkRequest(corr, self.session_id, op))

    def _on_zk_timeout(self, corr: int, inc: int) -> None:
        if not self.running or self.incarnation != inc:
            return
        entry = self._zk_inflight.pop(corr, None)
        if entry is None:
            return
        op, _, on_result = entry
        if op[0] in ("connect", "register", "log_dir_event"):
            if self.paused:
                self._backlog.append((-1, _Retry(op, on_result)))
            else:
                self._zk_send(op, on_result)  # ZooKeeper clients retry on connection loss

    def _on_zk_response(self, msg: ZkResponse) -> None:
        if msg.op[0] == "ping":
            if msg.code == "session_expired" and msg.session_id == self.session_id:
                self._session_expired()
            return
        entry = self._zk_inflight.pop(msg.corr_id, None)
        if entry is None:
            return
        _, timer, on_result = entry
        timer.cancel()
        op = msg.op
        if msg.code == "session_expired" and op[0] != "connect":
            self._session_expired()
            if on_result is not None:
                on_result(None)
            return
        if op[0] == "connect":
            self.session_id = msg.result
            self._zk_send(self._register_op())
        elif op[0] == "register":
            if msg.code == "node_exists":
                # The previous process's session is still alive: wait for it to expire.
                self.scheduler.schedule(self.cluster.config.session_timeout_ms // 4,
                                        self._retry_register, self.incarnation, self.session_id)
                return
            self._registered(msg.result)
        elif on_result is not None:
            on_result(msg)

    def _register_op(self) -> tuple[str, int, bytes]:
        """/brokers/ids/<id> in Kafka's JSON (with tidelog's KIP-966 clean-shutdown flag), as
        KafkaZkClient.register_broker writes it; the controller reads it through the same
        ZooKeeper interface on both drivers."""
        info = zk_data.BrokerInfo(
            self.broker_id,
            (zk_data.BrokerEndPoint("PLAINTEXT", f"broker{self.broker_id}.sim", 9092),),
            clean_shutdown=self.clean_shutdown)
        return "register", self.broker_id, info.encode(timestamp_ms=self.scheduler.now_ms)

    def _retry_register(self, inc: int, session_id: int) -> None:
        if self.running and self.incarnation == inc and self.session_id == session_id:
            op = self._register_op()
            if self.paused:
                self._backlog.append((-1, _Retry(op, None)))
                return
            self._zk_send(op)

    def _session_expired(self) -> None:
        """Kafka's broker re-registers with a new session (a new broker epoch)."""
        if not self.session_id:
            return
        self.trace("session_expired", ("session", self.session_id))
        self.session_id = 0
        self._zk_send(("connect", self.cluster.config.session_timeout_ms))

    def _registered(self, broker_epoch: int) -> None:
        first = self.broker_epoch < 0
        self.broker_epoch = broker_epoch
        self.stats.registrations += 1
        self.trace("registered", ("epoch", broker_epoch))
        if self.rm is not None:
            self.rm.set_broker_epoch(broker_epoch)
        if first and self._backlog and not self.paused:
            backlog, self._backlog = self._backlog, []
            for src, msg in backlog:
                self._handle(src, msg)

    def _ping(self) -> None:
        if self.session_id:
            self.network.send(self.broker_id, ZK_NODE, ZkRequest(0, self.session_id, ("ping",)))

    def flush_logs(self) -> None:
        """The page cache written back: everything appended so far survives a power loss."""
        if self.log_manager is None:
            return
        for log in self.log_manager.all_logs():
            try:
                log.flush()
            except KafkaStorageError:
                pass  # a failed disk: what is not flushed is what a power loss would take


class SimAlterPartitionTransport:
    """AlterPartition to the controller over the simulated network, on the brokers' own
    channel to it (`CONTROLLER_CHANNEL_NODE`: always the same node, a failover changes who
    answers there and loses what was on its way); an answer not back within
    `request_timeout_ms` fails the request (the manager sends it again)."""

    __slots__ = ("node",)

    def __init__(self, node: SimBroker) -> None:
        self.node = node

    def send(self, broker_epoch: int, items: Sequence[ProposeIsr],
             on_done: Callable[[AlterPartitionAnswer | None], None]) -> None:
        node = self.node
        node._corr += 1
        corr = node._corr
        for prop in items:
            node.trace("propose_isr", str(prop.tp), ("isr", tuple(prop.new_isr)),
                       ("zkv", prop.zk_version))
        timer = node.process.schedule("alter-partition-timeout", lambda: self._timeout(corr),
                                      node.cluster.config.request_timeout_ms)
        node._alter_inflight[corr] = (on_done, timer)
        node.network.send(node.broker_id, CONTROLLER_CHANNEL_NODE,
                          AlterPartitionMessage(corr, broker_epoch, tuple(items)))

    def _timeout(self, corr: int) -> None:
        entry = self.node._alter_inflight.pop(corr, None)
        if entry is not None:
            entry[0](None)


class SimLogDirFailureHandling:
    """The shell's `LogDirFailureHandling` in the simulator: the log dir event notification
    written over the simulated network to ZooKeeper (as `ZkLogDirFailureHandling` writes it
    with kazoo), and the halt of the process."""

    __slots__ = ("incarnation", "node")

    def __init__(self, node: SimBroker) -> None:
        self.node = node
        self.incarnation = node.incarnation

    def propagate_log_dir_event(self) -> None:
        node = self.node
        node.trace("log_dir_event")
        node._zk_send(("log_dir_event",))

    def halt(self, reason: str) -> None:
        if self.node.running and self.node.incarnation == self.incarnation:
            self.node.halt(reason)


@dataclass(slots=True)
class _Deferred:
    """A timer that came due while the process was paused."""

    fn: Callable[[], Any]


@dataclass(slots=True)
class _Retry:
    op: tuple[Any, ...]
    on_result: Callable[[Any], None] | None
