"""A simulated broker: the real `ReplicaManager` and `FetcherManager` over the real storage
engine (`LogManager`) on a crash-able `MemoryFileIO`, driven by the simulator's clock and
network instead of asyncio and sockets.

The node is only a shell, as `broker/` will be: it routes requests to the core, sends what the
core returns (fetch requests, ISR proposals as ZooKeeper compare-and-sets, delayed responses) and
runs seed 004's periodic tasks: `isr-expiration` (`maybe_shrink_isr` every
`replica.lag.time.max.ms / 2`), `highwatermark-checkpoint` (the `replication-offset-checkpoint`
file) and `isr-change-propagation` (seed 000's blackout rules, inside the core). A page-cache
writeback task flushes the logs every `os_flush_ms`, which decides what a lossy crash loses.

Process life: `start()` opens the logs (recovering them), connects to ZooKeeper and registers
`/brokers/ids/<id>` as an ephemeral znode whose creation zxid is the broker epoch; only then are
the ReplicaManager and the fetchers created. `stop(kind)` is a clean shutdown ("clean": logs
flushed and closed, session closed), a process kill ("kill": unflushed writes stay in the page
cache, the ZooKeeper session lingers until it expires) or a power loss ("lossy":
`MemoryFileIO.crash` drops what was not flushed, optionally tearing the last write). `pause()`
freezes the process (a long GC / SIGSTOP): it handles nothing and pings nobody, so its session
may expire; on `resume()` it processes its backlog as a zombie until it learns better.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tidelog.controller.core import (
    LeaderAndIsrRequest,
    StopReplicaRequest,
    UpdateMetadataRequest,
)
from tidelog.protocol.records.batch import iter_batches
from tidelog.replication.errors import Errors
from tidelog.replication.fetcher import (
    FetcherManager,
    FetchRequest,
    ListOffsetsRequest,
    OffsetsForLeaderEpochRequest,
)
from tidelog.replication.replica_manager import ReplicaManager
from tidelog.replication.types import (
    CompleteFetch,
    CompleteProduce,
    ProposeIsr,
    TopicPartition,
)
from tidelog.sim.disk import MemoryFileIO
from tidelog.sim.messages import (
    ZK_NODE,
    ConsumerFetchRequest,
    ConsumerFetchResponse,
    ControllerMessage,
    ProduceRequest,
    ProduceResponse,
    ReplicaFetchRequest,
    ReplicaFetchResponse,
    ZkRequest,
    ZkResponse,
)
from tidelog.storage.checkpoint import OffsetCheckpointFile
from tidelog.storage.errors import KafkaStorageError
from tidelog.storage.log_manager import LogManager

if TYPE_CHECKING:  # pragma: no cover
    from tidelog.sim.cluster import SimCluster

HW_CHECKPOINT = "replication-offset-checkpoint"


@dataclass(slots=True)
class BrokerStats:
    isr_shrinks: int = 0
    isr_expands: int = 0
    isr_update_failures: int = 0
    restarts: int = 0
    registrations: int = 0
    stale_requests_refused: int = 0


class SimBroker:
    def __init__(self, cluster: SimCluster, broker_id: int) -> None:
        self.cluster = cluster
        self.broker_id = broker_id
        self.scheduler = cluster.scheduler
        self.network = cluster.network
        self.config = cluster.config.replication
        self.file_io = MemoryFileIO()
        self.log_dir = f"/data/broker-{broker_id}"
        self.running = False
        self.paused = False
        self.incarnation = 0
        self.log_manager: LogManager | None = None
        self.rm: ReplicaManager | None = None
        self.fm: FetcherManager | None = None
        self.session_id = 0
        self.broker_epoch = -1
        self.clean_shutdown = True  # how the previous process ended
        self.live_brokers: dict[int, int] = {}
        # Partitions whose log this broker lost in a power loss -> the first leader epoch
        # written after the controller handled this broker's failure (None: not yet). Leaders of
        # older epochs may still count on data that is gone.
        self.dirty: dict[TopicPartition, int | None] = {}
        self.had_lossy_crash = False  # a power loss may take back what consumers already saw
        self._backlog: list[tuple[int, Any]] = []
        self.disk_failed = False  # its log dir fails (a fault): its data cannot be read
        self._corr = 0
        self._inflight: dict[int, tuple[Any, Any]] = {}  # corr -> (fetcher request, timer)
        self._zk_inflight: dict[int, tuple[tuple[Any, ...], Any]] = {}
        self._delayed: dict[Any, tuple[int, int, str, TopicPartition | None]] = {}
        self._deadline_timer: Any = None
        self.stats = BrokerStats()
        self.network.register(broker_id, self.receive)
        self.network.set_up(broker_id, False)

    # ---------------------------------------------------------------- process life
    def start(self) -> None:
        if self.running:
            return
        self.running = True
        self.paused = False
        self.incarnation += 1
        self.stats.restarts += 1
        self.network.set_up(self.broker_id, True)
        now = self.scheduler.now_ms
        self.log_manager = LogManager(
            [self.log_dir], self.cluster.log_config, self.file_io, now_ms=now,
            topic_configs={self.cluster.config.topic: self.cluster.topic_log_config})
        # The replica manager serves before the broker is registered, as Kafka's does; the
        # broker epoch is filled in when the registration's answer comes back.
        hws: dict[TopicPartition, int] = {}
        try:
            hws = OffsetCheckpointFile.in_dir(self.file_io, self.log_dir, HW_CHECKPOINT).read()
        except Exception as exc:  # a corrupt checkpoint: start from 0, as Kafka would (logged)
            self.trace("hw_checkpoint_unreadable", str(exc))
        self.rm = ReplicaManager(self.broker_id, self.log_manager, self.config, broker_epoch=-1,
                                 initial_high_watermarks=hws, now_ms=now)
        self.fm = FetcherManager(self.broker_id, self.rm.logs_for_fetcher, self.config,
                                 broker_epoch=-1)
        self._inflight.clear()
        self._zk_inflight.clear()
        self._delayed.clear()
        self._backlog.clear()
        self.live_brokers = {}
        self.broker_epoch = -1
        self.session_id = 0
        self.trace("start", ("clean", self.clean_shutdown))
        self._zk_send(("connect", self.cluster.config.session_timeout_ms))
        inc = self.incarnation
        cfg = self.cluster.config
        self._every(cfg.fetcher_tick_ms, self._pump_fetchers, inc)
        self._every(max(1, self.config.replica_lag_time_max_ms // 2), self._isr_expiration, inc)
        self._every(cfg.hw_checkpoint_ms, self._checkpoint_hw, inc)
        self._every(cfg.isr_propagation_tick_ms, self._propagate_isr_changes, inc)
        self._every(max(1, cfg.session_timeout_ms // 3), self._ping, inc)
        self._every(cfg.os_flush_ms, self._os_flush, inc)

    def stop(self, kind: str = "clean", tear: bool | None = None) -> None:
        """kind: "clean" (SIGTERM after controlled shutdown), "kill" (kill -9: the page cache
        survives), "lossy" (power loss: unflushed writes are lost, the last may be torn)."""
        if not self.running:
            return
        self.trace("stop", kind)
        if kind == "clean" and self.log_manager is not None:
            if self.rm is not None:
                self._checkpoint_hw(self.incarnation)
            self.log_manager.shutdown()
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
        self.fm = None
        if kind == "lossy":
            self.had_lossy_crash = True
            for tp in self.cluster.tps:
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
            if self.running and not self.paused:
                self._after()  # delayed operations whose deadline passed while frozen

    def _every(self, interval_ms: int, task: Callable[[int], None], inc: int) -> None:
        def tick() -> None:
            if not self.running or self.incarnation != inc:
                return
            if not self.paused:
                task(inc)
            self.scheduler.schedule(interval_ms, tick)
        # Spread the first runs so that brokers' tasks do not all fire on the same tick.
        self.scheduler.schedule(self.cluster.rng.randint(1, interval_ms), tick)

    def trace(self, kind: str, *details: Any) -> None:
        self.cluster.trace_add((kind, self.broker_id, *details))

    # ---------------------------------------------------------------- views (invariants)
    def leader_views(self) -> Iterator[tuple[TopicPartition, tuple[int, int, Any, Any]]]:
        rm = self.rm
        if rm is None:
            return
        for tp, p in rm.partitions.items():
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
        return None if self.rm is None else self.rm.partitions.get(tp)

    # ---------------------------------------------------------------- messages
    def receive(self, src: int, msg: Any) -> None:
        if not self.running:
            return
        if self.paused:
            self._backlog.append((src, msg))
            return
        self._handle(src, msg)

    def _handle(self, src: int, msg: Any) -> None:
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
        elif isinstance(msg, ControllerMessage):
            self._on_controller(msg.request)
        elif isinstance(msg, _Failed):
            if self.fm is not None:
                self.fm.on_request_failed(msg.request, self.scheduler.now_ms)
        elif isinstance(msg, _Retry):
            self._zk_send(msg.op)
        self._after()

    def _after(self) -> None:
        """Send what the core completed and keep the fetchers busy."""
        rm = self.rm
        if rm is None:
            return
        now = self.scheduler.now_ms
        for done in rm.poll_completed(now):
            self._complete(done)
        self._pump_fetchers(self.incarnation)
        deadline = rm.next_deadline_ms()
        if deadline is not None:
            t = self._deadline_timer
            if t is None or not t.active or t.due_ms > deadline:
                if t is not None:
                    t.cancel()
                self._deadline_timer = self.scheduler.call_at(deadline, self._on_deadline,
                                                              self.incarnation)

    def _on_deadline(self, inc: int) -> None:
        if self.running and self.incarnation == inc and not self.paused:
            self._after()

    def _complete(self, done: CompleteProduce | CompleteFetch) -> None:
        entry = self._delayed.pop(done.request_key, None)
        if entry is None:
            return
        src, corr, kind, tp = entry
        if isinstance(done, CompleteProduce):
            r = done.results[tp]
            if r.error == Errors.NONE:  # only acks=all produces wait
                self._check_min_isr_ack(tp)
            self.network.send(self.broker_id, src, ProduceResponse(corr, tp, int(r.error),
                                                                   r.base_offset))
            return
        for prop in done.isr_proposals:
            self._propose_isr(prop)
        if kind == "consumer":
            self._reply_consumer(src, corr, tp, done.results[tp])
        else:
            req = entry[3]
            self.network.send(self.broker_id, src, ReplicaFetchResponse(corr, req,
                                                                        dict(done.results)))

    # -- produce / consume ---------------------------------------------------------------
    def _on_produce(self, src: int, msg: ProduceRequest) -> None:
        rm = self.rm
        if rm is None:
            self.network.send(self.broker_id, src, ProduceResponse(
                msg.corr_id, msg.tp, int(Errors.NOT_LEADER_OR_FOLLOWER), -1))
            return
        key = ("p", src, msg.corr_id, self.incarnation)
        out = rm.append_records(msg.acks, {msg.tp: msg.records}, msg.timeout_ms,
                                self.scheduler.now_ms, request_key=key)
        if out.delayed:
            self._delayed[key] = (src, msg.corr_id, "produce", msg.tp)
            return
        r = out.results[msg.tp]
        if r.error == Errors.NONE:
            self.trace("append", str(msg.tp), ("offset", r.base_offset), ("acks", msg.acks))
            if msg.acks == -1:
                self._check_min_isr_ack(msg.tp)
        self.network.send(self.broker_id, src, ProduceResponse(msg.corr_id, msg.tp,
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
        key = ("c", src, msg.corr_id, self.incarnation)
        out = rm.fetch_messages(-1, msg.max_wait_ms, 1, 1 << 20,
                                {msg.tp: (msg.fetch_offset, msg.current_leader_epoch, -1, 1 << 20)},
                                self.scheduler.now_ms, request_key=key)
        if out.delayed:
            self._delayed[key] = (src, msg.corr_id, "consumer", msg.tp)
            return
        self._reply_consumer(src, msg.corr_id, msg.tp, out.results[msg.tp])

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
            corr, tp, int(data.error), data.high_watermark, records))

    # -- replication requests (leader side) ------------------------------------------------
    def _on_replica_request(self, src: int, msg: ReplicaFetchRequest) -> None:
        rm = self.rm
        if rm is None:
            return  # not serving yet: the follower's request times out
        req = msg.request
        now = self.scheduler.now_ms
        if isinstance(req, FetchRequest):
            key = ("f", src, msg.corr_id, self.incarnation)
            out = rm.fetch_messages(req.replica_id, req.max_wait_ms, req.min_bytes, req.max_bytes,
                                    req.fetch_args(), now, request_key=key,
                                    broker_epoch=req.broker_epoch)
            for prop in out.isr_proposals:
                self._propose_isr(prop)
            if out.delayed:
                self._delayed[key] = (src, msg.corr_id, "fetch", req)
                return
            resp: Any = dict(out.results)
        elif isinstance(req, OffsetsForLeaderEpochRequest):
            resp = rm.last_offset_for_leader_epoch(req.replica_id, req.partitions)
        elif isinstance(req, ListOffsetsRequest):
            resp = rm.list_offsets(req.replica_id, req.partitions)
        else:
            return
        self.network.send(self.broker_id, src, ReplicaFetchResponse(msg.corr_id, req, resp))

    # -- replication responses (follower side) ---------------------------------------------
    def _pump_fetchers(self, inc: int) -> None:
        fm = self.fm
        if fm is None or self.paused:
            return
        now = self.scheduler.now_ms
        timeout = self.cluster.config.request_timeout_ms
        for req in fm.poll_requests(now):
            self._corr += 1
            corr = self._corr
            timer = self.scheduler.schedule(timeout, self._on_request_timeout, corr, inc)
            self._inflight[corr] = (req, timer)
            self.network.send(self.broker_id, req.source_broker,
                              ReplicaFetchRequest(corr, self.broker_epoch, req))

    def _on_replica_response(self, msg: ReplicaFetchResponse) -> None:
        entry = self._inflight.pop(msg.corr_id, None)
        if entry is None or self.fm is None:
            return  # a duplicate, or an answer to an earlier process
        req, timer = entry
        timer.cancel()
        self.fm.handle_response(req, msg.response, self.scheduler.now_ms)

    def _on_request_timeout(self, corr: int, inc: int) -> None:
        if not self.running or self.incarnation != inc:
            return
        entry = self._inflight.pop(corr, None)
        if entry is None or self.fm is None:
            return
        if self.paused:
            # A frozen process notices nothing; the request fails when it wakes up.
            self._backlog.append((-1, _Failed(entry[0])))
            return
        self.fm.on_request_failed(entry[0], self.scheduler.now_ms)
        self._after()

    # -- controller requests ------------------------------------------------------------
    def _on_controller(self, req: Any) -> None:
        rm = self.rm
        if rm is None:
            return
        if req.broker_epoch < self.broker_epoch:
            # KIP-380: a request meant for an earlier registration of this broker. (A newer
            # epoch is fine: the controller may see the registration before the broker does.)
            self.stats.stale_requests_refused += 1
            self.trace("stale_broker_epoch", type(req).__name__, req.broker_epoch)
            return
        now = self.scheduler.now_ms
        if isinstance(req, LeaderAndIsrRequest):
            res = rm.become_leader_or_follower(req.controller_id, req.controller_epoch,
                                               req.partition_states, req.live_leaders, now,
                                               broker_epoch=req.broker_epoch)
            if self.fm is not None:
                self.fm.apply(res.fetcher_actions, now)
            for s in req.partition_states:
                err = res.partition_errors.get(s.tp, Errors.NONE) if res.partition_errors else 0
                role = "leader" if s.leader == self.broker_id else "follower"
                self.trace("leader_and_isr", str(s.tp), role, ("epoch", s.leader_epoch),
                           ("isr", tuple(s.isr)), ("err", int(res.error or err)))
        elif isinstance(req, UpdateMetadataRequest):
            self.live_brokers = dict(req.live_brokers)
            if self.cluster.config.kip841_eligibility:
                rm.set_eligible_brokers(self.live_brokers)
        elif isinstance(req, StopReplicaRequest):
            res = rm.stop_replicas(req.controller_id, req.controller_epoch,
                                   {tp: req.delete_partitions for tp in req.partitions}, now,
                                   broker_epoch=req.broker_epoch)
            if self.fm is not None:
                self.fm.apply(res.fetcher_actions, now)

    # -- ZooKeeper ----------------------------------------------------------------------
    def _zk_send(self, op: tuple[Any, ...]) -> None:
        self._corr += 1
        timer = self.scheduler.schedule(self.cluster.config.request_timeout_ms,
                                        self._on_zk_timeout, self._corr, self.incarnation)
        self._zk_inflight[self._corr] = (op, timer)
        self.network.send(self.broker_id, ZK_NODE, ZkRequest(self._corr, self.session_id, op))

    def _on_zk_timeout(self, corr: int, inc: int) -> None:
        if not self.running or self.incarnation != inc:
            return
        entry = self._zk_inflight.pop(corr, None)
        if entry is None:
            return
        op = entry[0]
        if op[0] in ("connect", "register", "update_isr", "isr_change"):
            if self.paused:
                self._backlog.append((-1, _Retry(op)))
            else:
                self._zk_send(op)  # ZooKeeper clients retry on connection loss

    def _on_zk_response(self, msg: ZkResponse) -> None:
        if msg.op[0] == "ping":
            if msg.code == "session_expired" and msg.session_id == self.session_id:
                self._session_expired()
            return
        entry = self._zk_inflight.pop(msg.corr_id, None)
        if entry is None:
            return
        entry[1].cancel()
        op = msg.op
        if msg.code == "session_expired" and op[0] != "connect":
            self._session_expired()
            if op[0] == "update_isr" and self.rm is not None:
                prop: ProposeIsr = op[1]
                self.rm.on_isr_update_result(prop.tp, False, -1, prop.new_isr,
                                             self.scheduler.now_ms, leader_epoch=prop.leader_epoch)
                self.stats.isr_update_failures += 1
            return
        if op[0] == "connect":
            self.session_id = msg.result
            self._zk_send(("register", self.broker_id, {"clean_shutdown": self.clean_shutdown}))
        elif op[0] == "register":
            if msg.code == "node_exists":
                # The previous process's session is still alive: wait for it to expire.
                self.scheduler.schedule(self.cluster.config.session_timeout_ms // 4,
                                        self._retry_register, self.incarnation, self.session_id)
                return
            self._registered(msg.result)
        elif op[0] == "update_isr" and self.rm is not None:
            prop = op[1]
            ok = msg.code == "ok"
            if ok:
                old = set(self.rm.partitions[prop.tp].isr) if prop.tp in self.rm.partitions else set()
                new = set(prop.new_isr)
                if new - old:
                    self.stats.isr_expands += 1
                if old - new:
                    self.stats.isr_shrinks += 1
                self.trace("isr_update", str(prop.tp), ("isr", tuple(prop.new_isr)),
                           ("zkv", msg.result))
            else:
                self.stats.isr_update_failures += 1
                self.trace("isr_update_failed", str(prop.tp), ("isr", tuple(prop.new_isr)),
                           msg.code)
            self.rm.on_isr_update_result(prop.tp, ok, msg.result if ok else -1, prop.new_isr,
                                         self.scheduler.now_ms, leader_epoch=prop.leader_epoch)

    def _retry_register(self, inc: int, session_id: int) -> None:
        if self.running and self.incarnation == inc and self.session_id == session_id:
            if self.paused:
                self._backlog.append((-1, _Retry(("register", self.broker_id,
                                                  {"clean_shutdown": self.clean_shutdown}))))
                return
            self._zk_send(("register", self.broker_id, {"clean_shutdown": self.clean_shutdown}))

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
            self.rm.broker_epoch = broker_epoch
        if self.fm is not None:
            self.fm.broker_epoch = broker_epoch
            for f in self.fm.fetchers.values():
                f.broker_epoch = broker_epoch
        if first and self._backlog and not self.paused:
            backlog, self._backlog = self._backlog, []
            for src, msg in backlog:
                self._handle(src, msg)

    def _ping(self, inc: int) -> None:
        if self.session_id:
            self.network.send(self.broker_id, ZK_NODE, ZkRequest(0, self.session_id, ("ping",)))

    def _propose_isr(self, prop: ProposeIsr) -> None:
        self.trace("propose_isr", str(prop.tp), ("isr", tuple(prop.new_isr)),
                   ("zkv", prop.zk_version))
        self._zk_send(("update_isr", prop))

    # -- periodic tasks -----------------------------------------------------------------
    def _isr_expiration(self, inc: int) -> None:
        if self.rm is None:
            return
        for prop in self.rm.maybe_shrink_isr(self.scheduler.now_ms):
            self._propose_isr(prop)

    def _checkpoint_hw(self, inc: int) -> None:
        if self.rm is None:
            return
        try:
            OffsetCheckpointFile.in_dir(self.file_io, self.log_dir, HW_CHECKPOINT).write(
                dict(self.rm.high_watermarks()))
        except KafkaStorageError as exc:
            # Kafka logs it and marks the log dir offline; the old checkpoint stays valid.
            self.trace("checkpoint_failed", str(exc).split(":")[0])

    def _propagate_isr_changes(self, inc: int) -> None:
        if self.rm is None or not self.session_id:
            return
        tps = self.rm.isr_changes_to_propagate(self.scheduler.now_ms)
        if tps:
            self._zk_send(("isr_change", tuple(sorted(tps))))

    def _os_flush(self, inc: int) -> None:
        self.flush_logs()

    def flush_logs(self) -> None:
        """The page cache written back: everything appended so far survives a power loss."""
        if self.log_manager is None:
            return
        for log in self.log_manager.all_logs():
            try:
                log.flush()
            except KafkaStorageError:
                pass  # a failed disk: what is not flushed is what a power loss would take


@dataclass(slots=True)
class _Failed:
    request: Any


@dataclass(slots=True)
class _Retry:
    op: tuple[Any, ...]
