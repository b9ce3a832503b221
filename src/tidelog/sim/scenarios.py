"""The historic replication bugs of `correctness.md` as named, scripted simulations.

Each scenario runs twice: with tidelog's rules (it must end with no violation) and with the naive
rule the fix replaced (`--naive`: it must be caught — the simulator has to be able to see the
bug, not only pass the fix). The naive rules are switches of the real core and shell:

- `truncate_to_hw` (pre-KIP-101: a follower truncates to its HW instead of asking the leader
  OffsetsForLeaderEpoch),
- `fence_leader_epochs=False` (pre-KIP-320: fetches are not checked against the leader epoch),
- `maximal_isr=False` (the HW over the committed ISR only, ignoring a pending expand),
- `kip841_eligibility=False` (the leader may re-add a replica the controller knows is offline),
- `kip966_unclean_restart_rule=False` + `hw_requires_min_isr=False` (the last replica standing is
  re-elected after an unclean shutdown).

Every step is recorded as a snapshot of every replica's LEO, HW, role and ISR (the diagrams of
seed 001): `tidelog sim --scenario NAME --trace` prints them as a table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from rich.table import Table

from tidelog.replication.config import ReplicationConfig
from tidelog.sim.client import Producer
from tidelog.sim.cluster import SimCluster, SimConfig
from tidelog.sim.invariants import Violation
from tidelog.sim.messages import (
    CONTROLLER_CHANNEL_NODE,
    CONTROLLER_NODE,
    ZK_NODE,
    ReplicaFetchRequest,
    ReplicaFetchResponse,
)

Rule = Callable[[int, int, Any], bool]


@dataclass(slots=True)
class Snapshot:
    label: str
    time_ms: int
    brokers: list[tuple[int, str, str, int, int, int, str]]  # id, status, role, epoch, LEO, HW, ISR
    zk: str


@dataclass(slots=True)
class ScenarioResult:
    name: str
    naive: bool
    steps: list[Snapshot] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)
    expected_naive: tuple[str, ...] = ()
    allowed: tuple[str, ...] = ()
    digest: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def unexpected(self) -> list[Violation]:
        return [v for v in self.violations if v.invariant not in self.allowed]

    @property
    def caught(self) -> list[Violation]:
        return [v for v in self.violations if v.invariant in self.expected_naive]

    @property
    def as_expected(self) -> bool:
        return bool(self.caught) if self.naive else not self.unexpected

    def verdict(self) -> str:
        mode = "naive rule" if self.naive else "tidelog's rules"
        if self.naive:
            head = (f"{self.name} ({mode}): bug caught" if self.caught
                    else f"{self.name} ({mode}): NOT caught")
        else:
            head = (f"{self.name} ({mode}): no violation" if not self.unexpected
                    else f"{self.name} ({mode}): FAILED")
        lines = [head]
        by_kind: dict[str, list[Violation]] = {}
        for v in self.violations:
            by_kind.setdefault(v.invariant, []).append(v)
        for kind, vs in by_kind.items():
            tag = " (allowed here)" if kind in self.allowed else ""
            lines.append(f"  {kind}{tag}: {len(vs)} distinct; first: {vs[0]}")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def table(self) -> Table:
        n = len(self.steps[0].brokers) if self.steps else 0
        t = Table(title=f"{self.name}{' (naive)' if self.naive else ''}: LEO / HW / ISR per step")
        t.add_column("step")
        t.add_column("t ms", justify="right")
        for b in range(n):
            t.add_column(f"broker {b}")
        t.add_column("ZooKeeper state")
        for s in self.steps:
            cells = []
            for _, status, role, epoch, leo, hw, isr in s.brokers:
                if status != "up":
                    cells.append(status)
                else:
                    cell = f"{role} e{epoch} LEO {leo} HW {hw}"
                    cells.append(cell + (f"\nISR {isr}" if isr else ""))
            t.add_row(s.label, str(s.time_ms), *cells, s.zk)
        return t


class ScenarioRun:
    """Helpers for scripts: boot, produce and wait, crash/restart, block messages, snapshot."""

    def __init__(self, name: str, naive: bool, config: SimConfig) -> None:
        self.name = name
        self.naive = naive
        self.cluster = SimCluster(config)
        self.tp = self.cluster.tps[0]
        self.result = ScenarioResult(name, naive)
        self._producers: dict[int, Producer] = {}

    # -- time -------------------------------------------------------------------------------
    def run_for(self, ms: int) -> None:
        self.cluster.run_for(ms)

    def run_until(self, pred: Callable[[], bool], max_ms: int = 20_000, step_ms: int = 5) -> bool:
        waited = 0
        while not pred():
            if waited >= max_ms:
                self.result.notes.append(f"waited {max_ms} ms in vain at {self.cluster.scheduler.now_ms} ms")
                return False
            self.cluster.run_for(step_ms)
            waited += step_ms
        return True

    # -- views -----------------------------------------------------------------------------
    def node(self, b: int) -> Any:
        return self.cluster.nodes[b]

    def part(self, b: int) -> Any:
        return self.cluster.nodes[b].partition(self.tp)

    def leo(self, b: int) -> int:
        v = self.cluster.nodes[b].log_end_offset(self.tp)
        return -1 if v is None else v

    def hw(self, b: int) -> int:
        p = self.part(b)
        return -1 if p is None else p.high_watermark

    def zk(self) -> Any:
        return self.cluster.zk_state(self.tp)

    def leader_is(self, b: int, min_epoch: int = 0) -> bool:
        s = self.zk()
        p = self.part(b)
        return (s is not None and s.leader == b and s.leader_epoch >= min_epoch and p is not None
                and p.is_leader and p.leader_epoch == s.leader_epoch)

    def isr_is(self, members: set[int]) -> bool:
        s = self.zk()
        return s is not None and set(s.isr) == members

    # -- actions -----------------------------------------------------------------------------
    def boot(self) -> None:
        c = self.cluster
        c.start()
        replicas = set(c.assignments[self.tp])
        self.run_until(lambda: c.acting_leader(self.tp) is not None and self.isr_is(replicas))
        self.snapshot("boot")

    def producer(self, acks: int) -> Producer:
        p = self._producers.get(acks)
        if p is None:
            # One attempt per write, no retries: the scripts count refusals and place each
            # write (the random runs use idempotent, retrying producers).
            p = self._producers[acks] = self.cluster.add_producer(self.tp, acks,
                                                                  idempotent=False)
        return p

    def produce(self, n: int, acks: int = -1, wait: bool = True, max_ms: int = 5000) -> int:
        """Send `n` one-record batches; with `wait`, run until each is answered (or timed out).
        Returns how many were acknowledged."""
        p = self.producer(acks)
        before = len(p.acked)
        for _ in range(n):
            p.produce(1)
        if wait:
            self.run_until(lambda: not p.in_flight, max_ms)
        return len(p.acked) - before

    def stop(self, b: int, kind: str = "kill", tear: bool = False) -> None:
        if kind == "clean" and self.cluster.controller is not None:
            self.cluster.controller.controlled_shutdown(b)
            self.run_for(30)
        self.node(b).stop(kind, tear=tear)

    def start(self, b: int) -> None:
        self.node(b).start()

    def flush(self, b: int) -> None:
        self.node(b).flush_logs()

    def rule(self, rule: Rule) -> Rule:
        self.cluster.network.rules.append(rule)
        return rule

    def unrule(self, rule: Rule) -> None:
        if rule in self.cluster.network.rules:
            self.cluster.network.rules.remove(rule)

    def wait_registered(self, b: int) -> bool:
        ctl = self.cluster.controller
        return self.run_until(lambda: ctl is not None and self.node(b).broker_epoch > 0
                              and ctl.core.live_brokers.get(b) == self.node(b).broker_epoch)

    def wait_gone(self, b: int) -> bool:
        ctl = self.cluster.controller
        return self.run_until(lambda: ctl is not None and b not in ctl.core.live_brokers)

    # -- records ------------------------------------------------------------------------------
    def snapshot(self, label: str) -> None:
        rows = []
        for node in self.cluster.nodes:
            status = "down" if not node.running else "paused" if node.paused else "up"
            p = node.partition(self.tp)
            if p is None:
                rows.append((node.broker_id, status if status != "up" else "no replica", "-",
                             -1, -1, -1, ""))
                continue
            role = "leader" if p.is_leader else "follower"
            isr = ",".join(map(str, sorted(p.isr))) if p.is_leader else ""
            if p.is_leader and p.pending_isr is not None:
                isr += f" (+{','.join(map(str, sorted(set(p.pending_isr) - set(p.isr))))} pending)"
            rows.append((node.broker_id, status, role, p.leader_epoch, p.log_end_offset,
                         p.high_watermark, isr))
        s = self.zk()
        zk = "-" if s is None else f"leader {s.leader} e{s.leader_epoch} ISR {list(s.isr)} v{s.zk_version}"
        self.result.steps.append(Snapshot(label, self.cluster.scheduler.now_ms, rows, zk))

    def finish(self, settle_ms: int = 30_000) -> ScenarioResult:
        c = self.cluster
        c.network.rules.clear()
        c.heal()
        c.settle(settle_ms)
        c.run_for(300)
        self.snapshot("healed")
        self.result.violations = list(c.checker.violations) + c.final_checks()
        self.result.digest = c.trace.digest()
        return self.result


# ------------------------------------------------------------------------------------ rules


def fetch_responses(src: int, dst: int, *, min_hw: int | None = None) -> Rule:
    """Drop replica-fetch responses from `src` to `dst` (those carrying a HW >= `min_hw`)."""

    def rule(s: int, d: int, msg: Any) -> bool:
        if s != src or d != dst or not isinstance(msg, ReplicaFetchResponse):
            return False
        if min_hw is None:
            return True
        resp = msg.response
        return isinstance(resp, dict) and any(
            getattr(v, "high_watermark", -1) >= min_hw for v in resp.values())
    return rule


def fetch_requests(src: int, dst: int) -> Rule:
    def rule(s: int, d: int, msg: Any) -> bool:
        return s == src and d == dst and isinstance(msg, ReplicaFetchRequest)
    return rule


def all_messages(a: int, b: int) -> Rule:
    def rule(s: int, d: int, msg: Any) -> bool:
        return (s, d) in ((a, b), (b, a))
    return rule


# ------------------------------------------------------------------------------ scenarios


def _base(min_insync_replicas: int = 2, **replication: Any) -> SimConfig:
    """`min_insync_replicas`: the brokers' default (a topic may override it)."""
    defaults: dict[str, Any] = dict(
        replica_lag_time_max_ms=1000, replica_fetch_backoff_ms=100,
        replica_fetch_wait_max_ms=100)
    defaults.update(replication)
    return SimConfig(replication=ReplicationConfig(**defaults), trace_limit=None,
                     log_properties={"segment.bytes": 64 * 1024,
                                     "min.insync.replicas": min_insync_replicas})


