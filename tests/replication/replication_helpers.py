"""Helpers for the replication-core tests: real Logs over the simulator's in-memory file layer."""

from __future__ import annotations

from dataclasses import replace

from tidelog.protocol.records.builder import build_values
from tidelog.replication import (
    FetchRequest,
    LeaderAndIsrPartitionState,
    OffsetsForLeaderEpochRequest,
    Partition,
    ReplicaManager,
    ReplicationConfig,
    TopicPartition,
)
from tidelog.shell.fetcher_manager import ReplicaFetcherManager
from tidelog.sim.disk import MemoryFileIO
from tidelog.storage.log import Log
from tidelog.storage.log_config import LogConfig
from tidelog.storage.log_manager import LogManager

TP = TopicPartition("orders", 0)


def records(n: int, tag: str = "v") -> bytes:
    """One batch of n records."""
    return bytes(build_values([f"{tag}{i}".encode() for i in range(n)]))


def new_log(io: MemoryFileIO, broker: int, tp: TopicPartition = TP,
            config: LogConfig | None = None) -> Log:
    return Log(f"/broker-{broker}/{tp.topic}-{tp.partition}", config or LogConfig(), io)


def state(
    leader: int,
    leader_epoch: int,
    isr: tuple[int, ...],
    replicas: tuple[int, ...] = (1, 2, 3),
    zk_version: int = 0,
    controller_epoch: int = 1,
    tp: TopicPartition = TP,
) -> LeaderAndIsrPartitionState:
    return LeaderAndIsrPartitionState(
        tp.topic, tp.partition, controller_epoch, leader, leader_epoch, isr, zk_version, replicas
    )


def leader_partition(
    config: ReplicationConfig | None = None,
    isr: tuple[int, ...] = (1, 2, 3),
    replicas: tuple[int, ...] = (1, 2, 3),
    now_ms: int = 0,
    leader_epoch: int = 0,
    min_insync_replicas: int = 1,
) -> Partition:
    """Broker 1 leading TP; `min_insync_replicas` is the topic's (its log's LogConfig)."""
    log = new_log(MemoryFileIO(), 1, config=LogConfig(min_insync_replicas=min_insync_replicas))
    p = Partition(TP, 1, log, config or ReplicationConfig())
    p.make_leader(state(1, leader_epoch, isr, replicas), now_ms)
    return p


def fetch(p: Partition, replica_id: int, offset: int, now_ms: int):
    """A follower fetch as the leader sees it: the follower's LEO is its fetch offset."""
    return p.update_follower_fetch_state(replica_id, offset, 0, now_ms, p.log_end_offset)


class _Timer:
    __slots__ = ("cancelled", "due_ms", "fn")

    def __init__(self, due_ms: int, fn) -> None:
        self.due_ms = due_ms
        self.fn = fn
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class StepClock:
    """The fetcher manager's Time and Scheduler: the cluster's ``now``; timers run in ``step``."""

    def __init__(self, cluster: MiniCluster) -> None:
        self.cluster = cluster
        self.timers: list[_Timer] = []

    def milliseconds(self) -> int:
        return self.cluster.now

    def schedule(self, name: str, fn, delay_ms: int, period_ms: int = -1) -> _Timer:
        timer = _Timer(self.cluster.now + delay_ms, fn)
        self.timers.append(timer)
        return timer

    def run_due(self) -> None:
        now = self.cluster.now
        due = [t for t in self.timers if t.due_ms <= now]
        self.timers = [t for t in self.timers if t.due_ms > now and not t.cancelled]
        for t in due:
            if not t.cancelled:
                t.fn()


class OutboxEndPoint:
    """A fetcher's requests wait in its broker's outbox until ``step_broker`` delivers them."""

    def __init__(self, cluster: MiniCluster, broker: int) -> None:
        self.outbox = cluster.outbox.setdefault(broker, [])

    def send(self, request, on_done) -> None:
        self.outbox.append((request, on_done))

    def close(self) -> None:
        self.outbox.clear()


