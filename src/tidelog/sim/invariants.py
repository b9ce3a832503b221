"""The invariants of DESIGN.md, checked after every simulated event and at the end of a run.

After every event (cheap, incremental):
- LeaderInIsr: a replica acting as leader is in the ISR it believes.
- OneLeaderPerEpoch: no two brokers ever act as leader of one partition in one leader epoch.
- ValidHighWatermark: a leader's HW does not exceed the real LEO of any live member of the ISR
  it computes the HW over (current members plus pending additions).
- MonotonicHighWatermark: while a broker leads a partition in one epoch its HW never decreases
  (and at the end, `SimCluster.final_checks`: no consumer ever saw the HW go back).
- StrongIsr: below the leader's HW, the leader and every live member of the ISR recorded in
  ZooKeeper hold the same batches (offset range, leader epoch, CRC). Checked when the leader,
  its epoch, its HW or a member's LEO changed, on the newest committed batch; the whole prefix is
  compared every `full_check_every` checks and at the end.
- ConsumersBelowHw: checked where consumer fetches are served (`node.py`).
- MinIsrAck: checked where produces are acknowledged (`node.py`): an acks=all write is
  acknowledged only while the leader's ISR (current plus pending members) has at least the
  topic's min.insync.replicas, as the cluster configured the topic.
- ElectedFromIsr, ElectedOfflineReplica: checked where the controller writes a new leader
  (`sim/controller.py`): from the ISR ZooKeeper held (unclean election aside), never a replica
  its broker answered KAFKA_STORAGE_ERROR for.
- HaltWithoutLogDir (`SimCluster`): no broker runs with every log dir offline.

A replica in a failing log dir is not read by these checks (`SimBroker.readable`): a checker's
read there would report the dir before the broker's own I/O does.

A replica that lost data in a lossy crash is exempt from ValidHighWatermark/StrongIsr for leaders
whose epoch was decided before the controller handled its failure (`SimBroker.is_dirty`): a
page-cache loss on an ISR member breaks these in Kafka too; what must still hold then is
NoAckedLoss, checked at the end.

An unclean election (unclean.leader.election.enable, or an admin's UNCLEAN ElectLeaders) starts
a history that need not hold what earlier leaders committed. A leader of an epoch before it that
still acts (a zombie: paused, or cut off from ZooKeeper, so it has not yet learned of the new
epochs) keeps its HW and its ISR, and a member of that ISR that has since followed a leader of
the unclean epoch or later truncated to that leader's log, below the zombie's HW. Kafka does the
same: the zombie's HW only moves up (Partition.maybeIncrementLeaderHW) until a LeaderAndIsr
makes it a follower, and the follower truncates to the new leader's epoch end offset with no
floor at any HW (AbstractFetcherThread.truncateOnFetchResponse / maybeTruncateToEpochEndOffsets,
KIP-279) — that is the data loss unclean election allows. So ValidHighWatermark exempts exactly
that pair: a leader of epoch e and a member now following epoch f, with an unclean election at an
epoch u, e < u <= f (`note_partition_write` records u where the controller writes it) — and
only while the zombie's HW stays within what that member held before it moved on (the highest
LEO the checks saw it with under the zombie; the zombie counts a member's LEO only as its fetches
reported it, and the member fetches from it no more): a zombie's HW that rises above that is
still a violation. It stays strict for the unclean leader and every later one, for a zombie
against members that still follow an epoch before the unclean election, and in runs without
unclean elections.

At the end, after healing (`SimCluster.final_checks`): NoAckedLoss (every acks=all write is in
the log at its offset), acked ⊆ consumed, consumed data never changed, and every replica
converged batch by batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any, Protocol

from tidelog.replication.types import TopicPartition

BatchSig = tuple[int, int, int, int]  # (base offset, last offset, partition leader epoch, crc)


@dataclass(frozen=True, slots=True)
class Violation:
    time_ms: int
    invariant: str
    tp: TopicPartition | None
    detail: str

    def __str__(self) -> str:
        where = f" {self.tp}" if self.tp is not None else ""
        return f"[{self.time_ms}ms] {self.invariant}{where}: {self.detail}"


@dataclass(slots=True)
class InvariantChecker:
    """The per-event checks, over a `LiveClusterView` (the simulator's; `now_ms` stamps a
    violation, `on_violation` traces it)."""

    view: LiveClusterView
    now_ms: Callable[[], int]
    on_violation: Callable[[Violation], None] | None = None
    full_check_every: int = 500
    violations: list[Violation] = field(default_factory=list)
    leaders_by_epoch: dict[tuple[TopicPartition, int], int] = field(default_factory=dict)
    last_hw: dict[tuple[TopicPartition, int, int], int] = field(default_factory=dict)
    _strong_keys: dict[TopicPartition, Any] = field(default_factory=dict)
    _verified: dict[tuple[TopicPartition, int, int], int] = field(default_factory=dict)
    _quick_at: dict[TopicPartition, int] = field(default_factory=dict)
    quick_check_every: int = 8
    _checks: int = 0
    counts: dict[str, int] = field(default_factory=dict)  # every failed check, repeats included
    _seen: set[tuple[str, TopicPartition | None, str]] = field(default_factory=set)
    # Leader epochs a controller decided by an unclean election, per partition (ascending).
    unclean_epochs: dict[TopicPartition, list[int]] = field(default_factory=dict)
    _written: dict[TopicPartition, Any] = field(default_factory=dict)
    # (partition, leader epoch, member): the highest LEO a check saw the member with while the
    # leader of that epoch counted it (the exemption above is bounded by it).
    member_leo_seen: dict[tuple[TopicPartition, int, int], int] = field(default_factory=dict)
    _zombie_hw_bound: dict[tuple[TopicPartition, int, int], int] = field(default_factory=dict)
    # Checks where the exemption let a zombie's HW stand above a member's LEO (pinned seeds
    # must reach it).
    zombie_hw_exemptions: int = 0
    enabled: bool = True
    # Stop recording after this many (a broken rule tends to repeat on every event).
    max_violations: int = 50

    def fail(self, invariant: str, tp: TopicPartition | None, detail: str) -> None:
        self.counts[invariant] = self.counts.get(invariant, 0) + 1
        key = (invariant, tp, detail)
        if key in self._seen:
            return  # the same broken state seen again on the next event
        self._seen.add(key)
        if len(self.violations) < self.max_violations:
            v = Violation(self.now_ms(), invariant, tp, detail)
            self.violations.append(v)
            if self.on_violation is not None:
                self.on_violation(v)

    # -- after every event ---------------------------------------------------------------
    def check(self) -> None:
        if not self.enabled:
            return
        self._checks += 1
        full = self._checks % self.full_check_every == 0
        view = self.view
        member_leo = view.member_log_end_offset
        exempt = view.exempt
        leaders_by_epoch = self.leaders_by_epoch
        last_hw = self.last_hw
        member_leo_seen = self.member_leo_seen
        for bid, tp, epoch, hw, isr, pending in view.acting_leaders():
            if bid not in isr:
                self.fail("LeaderInIsr", tp, f"leader {bid} not in its ISR {sorted(isr)}")
            key = (tp, epoch)
            other = leaders_by_epoch.get(key)
            if other is None:
                leaders_by_epoch[key] = bid
            elif other != bid:
                self.fail("OneLeaderPerEpoch", tp,
                          f"brokers {other} and {bid} both lead epoch {epoch}")
            hkey = (tp, bid, epoch)
            prev = last_hw.get(hkey)
            if prev != hw:
                if prev is not None and hw < prev:
                    self.fail("MonotonicHighWatermark", tp,
                              f"leader {bid} epoch {epoch} HW {prev} -> {hw}")
                last_hw[hkey] = hw
            for m in (isr if pending is None else isr | pending):
                if m == bid:
                    continue
                leo = member_leo(m, tp)
                if leo is None:
                    continue
                if self._follows_unclean_history(tp, epoch, m):
                    self._check_zombie_hw(bid, tp, epoch, hw, m, leo)
                    continue
                mkey = (tp, epoch, m)
                if leo > member_leo_seen.get(mkey, -1):
                    member_leo_seen[mkey] = leo
                if leo < hw and not exempt(m, tp, epoch):
                    self.fail("ValidHighWatermark", tp,
                              f"leader {bid} HW {hw} > LEO {leo} of ISR member {m}")
            self._strong_isr(bid, tp, epoch, hw, full)

    def note_partition_write(self, tp: TopicPartition, before: Any, state: Any) -> None:
        """A controller wrote ``state`` (leader, leader_epoch, isr) for ``tp``; ``before`` is
        ZooKeeper's state when the controller's event began (None: no znode, a new partition).
        A leader outside the ISR it replaced is an unclean election: recorded at its epoch."""
        if before is None:
            self.unclean_epochs.pop(tp, None)  # a new partition (or one created again)
            self._written.pop(tp, None)
        last = self._written.get(tp)
        # One event may write several states (an election and another): compare with the
        # newest of ZooKeeper's state before the event and this event's earlier writes.
        prev = before if last is None or (
            before is not None and before.leader_epoch >= last.leader_epoch) else last
        self._written[tp] = state
        if prev is not None and state.leader >= 0 and state.leader not in prev.isr:
            self.unclean_epochs.setdefault(tp, []).append(state.leader_epoch)

    def _follows_unclean_history(self, tp: TopicPartition, epoch: int, member: int) -> bool:
        """``member`` follows a leader of an epoch at or after an unclean election that the
        leader of ``epoch`` predates (its HW counts data that history need not hold)."""
        unclean = self.unclean_epochs.get(tp)
        if not unclean:
            return False
        follows = self.view.member_leader_epoch(member, tp)
        return follows is not None and any(epoch < u <= follows for u in unclean)

    def _check_zombie_hw(self, bid: int, tp: TopicPartition, epoch: int, hw: int,
                         member: int, leo: int) -> None:
        """The HW of the leader of ``epoch`` may stand above the LEO of ``member``, which follows
        the unclean history now, but not rise above what ``member`` held while it still
        followed an earlier epoch: the leader's HW counts a member's LEO only as that member's
        fetches reported it (Partition.maybeIncrementLeaderHW), and it fetches from this leader
        no more. The bound is fixed at the first check that exempts the pair: the highest LEO
        the checks saw it with under this leader, or the HW then if they saw none (a member
        that came back straight into the unclean history)."""
        if leo < hw:
            self.zombie_hw_exemptions += 1
        key = (tp, epoch, member)
        bound = self._zombie_hw_bound.get(key)
        if bound is None:
            bound = self._zombie_hw_bound[key] = max(self.member_leo_seen.get(key, -1), hw)
        if hw > bound and not self.view.exempt(member, tp, epoch):
            self.fail("ValidHighWatermark", tp,
                      f"leader {bid} HW {hw} rose above {bound}, the most ISR member {member} "
                      "held before it followed the unclean election")

    def _strong_isr(self, bid: int, tp: TopicPartition, epoch: int, hw: int,
                    full: bool) -> None:
        view = self.view
        zk = view.zk_state(tp)
        if zk is None or zk.leader != bid or zk.leader_epoch != epoch or hw <= 0:
            return
        key = (bid, epoch, hw, zk.isr)
        if not full:
            if self._strong_keys.get(tp) == key:
                return
            # Reading a batch costs an index lookup per member: while the HW keeps moving, look
            # at most every `quick_check_every` checks (a divergence persists until repaired, and
            # the full comparison covers the whole committed range).
            if key[:2] == (self._strong_keys.get(tp) or (None, None))[:2] and (
                    self._checks - self._quick_at.get(tp, -10**9) < self.quick_check_every):
                return
        self._strong_keys[tp] = key
        self._quick_at[tp] = self._checks
        members = []
        for m in zk.isr:
            if m == bid or not view.working(m, tp) or view.exempt(m, tp, epoch):
                continue
            peer = view.replica(m, tp)
            if peer is None:
                continue
            members.append((m, peer, peer.log_end_offset))
        if not members:
            return
        leader = view.replica(bid, tp)
        if leader is None:
            return
        # A member's batch at HW-1 can only change by a truncation below the HW, which
        # ValidHighWatermark sees; so re-check when the leader, its epoch, its HW or the ISR
        # change, and compare the whole new committed range every `full_check_every` checks.
        if full:
            vkey = (tp, bid, epoch)
            start = self._verified.get(vkey, 0)
            mine = leader.batches(start, hw)
            for m, peer, leo in members:
                theirs = peer.batches(start, min(hw, leo))
                upto = min(len(mine), len(theirs))
                if mine[:upto] != theirs[:upto]:
                    first = next(i for i in range(upto) if mine[i] != theirs[i])
                    self.fail("StrongIsr", tp, f"leader {bid} and {m} differ below "
                              f"HW {hw}: {mine[first]} vs {theirs[first]}")
                    return
            if mine:
                self._verified[vkey] = mine[-1][0]
            return
        sig = leader.batch_at(hw - 1)
        for m, peer, leo in members:
            if leo < hw:
                continue
            other = peer.batch_at(hw - 1)
            if sig != other:
                self.fail("StrongIsr", tp, f"leader {bid} and {m} differ at "
                          f"offset {hw - 1} (HW {hw}): {sig} vs {other}")


class ReplicaView(Protocol):
    """One replica's log as a checker reads it."""

    @property
    def log_end_offset(self) -> int: ...

    def batches(self, start: int = 0, end: int | None = None) -> list[BatchSig]:
        """(base offset, last offset, epoch, crc) of each batch overlapping [start, end)."""
        ...

    def batch_at(self, offset: int) -> BatchSig | None:
        """The batch holding ``offset``, or None."""
        ...