def kip101(sc: ScenarioRun) -> None:
    """Leader 0 (B), followers 1 (A) and 2 (C), min.isr=1. m1 commits. m2 is replicated and
    acked, but the leader's answers carrying HW=2 are lost, so A still has HW=1. C dies: the
    controller shrinks the ISR and bumps the leader epoch, and A becomes follower again in the
    new epoch. Pre-KIP-101, A truncates to its HW and cuts m2; then B dies and A is elected:
    m2 is gone. With KIP-101, A asks B OffsetsForLeaderEpoch and keeps m2."""
    sc.boot()
    sc.produce(1)
    sc.run_until(lambda: sc.hw(1) >= 1 and sc.hw(2) >= 1)
    sc.snapshot("m1 committed")
    sc.rule(fetch_responses(0, 1, min_hw=2))
    sc.rule(fetch_responses(0, 2, min_hw=2))
    sc.produce(1)
    sc.snapshot("m2 acked, HW=2 lost")
    sc.stop(2, "kill")
    sc.wait_gone(2)
    sc.run_until(lambda: (sc.part(1) is not None and sc.part(1).leader_epoch >= 1))
    sc.run_for(50)
    sc.snapshot("C dead: new epoch")
    sc.stop(0, "kill")
    sc.run_until(lambda: sc.leader_is(1))
    sc.snapshot("B dead: A leads")
    sc.produce(1, acks=-1)
    sc.start(0)
    sc.start(2)
    sc.run_for(1000)
    sc.snapshot("B, C back")