class MiniCluster:
    """A few brokers' ReplicaManagers and the shell's fetcher managers over one in-memory disk,
    the rest of the shell played synchronously: requests are answered at once, ISR proposals are applied to a dict
    standing for ZooKeeper's partition state with a compare-and-set on its version, and the test
    plays the controller (``elect``). Brokers can be stopped and restarted (a restart keeps what
    the log files hold, like a clean restart)."""

    def __init__(self, n: int = 3, config: ReplicationConfig | None = None,
                 replicas: tuple[int, ...] | None = None,
                 log_config: LogConfig | None = None) -> None:
        self.ios: dict[int, MemoryFileIO] = {}  # one disk per broker: crashes are per broker
        self.config = config or ReplicationConfig(replica_fetch_wait_max_ms=0)
        self.log_config = log_config or LogConfig()  # the brokers' log defaults
        self.replicas = replicas or tuple(range(1, n + 1))
        self.now = 0
        self.controller_epoch = 1
        self.zk: dict[TopicPartition, LeaderAndIsrPartitionState] = {}
        self.brokers: dict[int, tuple] = {}
        self.live: set[int] = set()
        self.cas_failures = 0
        self.clock = StepClock(self)
        self.outbox: dict[int, list] = {}
        for b in self.replicas:
            self.start(b)

    def start(self, b: int) -> None:
        io = self.ios.setdefault(b, MemoryFileIO())
        lm = LogManager([f"/broker-{b}"], self.log_config, io, now_ms=self.now)
        # The LogManager loads each log's HW from replication-offset-checkpoint.
        rm = ReplicaManager(b, lm, self.config)
        self.outbox[b] = []
        fm = ReplicaFetcherManager(b, rm.logs_for_fetcher, self.config, time=self.clock,
                                   scheduler=self.clock, broker_epoch=0,
                                   leader_end_point=lambda _source, _fid: OutboxEndPoint(self, b))
        self.brokers[b] = (lm, rm, fm)
        self.live.add(b)
        for st in self.zk.values():
            self._send_leader_and_isr(b, st)

    def stop(self, b: int) -> None:
        self.live.discard(b)
        lm = self.brokers[b][0]
        lm.shutdown()

    def crash(self, b: int) -> None:
        """Power loss on broker b: everything written since its last flush is gone."""
        self.live.discard(b)
        self.ios[b].crash()

    def rm(self, b: int):
        return self.brokers[b][1]

    def fm(self, b: int):
        return self.brokers[b][2]

    def log(self, b: int, tp: TopicPartition = TP):
        return self.brokers[b][1].partition(tp).log

    def elect(self, leader: int, isr: tuple[int, ...], tp: TopicPartition = TP) -> LeaderAndIsrPartitionState:
        old = self.zk.get(tp)
        st = LeaderAndIsrPartitionState(
            tp.topic, tp.partition, self.controller_epoch, leader,
            old.leader_epoch + 1 if old else 0, isr, old.zk_version + 1 if old else 0, self.replicas,
        )
        self.zk[tp] = st
        for b in sorted(self.live):
            self._send_leader_and_isr(b, st)
        return st

    def _send_leader_and_isr(self, b: int, st: LeaderAndIsrPartitionState) -> None:
        rm, fm = self.rm(b), self.fm(b)
        result = rm.become_leader_or_follower(0, self.controller_epoch, [st], self.live, self.now)
        fm.apply(result.fetcher_actions)

    def apply_proposals(self, proposals) -> None:
        for p in proposals:
            cur = self.zk[p.tp]
            ok = cur.zk_version == p.zk_version and cur.leader == p.leader
            if ok:
                cur = replace(cur, isr=p.new_isr, zk_version=cur.zk_version + 1)
                self.zk[p.tp] = cur
            else:
                self.cas_failures += 1
            if p.leader in self.live:
                self.rm(p.leader).on_isr_update_result(p.tp, ok, cur.zk_version, p.new_isr, self.now)

    def serve(self, req):
        rm = self.rm(req.source_broker)
        if isinstance(req, FetchRequest):
            outcome = rm.fetch(req, self.now)
            self.apply_proposals(outcome.isr_proposals)
            return outcome.results
        if isinstance(req, OffsetsForLeaderEpochRequest):
            return rm.last_offset_for_leader_epoch(req.replica_id, req.partitions)
        return rm.list_offsets(req.replica_id, req.partitions)

    def step(self, dt: int = 10) -> None:
        self.now += dt
        self.clock.run_due()
        for b in sorted(self.live):
            self.step_broker(b)
        for b in sorted(self.live):
            self.apply_proposals(self.rm(b).maybe_shrink_isr(self.now))

    def next_requests(self, b: int) -> list:
        """What broker b's fetchers send next (waiting in its outbox)."""
        for thread in list(self.fm(b).fetchers.values()):
            thread.pump()
        return [req for req, _ in self.outbox[b]]

    def step_broker(self, b: int, lose_responses: bool = False) -> list:
        """Send broker b's fetcher requests and deliver the answers (or lose them)."""
        self.next_requests(b)
        pending, self.outbox[b][:] = list(self.outbox[b]), []
        for req, on_done in pending:
            if req.source_broker not in self.live:
                on_done(None)
            elif lose_responses:
                self.serve(req)
                on_done(None)
            else:
                on_done(self.serve(req))
        return [req for req, _ in pending]

    def run(self, steps: int = 20, dt: int = 10) -> None:
        for _ in range(steps):
            self.step(dt)

    def produce(self, b: int, n: int, acks: int = 1, tp: TopicPartition = TP, key: object = None):
        return self.rm(b).append_records(acks, {tp: records(n)}, 30_000, self.now, request_key=key)

    def batches(self, b: int, tp: TopicPartition = TP) -> list[tuple[int, int, int]]:
        """(base offset, last offset, leader epoch) of each batch: the replicas' common history."""
        return [(x.base_offset, x.last_offset, x.partition_leader_epoch) for x in self.log(b, tp).batches()]