class ClusterView(Protocol):
    """What the replica checks read of a cluster: the simulator implements it over its nodes,
    the real-process tests over ZooKeeper, the brokers' answers and their log files."""

    def partitions(self) -> Sequence[TopicPartition]: ...

    def assigned_replicas(self, tp: TopicPartition) -> Sequence[int]: ...

    def zk_state(self, tp: TopicPartition) -> Any:
        """The partition state in ZooKeeper (leader, leader_epoch, isr), or None."""
        ...

    def leader_high_watermark(self, tp: TopicPartition) -> int | None:
        """The HW of the broker leading ``tp`` in ZooKeeper's epoch; None without one."""
        ...

    def running(self, broker_id: int) -> bool: ...

    def replica(self, broker_id: int, tp: TopicPartition) -> ReplicaView | None:
        """A running broker's replica of ``tp``; None when it has no log for it."""
        ...


class LiveClusterView(ClusterView, Protocol):
    """What the per-event checks read besides: each broker's own belief, as it acts now (the
    simulator implements it; a real cluster can only be sampled)."""

    def acting_leaders(self) -> Iterable[tuple[int, TopicPartition, int, int, AbstractSet[int],
                                               AbstractSet[int] | None]]:
        """(broker, partition, leader epoch, HW, ISR, pending ISR additions or None) for every
        partition a working broker (running, disk usable) acts as the leader of."""
        ...

    def working(self, broker_id: int, tp: TopicPartition) -> bool:
        """Running, its replica of ``tp`` not on a failing disk."""
        ...

    def member_log_end_offset(self, broker_id: int, tp: TopicPartition) -> int | None:
        """The LEO of the partition a working broker hosts now; None otherwise."""
        ...

    def member_leader_epoch(self, broker_id: int, tp: TopicPartition) -> int | None:
        """The leader epoch a working broker's replica of ``tp`` is in now; None otherwise."""
        ...

    def exempt(self, broker_id: int, tp: TopicPartition, leader_epoch: int) -> bool:
        """The broker lost data in a power loss that a leader of ``leader_epoch`` may still
        count on (exempt from ValidHighWatermark/StrongIsr)."""
        ...