def kip101_divergence(sc: ScenarioRun) -> None:
    """RF=2. Ten acked records; stop the follower, then the leader, which loses its last five
    (not yet flushed) in a power loss. The leader comes back first (new epoch) and takes ten
    more records at offsets 5..14. The follower returns: both logs must become identical batch
    by batch. Pre-KIP-101 the follower truncates to its HW (10) and keeps its own 5..9."""
    sc.boot()
    sc.produce(5)
    sc.flush(0)
    sc.produce(5)
    sc.run_until(lambda: sc.leo(1) >= 10 and sc.hw(1) >= 10)
    sc.snapshot("10 acked")
    sc.stop(1, "clean")
    sc.wait_gone(1)
    sc.stop(0, "lossy", tear=False)
    sc.snapshot("both down, 0 lost 5..9")
    sc.start(0)
    sc.run_until(lambda: sc.leader_is(0, 1))
    sc.produce(10)
    sc.snapshot("0 back, 10 more")
    sc.start(1)
    sc.run_until(lambda: sc.leo(1) >= sc.leo(0) and sc.isr_is({0, 1}), 5000)
    sc.snapshot("1 back")


def kip279(sc: ScenarioRun) -> None:
    """RF=2, unclean election on, min.isr=1, acks=1. Stop and start the two brokers in turn
    three times, writing 1, 3, 1, 2 records in between. Both logs must end with the same
    batches: the follower repeats OffsetsForLeaderEpoch until it finds where they fork."""
    sc.boot()
    sc.produce(1, acks=1)
    sc.run_until(lambda: sc.leo(1) >= 1)
    sc.snapshot("wrote 1")
    sc.stop(1, "clean")
    sc.wait_gone(1)
    sc.produce(3, acks=1)
    sc.snapshot("1 down, wrote 3")
    sc.stop(0, "clean")
    sc.wait_gone(0)
    sc.start(1)
    sc.run_until(lambda: sc.leader_is(1))
    sc.produce(1, acks=1)
    sc.snapshot("0 down, 1 leads, wrote 1")
    sc.stop(1, "clean")
    sc.wait_gone(1)
    sc.start(0)
    sc.run_until(lambda: sc.leader_is(0, 2))
    sc.produce(2, acks=1)
    sc.snapshot("1 down, 0 leads, wrote 2")
    sc.start(1)
    sc.run_until(lambda: sc.leo(1) == sc.leo(0) and sc.isr_is({0, 1}), 5000)
    sc.snapshot("1 back")


def kip320(sc: ScenarioRun) -> None:
    """Leader 0 and replica 1 at 50, replica 2 at 40 (in the ISR, lagging). Broker 1 loses its
    ZooKeeper session and misses every LeaderAndIsr, but keeps fetching. 2 leads (new epoch)
    from 40; 0 comes back, truncates to 40 and replicates 40..59 of the new epoch; leadership
    returns to 0. 1's retried fetch at 50 must be refused (its leader epoch is stale): pre-KIP-320
    it is served, and 1 ends with its own 40..49 under the new epoch's 50..59."""
    sc.boot()
    sc.produce(40, acks=1)
    sc.run_until(lambda: min(sc.leo(0), sc.leo(1), sc.leo(2)) >= 40)
    slow = sc.rule(fetch_responses(0, 2))
    sc.produce(10, acks=1)
    sc.run_until(lambda: sc.leo(1) >= 50)
    sc.snapshot("0,1 at 50; 2 at 40")
    # 1 loses ZooKeeper and the controller, but not broker 0.
    zk_cut = sc.rule(lambda s, d, m: (s, d) in (
        (1, ZK_NODE), (ZK_NODE, 1), (CONTROLLER_NODE, 1), (1, CONTROLLER_CHANNEL_NODE),
        (CONTROLLER_CHANNEL_NODE, 1)))
    sc.wait_gone(1)
    sc.snapshot("1 lost its session")
    sc.stop(0, "kill")
    sc.unrule(slow)
    sc.run_until(lambda: sc.leader_is(2))
    sc.snapshot("2 leads from 40")
    sc.start(0)
    sc.produce(20, acks=1)
    sc.run_until(lambda: sc.leo(0) >= sc.leo(2) and sc.isr_is({0, 2}), 5000)
    sc.snapshot("0 follows, truncated to 40")
    sc.stop(2, "kill")
    sc.run_until(lambda: sc.leader_is(0, 3))
    sc.start(2)
    sc.run_for(1500)
    sc.snapshot("0 leads again")
    sc.unrule(zk_cut)
    sc.run_for(3000)
    sc.snapshot("1 back in touch")


def kafka7164(sc: ScenarioRun) -> None:
    """Follower 1 misses a whole leader epoch (the controller cannot reach it; its ZooKeeper
    session is fine). Leader 0 at 50, 1 at 50, 2 at 40. 0 dies, 2 leads from 40, 0 comes back
    and truncates to 40, takes 40..59 of the new epoch; 2 dies and 0 leads again. 1 now hears of
    the newest epoch with the same leader it had: it must still truncate (OffsetsForLeaderEpoch),
    or it keeps its own 40..49 under the new epoch's 50..59."""
    sc.boot()
    sc.produce(40, acks=1)
    sc.run_until(lambda: min(sc.leo(0), sc.leo(1), sc.leo(2)) >= 40)
    slow = sc.rule(fetch_responses(0, 2))
    sc.produce(10, acks=1)
    sc.run_until(lambda: sc.leo(1) >= 50)
    deaf = sc.rule(lambda s, d, m: s == CONTROLLER_NODE and d == 1)
    sc.snapshot("0,1 at 50; 2 at 40; 1 deaf")
    sc.stop(0, "kill")
    sc.unrule(slow)
    sc.run_until(lambda: sc.leader_is(2))
    sc.snapshot("2 leads from 40")
    sc.start(0)
    sc.produce(20, acks=1)
    sc.run_until(lambda: sc.leo(0) >= sc.leo(2) and 0 in sc.zk().isr, 5000)
    sc.snapshot("0 follows 2")
    sc.unrule(deaf)
    sc.stop(2, "kill")
    sc.run_until(lambda: sc.leader_is(0, 2))
    sc.run_for(1500)
    sc.snapshot("0 leads again; 1 hears")
    sc.start(2)
    sc.run_for(1500)


def maximal_isr(sc: ScenarioRun) -> None:
    """ISR [0,1]; 2 catches up and the leader proposes ISR [0,1,2] (its AlterPartition to the
    controller is slow). Meanwhile 10 records reach 1 but not 2. With the maximal ISR the HW waits for 2;
    without it the HW advances over [0,1] and the records are acked. The write lands; 0 and 1
    die; 2 is elected: the acked records are gone."""
    sc.boot()
    cut = sc.rule(fetch_requests(2, 0))
    sc.run_until(lambda: sc.isr_is({0, 1}))
    sc.produce(5)
    sc.snapshot("2 out of the ISR")
    sc.cluster.network.link(0, CONTROLLER_CHANNEL_NODE).extra_delay_ms = 600
    leader = sc.part(0)
    sc.rule(lambda s, d, m: (s == 0 and d == 2 and isinstance(m, ReplicaFetchResponse)
                             and leader.pending_isr is not None))
    sc.unrule(cut)
    sc.run_until(lambda: leader.pending_isr is not None and 2 in leader.pending_isr)
    sc.snapshot("expand to 2 pending")
    sc.produce(10, wait=False)
    sc.run_for(300)
    sc.snapshot("10 records on 0,1")
    sc.run_until(lambda: sc.isr_is({0, 1, 2}))
    sc.snapshot("ISR [0,1,2] written")
    sc.stop(0, "kill")
    sc.stop(1, "kill")
    sc.run_until(lambda: sc.leader_is(2))
    sc.snapshot("0,1 dead: 2 leads")
    sc.start(0)
    sc.start(1)
    sc.run_for(1500)


def kip841(sc: ScenarioRun) -> None:
    """A fetch from broker 2 at the LEO is on its way (a slow link); 2 dies; the controller
    removes it from the ISR; then the late fetch arrives. The leader must not add 2 back: the
    controller's metadata says it is offline. Pre-KIP-841 the leader re-adds a dead replica."""
    sc.boot()
    sc.produce(5)
    sc.run_until(lambda: sc.leo(2) >= 5 and sc.hw(2) >= 5)
    sc.cluster.network.link(2, 0).extra_delay_ms = 2 * sc.cluster.config.session_timeout_ms
    sc.run_for(150)
    sc.stop(2, "kill")
    sc.snapshot("2 dies, its fetch in flight")
    sc.wait_gone(2)
    sc.run_until(lambda: sc.isr_is({0, 1}))
    sc.snapshot("controller removed 2")
    ctl = sc.cluster.controller

    def offline_in_isr() -> None:
        s = sc.zk()
        if s is not None and 2 in s.isr and ctl is not None and 2 not in ctl.core.live_brokers:
            sc.cluster.checker.fail("OfflineReplicaInIsr", sc.tp,
                                    f"ISR {list(s.isr)} holds offline broker 2")

    for _ in range(200):
        sc.run_for(20)
        offline_in_isr()
    sc.snapshot("late fetch arrived")