def check_replicas(view: ClusterView, converged: bool,
                   exempt: Callable[[int, TopicPartition, int], bool] | None = None
                   ) -> list[tuple[str, TopicPartition, str]]:
    """DESIGN's replica invariants over a whole cluster, batch by batch: LeaderInIsr; StrongIsr
    (below the leader's HW every running member of ZooKeeper's ISR holds the leader's batches)
    and ValidHighWatermark (it holds them all); with ``converged`` (after healing), every
    running assigned replica holds exactly the leader's batches. ``exempt(broker, tp, leader
    epoch)``: a member whose lost data that leader may still count on (a power loss)."""
    out: list[tuple[str, TopicPartition, str]] = []
    for tp in view.partitions():
        s = view.zk_state(tp)
        hw = view.leader_high_watermark(tp)
        if s is None or s.leader < 0 or hw is None:
            continue  # no acting leader: nothing is committed to compare against
        leader = view.replica(s.leader, tp)
        if leader is None or leader.log_end_offset < hw:
            out.append(("ValidHighWatermark", tp, f"leader {s.leader} HW {hw} beyond its own log "
                        f"({'none' if leader is None else leader.log_end_offset})"))
            continue
        if s.leader not in s.isr:
            out.append(("LeaderInIsr", tp, f"leader {s.leader} not in the ISR {sorted(s.isr)}"))
        mine = leader.batches(0, hw)
        for m in s.isr:
            if m == s.leader or not view.running(m) or (exempt and exempt(m, tp, s.leader_epoch)):
                continue
            peer = view.replica(m, tp)
            leo = -1 if peer is None else peer.log_end_offset
            if peer is None or leo < hw:
                out.append(("ValidHighWatermark", tp,
                            f"leader {s.leader} HW {hw} > LEO {leo} of ISR member {m}"))
                continue
            theirs = peer.batches(0, hw)
            if theirs != mine:
                first = next((i for i, (a, b) in enumerate(zip(mine, theirs, strict=False))
                              if a != b), min(len(mine), len(theirs)))
                out.append(("StrongIsr", tp, f"leader {s.leader} and {m} differ below HW {hw} "
                            f"at batch #{first}"))
        if not converged:
            continue
        ref = leader.batches()
        for r in view.assigned_replicas(tp):
            if r == s.leader or not view.running(r):
                continue
            peer = view.replica(r, tp)
            if peer is None:
                out.append(("Converged", tp, f"replica {r} has no log for the partition"))
                continue
            theirs = peer.batches()
            if theirs != ref:
                diff = next((i for i, (a, b) in enumerate(zip(ref, theirs, strict=False))
                             if a != b), min(len(ref), len(theirs)))
                out.append(("Converged", tp, f"replica {r} differs from leader {s.leader} at "
                            f"batch #{diff} ({len(theirs)} vs {len(ref)} batches)"))
    return out


def batch_signatures(log: Any, start: int = 0, end: int | None = None) -> list[BatchSig]:
    """(base offset, last offset, epoch, crc) of each batch of `log` overlapping [start, end)."""
    out: list[BatchSig] = []
    for b in log.batches(start):
        if end is not None and b.base_offset >= end:
            break
        out.append((b.base_offset, b.last_offset, b.partition_leader_epoch, b.crc))
    return out


def batch_at(log: Any, offset: int) -> BatchSig | None:
    """The signature of the batch holding `offset`, or None."""
    for b in log.batches(offset):
        if b.base_offset <= offset <= b.last_offset:
            return (b.base_offset, b.last_offset, b.partition_leader_epoch, b.crc)
        return None
    return None


def crc_by_offset(log: Any) -> dict[int, int]:
    return {b.base_offset: b.crc for b in log.batches(0)}