def kip903(sc: ScenarioRun) -> None:
    """Broker 2's fetch at the LEO is on its way (a slow link) when 2 loses power and its
    unflushed log. It restarts and registers again (a new broker epoch), out of the ISR. Then
    the old fetch arrives, claiming 2 is caught up. The leader must not add 2 back: the fetch
    carries the broker epoch of the previous registration. Pre-KIP-903 it is re-added with an
    empty log."""
    sc.boot()
    sc.produce(5)
    sc.run_until(lambda: sc.leo(2) >= 5 and sc.hw(2) >= 5)
    link = sc.cluster.network.link(2, 0)
    link.extra_delay_ms = 2 * sc.cluster.config.session_timeout_ms
    sc.run_for(150)
    old_epoch = sc.node(2).broker_epoch
    sc.stop(2, "lossy", tear=False)
    link.extra_delay_ms = 0
    # The new process cannot reach the leader until the old fetch has arrived.
    new_life = sc.rule(lambda s, d, m: (s == 2 and d == 0 and isinstance(m, ReplicaFetchRequest)
                                        and m.broker_epoch != old_epoch))
    sc.start(2)
    sc.snapshot("2 lost its log; old fetch in flight")
    sc.wait_gone(2)
    sc.wait_registered(2)
    sc.snapshot("2 registered again")
    sc.run_for(2 * sc.cluster.config.session_timeout_ms)
    sc.unrule(new_life)
    sc.snapshot("old fetch arrived")


def kip966(sc: ScenarioRun) -> None:
    """ISR {2,0,1} (leader 2), min.isr=2. Partitions push 0 and then 1 out of the ISR; 2, the
    last replica standing, crashes uncleanly and loses its unflushed tail, which 1 still has.
    Naively 2 is re-elected and 0 and 1 truncate to it: acked records are gone everywhere.
    With KIP-966's rule 2 is no clean candidate: the partition stays offline, the data stays on 1."""
    sc.boot()
    sc.produce(5)
    sc.flush(2)
    sc.produce(5)
    cut0 = sc.rule(fetch_requests(0, 2))
    sc.run_until(lambda: sc.isr_is({1, 2}))
    sc.produce(3)
    sc.snapshot("0 out of the ISR")
    cut1 = sc.rule(fetch_requests(1, 2))
    sc.run_until(lambda: sc.isr_is({2}))
    sc.produce(2)
    sc.snapshot("1 out: 2 stands alone")
    sc.stop(2, "lossy", tear=False)
    sc.wait_gone(2)
    sc.snapshot("2 lost its tail")
    sc.unrule(cut0)
    sc.unrule(cut1)
    sc.start(2)
    sc.wait_registered(2)
    sc.run_for(2000)
    sc.snapshot("2 restarted")


def lag_max_messages(sc: ScenarioRun) -> None:
    """Seed 003: with the pre-0.9 `replica.lag.max.messages` rule, healthy followers drop out
    of the ISR whenever a burst puts them more than N messages behind for a moment, and come
    back a moment later: the ISR flaps. The time rule (`replica.lag.time.max.ms`) keeps them."""
    sc.boot()
    for link in ((0, 1), (1, 0), (0, 2), (2, 0)):
        sc.cluster.network.link(*link).extra_delay_ms = 5  # an ordinary, healthy LAN
    for _ in range(60):
        sc.produce(40, acks=1, wait=False)
        sc.run_for(50)
    sc.run_for(500)
    sc.snapshot("after 60 bursts")
    shrinks = sum(n.stats.isr_shrinks for n in sc.cluster.nodes)
    if shrinks:
        sc.cluster.checker.fail("IsrFlapping", sc.tp, f"{shrinks} ISR shrink(s) of healthy "
                                "followers under bursts")


def stale_fetch_response(sc: ScenarioRun) -> None:
    """A fetch response sent in one leader epoch arrives after the follower moved to the next
    epoch (and started truncating): it must be ignored (KAFKA-18991)."""
    sc.boot()
    sc.produce(5)
    sc.run_until(lambda: sc.leo(1) >= 5)
    sc.cluster.network.link(0, 1).extra_delay_ms = 400
    sc.produce(3, wait=False)
    sc.run_for(20)
    sc.stop(2, "kill")
    sc.wait_gone(2)
    sc.snapshot("epoch bumped, response in flight")
    sc.run_for(600)
    sc.cluster.network.link(0, 1).extra_delay_ms = 0
    sc.produce(3)
    sc.snapshot("after")


def stale_controller(sc: ScenarioRun) -> None:
    """A controller failover; then a LeaderAndIsr from the old controller (lower controller
    epoch) naming another leader arrives. Every broker must refuse it (seed 004)."""
    sc.boot()
    sc.produce(5)
    old = sc.cluster.controller
    assert old is not None
    sc.cluster.failover_controller()
    sc.run_for(200)
    sc.snapshot("controller failed over")
    state = sc.zk()
    from dataclasses import replace as _replace

    from tidelog.controller.core import LeaderAndIsrRequest
    from tidelog.sim.messages import ControllerMessage

    forged = _replace(state, leader=1, leader_epoch=state.leader_epoch + 1, isr=(1,),
                      controller_epoch=old.core.controller_epoch)
    for b in (0, 1, 2):
        req = LeaderAndIsrRequest(old.controller_id, old.core.controller_epoch,
                                  sc.node(b).broker_epoch, (forged,), (1,))
        sc.cluster.network.send(CONTROLLER_NODE, b, ControllerMessage(req))
    sc.run_for(100)
    sc.snapshot("stale LeaderAndIsr delivered")
    for b in (0, 1, 2):
        p = sc.part(b)
        if p is not None and p.leader_epoch == forged.leader_epoch:
            sc.cluster.checker.fail("StaleControllerObeyed", sc.tp,
                                    f"broker {b} applied epoch {forged.leader_epoch} from "
                                    f"controller epoch {old.core.controller_epoch}")
    sc.produce(5)


def kip380(sc: ScenarioRun) -> None:
    """KIP-380: the leader, broker 0, is killed and restarted (a new registration, a new broker
    epoch). A LeaderAndIsr the controller had sent to its previous registration, naming it
    leader, reaches the new process (a duplicated, long-delayed message) before the
    controller's requests for the new one. It must be refused by its broker epoch: applied, the
    restarted broker would lead that old leader epoch again, from the HW of its checkpoint,
    below the HW it published in that epoch."""
    from tidelog.controller.core import LeaderAndIsrRequest
    from tidelog.sim.messages import ControllerMessage

    sc.boot()
    ctl = sc.cluster.controller
    assert ctl is not None
    old_epoch = sc.node(0).broker_epoch
    stale = LeaderAndIsrRequest(ctl.controller_id, ctl.core.controller_epoch, old_epoch,
                                (sc.zk(),), (0,))
    sc.produce(5)
    sc.snapshot("0 leads; HW 5 published, never checkpointed")
    sc.stop(0, "kill")
    sc.cluster.network.link(CONTROLLER_NODE, 0).extra_delay_ms = 300
    sc.start(0)
    sc.run_until(lambda: sc.node(0).broker_epoch not in (-1, old_epoch))
    sc.node(0).receive(CONTROLLER_NODE, ControllerMessage(stale))
    sc.run_for(10)
    sc.snapshot("the previous registration's LeaderAndIsr delivered")
    if sc.node(0).stats.stale_requests_refused == 0:
        sc.cluster.checker.fail("StaleBrokerEpochObeyed", sc.tp, "broker 0 applied a request "
                                f"meant for its previous registration (epoch {old_epoch})")
    sc.cluster.network.link(CONTROLLER_NODE, 0).extra_delay_ms = 0
    sc.run_until(lambda: sc.isr_is({0, 1, 2}))
    sc.produce(5)
    sc.snapshot("0 back as a follower")


def out_of_range(sc: ScenarioRun) -> None:
    """A follower whose fetch offset is past the new leader's LEO gets OFFSET_OUT_OF_RANGE and
    must recover (truncate to the leader's end and go on), never stop (KAFKA-7414). Unclean
    election elects the short replica 2; the follower truncates to its HW (the pre-KIP-101 rule
    is used here to land its fetch offset past the new leader's LEO)."""
    sc.boot()
    sc.produce(5)
    cut = sc.rule(fetch_requests(2, 0))
    sc.run_until(lambda: sc.isr_is({0, 1}))
    sc.produce(10)
    sc.snapshot("2 behind, out of the ISR")
    sc.stop(0, "kill")
    sc.stop(1, "kill")
    sc.unrule(cut)
    sc.run_until(lambda: sc.leader_is(2))
    sc.snapshot("unclean: 2 leads")
    sc.start(1)
    sc.run_until(lambda: sc.leo(1) == sc.leo(2) and sc.isr_is({1, 2}), 5000)
    sc.snapshot("1 recovered")


def topic_min_isr(sc: ScenarioRun) -> None:
    """The brokers' default min.insync.replicas is 1; topic t was created with its own
    min.insync.replicas=2 (RF 3, leader 0). Kafka enforces the topic's value: (1) followers 1 and
    2 stop fetching while acks=all writes wait: when the ISR shrinks to [0] the writes fail with
    NOT_ENOUGH_REPLICAS_AFTER_APPEND; (2) with 1 and 2 killed, an acks=all write is refused at
    append with NOT_ENOUGH_REPLICAS; (3) once they are back in the ISR, writes succeed again.
    Reading the broker default instead acknowledges every one of them on a single replica."""
    sc.boot()
    sc.produce(5)
    cuts = [sc.rule(fetch_requests(1, 0)), sc.rule(fetch_requests(2, 0))]
    producer = sc.producer(-1)
    sc.produce(3, wait=False)
    sc.run_until(lambda: sc.isr_is({0}))
    sc.run_until(lambda: not producer.in_flight, 5000)
    sc.snapshot("1, 2 stalled: ISR [0]")
    if sc.hw(0) > 5:  # KIP-966: no commit on one replica when the topic asks for two
        sc.cluster.checker.fail("MinIsrAck", sc.tp, f"HW {sc.hw(0)} advanced with ISR [0]")
    _expect_refused(sc, producer.error_codes[-3:], 3, 20, "NOT_ENOUGH_REPLICAS_AFTER_APPEND")
    for cut in cuts:
        sc.unrule(cut)
    sc.run_until(lambda: sc.isr_is({0, 1, 2}))
    sc.stop(1, "kill")
    sc.stop(2, "kill")
    sc.run_until(lambda: sc.isr_is({0}) and sc.part(0).isr == frozenset({0}))
    sc.snapshot("1, 2 killed: ISR [0]")
    before = len(producer.error_codes)
    acked = sc.produce(5)
    _expect_refused(sc, producer.error_codes[before:], 5 - acked, 19, "NOT_ENOUGH_REPLICAS")
    if acked:
        sc.cluster.checker.fail("MinIsrAck", sc.tp, f"{acked} of 5 acks=all writes acknowledged "
                                "with ISR [0] < the topic's min.insync.replicas 2")
    sc.start(1)
    sc.start(2)
    sc.run_until(lambda: sc.isr_is({0, 1, 2}))
    if sc.produce(5) != 5:
        sc.cluster.checker.fail("MinIsrUnavailable", sc.tp,
                                "writes refused with the full ISR back")
    sc.snapshot("1, 2 back")


def reassign(sc: ScenarioRun) -> None:
    """KIP-455 under faults, RF 3 on 4 brokers, min.isr=2, acks=all throughout. (1) [0,1,2] ->
    [1,2,3] while 3 cannot fetch: RS = [1,2,3,0], nothing deleted while 3 is out of the ISR;
    3 is killed and restarted and the controller fails over mid-move (the new one resumes from
    the topic znode); once 3 catches up the leader moves off 0, 0 leaves the ISR and its log
    is deleted, AR = [1,2,3]. (2) [1,2,3] -> [1,2,0] with the old replica 3 killed mid-move:
    the move completes without it and 3's log is deleted when it returns. (3) [1,2,0] ->
    [2,0,3], cancelled before 3 caught up: back to [1,2,0], 3's new log deleted. (4) a new
    partition and a preferred election. The lifecycle checks (sim/lifecycle_invariants.py)
    run after every event."""
    from tidelog.controller.core import ELECTION_PREFERRED

    c = sc.cluster
    tp = sc.tp

    def ctl() -> Any:
        assert c.controller is not None
        return c.controller

    def settled(replicas: list[int]) -> bool:
        s = sc.zk()
        return (tp not in c.moving and list(c.assignments[tp]) == replicas and s is not None
                and set(s.isr) == set(replicas) and sc.leader_is(s.leader))

    def expect(ok: bool, what: str) -> None:
        if not ok:
            c.checker.fail("ReassignmentScript", tp, what)

    sc.boot()
    sc.produce(10)
    cut = sc.rule(fetch_requests(3, 0))
    ctl().reassign({tp: [1, 2, 3]})
    sc.run_for(300)
    sc.snapshot("moving to [1,2,3]: 3 cannot fetch")
    expect(list(c.assignments[tp]) == [1, 2, 3, 0] and tp in c.moving, "RS [1,2,3,0] written")
    expect(sc.node(0).log(tp) is not None, "0's log kept while 3 is out of the ISR")
    sc.produce(5)
    sc.stop(3, "kill")
    sc.run_for(100)
    sc.start(3)
    sc.wait_registered(3)
    c.failover_controller()
    sc.run_for(100)
    sc.snapshot("new replica bounced, controller failed over")
    sc.unrule(cut)
    sc.produce(5)
    expect(sc.run_until(lambda: settled([1, 2, 3])), "move 1 completed")
    expect(sc.run_until(lambda: sc.node(0).log(tp) is None, 2000), "0's log deleted")
    sc.snapshot("moved to [1,2,3]")
    sc.produce(5)
    cut = sc.rule(fetch_requests(0, 1))
    ctl().reassign({tp: [1, 2, 0]})
    sc.run_for(5)
    sc.stop(3, "kill")
    sc.produce(5)
    # The controller must know 3 is gone when the move completes (a StopReplica sent to a
    # broker it still thinks alive is lost with the process, as in Kafka).
    sc.wait_gone(3)
    sc.unrule(cut)
    expect(sc.run_until(lambda: settled([1, 2, 0])), "move 2 completed without 3")
    sc.snapshot("moved to [1,2,0], 3 down")
    sc.start(3)
    expect(sc.run_until(lambda: sc.node(3).log(tp) is None, 3000),
           "3's log deleted when it returned")
    cut = sc.rule(fetch_requests(3, sc.zk().leader))
    ctl().reassign({tp: [2, 0, 3]})
    sc.produce(5)
    sc.run_for(200)
    sc.snapshot("moving to [2,0,3]")
    ctl().reassign({tp: None})
    # Back to the original replicas, in the full replica set's order (Kafka's originReplicas).
    expect(sc.run_until(lambda: settled([2, 0, 1])), "cancelled back to [2,0,1]")
    expect(sc.run_until(lambda: sc.node(3).log(tp) is None, 3000), "3's new log deleted")
    sc.unrule(cut)
    sc.snapshot("cancelled")
    parts = c.zk.get_topic_assignment(tp.topic) or {}
    c.zk.set_topic_assignment(tp.topic, {**parts, 1: [3, 0, 1]})
    expect(sc.run_until(lambda: len(c.tps) == 2 and c.acting_leader(c.tps[1]) is not None),
           "partition 1 created")
    expect(sc.leader_is(1), "1 still leads: 2, first of [2,0,1], is not the leader")
    result = ctl().elect_leaders([tp], ELECTION_PREFERRED)
    expect(result is not None and result[tp][0] == 0 and sc.run_until(lambda: sc.leader_is(2)),
           f"preferred leader 2 elected: {result}")
    sc.produce(5)
    sc.snapshot("partition added, preferred leader")


def _expect_refused(sc: ScenarioRun, codes: list[int], n: int, code: int, name: str) -> None:
    wrong = [c for c in codes if c != code]
    if len(codes) != n or wrong:
        sc.cluster.checker.fail("MinIsrAck", sc.tp, f"expected {n} refusals with {name} "
                                f"({code}), got codes {codes}")


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    title: str
    script: Callable[[ScenarioRun], None]
    config: Callable[[bool], SimConfig]
    naive_rule: str | None
    expect_naive: tuple[str, ...] = ()
    allowed: tuple[str, ...] = ()


def _cfg(brokers: int = 3, assignment: tuple[int, ...] | None = None, *,
         sim: dict[str, Any] | None = None, **replication: Any) -> SimConfig:
    cfg = _base(**replication)
    cfg = replace(cfg, brokers=brokers, replication_factor=len(assignment or range(brokers)),
                  assignments={0: assignment} if assignment else None, **(sim or {}))
    return cfg


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("kip101", "KIP-101: truncating to a stale HW loses acked data", kip101,
             # A long lag time: C leaves the ISR through the controller (an epoch bump), not
             # through the leader's shrink.
             lambda naive: _cfg(3, (0, 1, 2), min_insync_replicas=1, truncate_to_hw=naive,
                                replica_lag_time_max_ms=30_000),
             "truncate_to_hw", ("NoAckedLoss", "ValidHighWatermark", "StrongIsr")),
    Scenario("kip101_divergence", "KIP-101: leader lost its unflushed tail; logs must converge",
             kip101_divergence,
             lambda naive: _cfg(2, (0, 1), min_insync_replicas=1, truncate_to_hw=naive,
                                sim={"os_flush_ms": 10**9, "kip966_unclean_restart_rule": False}),
             "truncate_to_hw", ("Converged", "StrongIsr"),
             # The leader's page-cache loss happened while the follower was out of the ISR:
             # those acked records are lost by the scenario's own premise.
             allowed=("NoAckedLoss", "ConsumedStable")),
    Scenario("kip279", "KIP-279: fast leader changes; logs must converge", kip279,
             lambda naive: _cfg(2, (0, 1), min_insync_replicas=1,
                                unclean_leader_election_enable=True, truncate_to_hw=naive),
             "truncate_to_hw", ("Converged", "StrongIsr")),
    Scenario("kip320", "KIP-320: a zombie follower's fetch is fenced by the leader epoch", kip320,
             lambda naive: _cfg(3, (0, 1, 2), min_insync_replicas=1,
                                replica_lag_time_max_ms=30_000, fence_leader_epochs=not naive),
             "fence_leader_epochs=False", ("Converged", "StrongIsr")),
    Scenario("kafka7164", "KAFKA-7164: truncate on every epoch change, same leader or not",
             kafka7164,
             # 2 before 1 in preference order: the deaf broker 1 is never the one elected.
             lambda naive: _cfg(3, (0, 2, 1), min_insync_replicas=1,
                                replica_lag_time_max_ms=30_000),
             None),
    Scenario("maximal_isr", "KIP-497 rule: HW over current + pending ISR members", maximal_isr,
             lambda naive: _cfg(3, (0, 1, 2), min_insync_replicas=2, maximal_isr=not naive),
             "maximal_isr=False", ("NoAckedLoss", "ValidHighWatermark")),
    Scenario("kip841", "KIP-841: a late fetch must not re-add an offline replica", kip841,
             lambda naive: _cfg(3, (0, 1, 2), sim={"kip841_eligibility": not naive}),
             "no eligibility check", ("OfflineReplicaInIsr",)),
    Scenario("kip903", "KIP-903: a stale fetch from a previous registration", kip903,
             lambda naive: _cfg(3, (0, 1, 2), sim={"kip841_eligibility": not naive,
                                                   "os_flush_ms": 10**9}),
             "no broker-epoch check", ("ValidHighWatermark", "StrongIsr", "NoAckedLoss")),
    Scenario("kip966", "KIP-966: last replica standing after an unclean shutdown", kip966,
             lambda naive: _cfg(3, (2, 0, 1), min_insync_replicas=2, hw_requires_min_isr=not naive,
                                sim={"os_flush_ms": 10**9,
                                     "kip966_unclean_restart_rule": not naive}),
             "re-elect last replica standing", ("NoAckedLoss",)),
    Scenario("lag_max_messages", "seed 003: ISR flapping under bursts with a message-count lag",
             lag_max_messages,
             lambda naive: _cfg(3, (0, 1, 2), min_insync_replicas=1,
                                replica_lag_max_messages=20 if naive else None),
             "replica.lag.max.messages=20", ("IsrFlapping",)),
    Scenario("stale_fetch_response", "KAFKA-18991: a response from an older epoch is ignored",
             stale_fetch_response, lambda naive: _cfg(3, (0, 1, 2), min_insync_replicas=1), None),
    Scenario("stale_controller", "a stale controller's LeaderAndIsr is refused", stale_controller,
             lambda naive: _cfg(3, (0, 1, 2)), None),
    Scenario("kip380", "KIP-380: a request for a bounced broker's previous registration",
             kip380, lambda naive: _cfg(3, (0, 1, 2), sim={"hw_checkpoint_ms": 10**9}), None),
    Scenario("topic_min_isr", "a topic's own min.insync.replicas overrides the brokers' default",
             topic_min_isr,
             lambda naive: _cfg(3, (0, 1, 2), min_insync_replicas=1, replica_lag_time_max_ms=500,
                                sim={"topic_properties": {"min.insync.replicas": 2}}),
             None),
    Scenario("reassign", "KIP-455: moves under crashes, a controller failover, a cancellation",
             reassign, lambda naive: _cfg(4, (0, 1, 2)), None),
    Scenario("out_of_range", "KAFKA-7414: out-of-range is never fatal for a follower",
             out_of_range,
             lambda naive: _cfg(3, (0, 1, 2), min_insync_replicas=1,
                                unclean_leader_election_enable=True, truncate_to_hw=True),
             None,
             # Unclean election loses acked data by definition.
             allowed=("NoAckedLoss", "ConsumedStable")),
)}


def run_scenario(name: str, naive: bool = False) -> ScenarioResult:
    scenario = SCENARIOS[name]
    if naive and scenario.naive_rule is None:
        raise ValueError(f"scenario {name} has no naive rule to compare with")
    run = ScenarioRun(name, naive, scenario.config(naive))
    run.result.expected_naive = scenario.expect_naive
    run.result.allowed = scenario.allowed
    scenario.script(run)
    return run.finish()
