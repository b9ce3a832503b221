"""Faults chosen by the seed.

`FaultInjector` wakes up at random intervals and picks one fault among the enabled kinds:

- `drop`, `duplicate`, `reorder`, `delay`: a fault on one directed link for a while (message
  loss, duplication, reordering, extra latency): between two brokers, or (one in `brokers`)
  between a broker and the controller's end of its AlterPartition channel, either way;
- `partition`: cut one broker off from the other brokers, or from ZooKeeper and the controller
  co-located with it (its AlterPartition channel; the controller's own requests are modelled
  as reliable, as Kafka's controller sends each again until answered), or from everyone;
- `crash`: stop a broker — clean (controlled shutdown first), kill -9 (the page cache survives)
  or lossy (power loss: unflushed writes are lost) — and restart it later;
- `pause`: freeze a broker for longer than the ZooKeeper session timeout (a zombie);
- `slow`: make one broker's links slow (a slow follower);
- `burst`: a burst of produce traffic;
- `controller`: a controller failover (a new controller epoch; the old one's requests in flight
  must be refused);
- `disk`: one of a broker's log dirs fails (dead disk, full disk or read-only) for a while: the
  broker's next I/O there reports it (LogDirFailureChannel), its replicas there go offline and
  the controller learns it (/log_dir_event_notification, then the LeaderAndIsr answers), or the
  broker halts with no dir left; it is restarted on the repaired disk (Kafka takes a failed log
  dir offline until restart).
- `reassign`: AlterPartitionReassignments of a random partition (add, remove or replace a
  replica, or reorder), or the cancellation of a move in progress; a move that starts is
  followed by a fault aimed at it: a crash of an old or a new replica, a controller failover or
  a cancellation. One move that copies data is forced in every run (at 0.3-1.8 s; with no
  spare broker a replica is removed first and one added 0.3-1.5 s later).
- `add_partitions`: CreatePartitions (one more partition in the topic znode, at most
  `max_added_partitions` per run; refused while a move is in progress, as Kafka does);
- `elect`: ElectLeaders, preferred; unclean only where the run enables unclean election.
- `alter_log_dirs`: AlterReplicaLogDirs of a replica to another log dir of its broker (runs
  with several dirs per broker): the shell copies it into a future log and swaps it in by
  renames; one move in three is followed by a crash of that broker 1-20 ms later.

Limits keep a run inside the precondition of NoAckedLoss ("one ISR member's disk stays
intact"): at most `max_down` brokers — less what a move shrank a partition's original or target
replica set by, below the run's replication factor, and less the in-sync replicas a cancelled
move deleted until the ISR holds every assigned replica again — are stopped or frozen at once, and at most
one broker is recovering from a lossy crash at a time. Every choice uses the injector's own `random.Random`
seeded from the run's seed.
"""

from __future__ import annotations

import errno
import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tidelog.controller.core import ELECTION_PREFERRED, ELECTION_UNCLEAN
from tidelog.replication.types import TopicPartition
from tidelog.sim.messages import CONTROLLER_CHANNEL_NODE, ZK_NODE

if TYPE_CHECKING:  # pragma: no cover
    from tidelog.sim.cluster import SimCluster
    from tidelog.sim.node import SimBroker

ALL_FAULTS = ("drop", "duplicate", "reorder", "delay", "partition", "crash", "pause", "slow",
              "burst", "controller", "disk", "reassign", "add_partitions", "elect",
              "alter_log_dirs")
# Every fault kind is in the default random runs (`disk` was left out while the replication core
# mishandled a storage error inside make_leader; fixed in commit 0c9b301).
DEFAULT_FAULTS = ALL_FAULTS
# Process faults move leadership and the ISR, where the bugs live: draw them more often.
WEIGHTS = {"crash": 3, "pause": 2, "partition": 2, "alter_log_dirs": 2}


@dataclass(slots=True)
class FaultStats:
    injected: dict[str, int] = field(default_factory=dict)

    def count(self, kind: str) -> None:
        self.injected[kind] = self.injected.get(kind, 0) + 1

    @property
    def total(self) -> int:
        return sum(self.injected.values())


class FaultInjector:
    def __init__(self, cluster: SimCluster, kinds: Iterable[str] = DEFAULT_FAULTS, *,
                 rng: random.Random | None = None, mean_interval_ms: int = 500,
                 max_down: int | None = None) -> None:
        self.cluster = cluster
        # A move between log dirs needs two of them: not drawn in runs with one.
        self.kinds = tuple(k for k in ALL_FAULTS if k in set(kinds) and (
            k != "alter_log_dirs" or cluster.config.log_dirs_per_broker > 1))
        unknown = set(kinds) - set(ALL_FAULTS)
        if unknown:
            raise ValueError(f"unknown fault kind(s): {', '.join(sorted(unknown))}; "
                             f"choose from {', '.join(ALL_FAULTS)}")
        self.rng = rng or random.Random(cluster.rng.getrandbits(64))
        self.mean_interval_ms = mean_interval_ms
        self.max_down = (cluster.config.brokers - 1) if max_down is None else max_down
        self.active = False
        self.stats = FaultStats()
        # Brokers in a controlled shutdown (stopped 30 ms later): already down for the limits.
        self._stopping: set[int] = set()
        self.max_added_partitions = 1  # each one adds to every later event's work
        self._added_partitions = 0
        # Per partition, the in-sync replicas a cancellation deleted (copies of acked records
        # gone) until the ISR holds every assigned replica again (the records re-copied).
        self._deleted_in_sync: dict[TopicPartition, int] = {}

    def start(self, delay_ms: int = 300) -> None:
        if self.kinds and not self.active:
            self.active = True
            self.cluster.scheduler.schedule(delay_ms, self._tick)
            if "reassign" in self.kinds:
                self._later(300, 1800, self._forced_reassign)

    def stop(self) -> None:
        self.active = False

    def _tick(self) -> None:
        if not self.active:
            return
        kind = self.rng.choices(self.kinds, [WEIGHTS.get(k, 1) for k in self.kinds])[0]
        getattr(self, "_" + kind)()
        self.cluster.scheduler.schedule(
            max(1, int(self.rng.expovariate(1 / self.mean_interval_ms))), self._tick)

    # -- helpers ----------------------------------------------------------------------------
    def _down_limit(self) -> int:
        """`max_down`, less what a move shrank the smallest replica set by (a partition's
        original or target replicas below the replication factor the run started with)."""
        c = self.cluster
        rf = min(c.config.replication_factor, c.config.brokers)
        smallest = rf
        for tp in c.tps:
            rs = c.assignments[tp]
            adding, removing = c.moving.get(tp, ((), ()))
            smallest = min(smallest, len(rs) - len(adding), len(rs) - len(removing))
        deleted = 0
        for tp, n in list(self._deleted_in_sync.items()):
            s = c.zk_state(tp)
            if s is not None and set(c.assignments[tp]) <= set(s.isr):
                del self._deleted_in_sync[tp]
            else:
                deleted = max(deleted, n)
        return self.max_down - (rf - smallest) - deleted

    def _down_count(self) -> int:
        # A broker with a failing log dir counts: its replicas there are as good as down.
        return sum(1 for n in self.cluster.nodes
                   if not n.running or n.paused or n.broker_id in self._stopping
                   or n.failed_dirs)

    def _pick_running(self) -> int | None:
        running = [n.broker_id for n in self.cluster.nodes
                   if n.running and not n.paused and n.broker_id not in self._stopping]
        return self.rng.choice(running) if running else None

    def _later(self, lo: int, hi: int, fn: object, *args: object) -> None:
        self.cluster.scheduler.schedule(self.rng.randint(lo, hi), fn, *args)  # type: ignore[arg-type]

    def _note(self, kind: str, *details: object) -> None:
        self.stats.count(kind)
        self.cluster.trace_add(("fault", None, kind, *details))

    def _link_pair(self) -> tuple[int, int]:
        """Two brokers, or (one time in n) a broker and its AlterPartition channel's other end,
        in either direction."""
        rng = self.rng
        n = self.cluster.config.brokers
        a = rng.randrange(n)
        b = rng.randrange(n)
        if b != a:
            return a, b
        return (a, CONTROLLER_CHANNEL_NODE) if rng.random() < 0.5 else (CONTROLLER_CHANNEL_NODE, a)

    # -- the faults -------------------------------------------------------------------------
    def _link_fault(self, kind: str, **settings: float | int) -> None:
        src, dst = self._link_pair()
        cfg = self.cluster.network.link(src, dst)
        old = (cfg.drop, cfg.duplicate, cfg.reorder, cfg.extra_delay_ms)
        for k, v in settings.items():
            setattr(cfg, k, v)
        self._note(kind, (src, dst))

        def restore() -> None:
            cfg.drop, cfg.duplicate, cfg.reorder, cfg.extra_delay_ms = old
        self._later(200, 2000, restore)

    def _drop(self) -> None:
        self._link_fault("drop", drop=self.rng.choice((0.1, 0.3, 1.0)))

    def _duplicate(self) -> None:
        self._link_fault("duplicate", duplicate=0.3)

    def _reorder(self) -> None:
        self._link_fault("reorder", reorder=0.3)

    def _delay(self) -> None:
        self._link_fault("delay", extra_delay_ms=self.rng.randint(20, 400))

    def _slow(self) -> None:
        b = self._pick_running()
        if b is None:
            return
        net = self.cluster.network
        extra = self.rng.randint(100, 1500)
        cfgs = [net.link(b, o.broker_id) for o in self.cluster.nodes if o.broker_id != b]
        for cfg in cfgs:
            cfg.extra_delay_ms = extra
        self._note("slow", ("broker", b), ("delay", extra))

        def restore() -> None:
            for cfg in cfgs:
                cfg.extra_delay_ms = 0
        self._later(1000, 4000, restore)

    def _partition(self) -> None:
        b = self._pick_running()
        if b is None:
            return
        net = self.cluster.network
        brokers = {n.broker_id for n in self.cluster.nodes} - {b}
        shape = self.rng.choice(("brokers", "zookeeper", "all"))
        controller = {ZK_NODE, CONTROLLER_CHANNEL_NODE}
        others = brokers if shape == "brokers" else controller if shape == "zookeeper" else (
            brokers | controller)
        net.partition({b}, others)
        self._note("partition", ("broker", b), shape)

        def heal() -> None:
            for o in others:
                net.unblock(b, o)
        self._later(300, 3 * self.cluster.config.session_timeout_ms, heal)

    def _crash(self) -> None:
        if self._down_count() >= self._down_limit():
            return
        b = self._pick_running()
        if b is None:
            return
        self._crash_broker(b)

    def crash_aimed(self, b: int, aim: str) -> None:
        """A crash of broker `b` aimed at something the caller watches (e.g. a transaction
        coordinator between PrepareCommit and CompleteCommit), within the same limits."""
        node = self.cluster.nodes[b]
        if (self.active and node.running and not node.paused and b not in self._stopping
                and self._down_count() < self._down_limit()):
            self.cluster.trace_add(("fault", None, "aimed", aim))  # counted as its crash
            self._crash_broker(b)

    def _crash_broker(self, b: int) -> None:
        node = self.cluster.nodes[b]
        lossy_ok = not any(n.recovering() for n in self.cluster.nodes)
        kinds = ["clean", "kill"] + (["lossy"] if lossy_ok else [])
        kind = self.rng.choice(kinds)
        self._note("crash", ("broker", b), kind)
        if kind == "clean" and self.cluster.controller is not None:
            self.cluster.controller.controlled_shutdown(b)
            self._stopping.add(b)

            def stop_cleanly() -> None:
                self._stopping.discard(b)
                node.stop("clean")
            self.cluster.scheduler.schedule(30, stop_cleanly)
        else:
            node.stop(kind)
        self._later(300, 3000, self._restart, b)

    def _restart(self, b: int) -> None:
        node = self.cluster.nodes[b]
        if not node.running:
            self.cluster.trace_add(("fault", None, "restart", ("broker", b)))
            node.start()

    def _pause(self) -> None:
        if self._down_count() >= self._down_limit():
            return
        b = self._pick_running()
        if b is None:
            return
        st = self.cluster.config.session_timeout_ms
        duration = self.rng.randint(st + st // 2, 3 * st)
        self.cluster.nodes[b].pause()
        self._note("pause", ("broker", b), ("ms", duration))
        self.cluster.scheduler.schedule(duration, self.cluster.nodes[b].resume)

    def _disk(self) -> None:
        if self._down_count() >= self._down_limit():
            return
        b = self._pick_running()
        if b is None:
            return
        node = self.cluster.nodes[b]
        # One of its log dirs fails at the FileIO boundary: the broker finds out at its next
        # I/O there (LogDirFailureChannel), takes the dir's replicas offline and tells the
        # controller, or halts when no dir is left.
        healthy = [d for d in node.log_dirs if d not in node.failed_dirs]
        if not healthy:
            return
        log_dir = self.rng.choice(healthy)
        kind = self.rng.choice(("dead", "full", "read-only"))
        code, writes_only = {"dead": (errno.EIO, False), "full": (errno.ENOSPC, True),
                             "read-only": (errno.EROFS, True)}[kind]
        node.file_io.fail_io(log_dir, code, writes_only)
        node.failed_dirs.add(log_dir)
        self._note("disk", ("broker", b), ("dir", log_dir), kind)

        def repair() -> None:
            node.file_io.heal()
            node.failed_dirs.clear()
            self.cluster.trace_add(("fault", None, "disk_repaired", ("broker", b)))
            # A failed log dir comes back only with a restart (Kafka's too): restart the
            # process running on it now, or start the one that halted.
            if node.running:
                node.stop("kill")
            self._later(100, 1000, self._restart, b)
        self._later(200, 1500, repair)

    def _controller(self) -> None:
        self._note("controller")
        self.cluster.failover_controller()

    # -- the partition lifecycle -----------------------------------------------------------
    def _forced_reassign(self) -> None:
        if self.active:
            self._reassign(forced=True)

    def _reassign(self, forced: bool = False) -> None:
        c = self.cluster
        ctl = c.controller
        if ctl is None or not ctl.active:
            return
        c.sync_topic()  # the topic znode as it is now
        tp = self.rng.choice(c.tps)
        if tp in c.moving and self.rng.random() < 0.3:
            self._cancel(tp)
            return
        adding, _ = c.moving.get(tp, ((), ()))
        origin = [r for r in c.assignments[tp] if r not in adding]
        n = c.config.brokers
        spare = [b for b in range(n) if b not in origin]
        shapes = ["reorder"] + (["add"] if spare else []) + (
            ["remove"] if len(origin) > 2 else []) + (["replace"] if spare else [])
        if forced:
            # A move that copies data: onto a spare broker, or (none spare) make one first.
            shapes = [k for k in shapes if k in ("add", "replace")] or ["remove"]
            if shapes == ["remove"]:
                self._later(300, 1500, self._forced_reassign)
        shape = self.rng.choice(shapes)
        target = list(origin)
        if shape == "add":
            target.append(self.rng.choice(spare))
        elif shape == "remove":
            target.remove(self.rng.choice(target))
        elif shape == "replace":
            target[self.rng.randrange(len(target))] = self.rng.choice(spare)
        else:
            self.rng.shuffle(target)
        result = ctl.reassign({tp: target})
        error = None if result is None else result[tp].code
        self._note("reassign", str(tp), shape, tuple(target), ("error", error))
        if tp in c.moving and (forced or self.rng.random() < 0.7):
            self._later(20, 800, self._mid_move, tp)

    def _mid_move(self, tp: TopicPartition) -> None:
        """A fault aimed at a move in progress."""
        c = self.cluster
        c.sync_topic()
        if not self.active or tp not in c.moving:
            return
        adding, removing = c.moving[tp]
        aim = self.rng.choice(("new", "old", "controller", "cancel"))
        if aim == "controller":
            self._controller()
        elif aim == "cancel":
            self._cancel(tp)
        else:
            pool = [b for b in (adding if aim == "new" else removing)
                    if c.nodes[b].running and not c.nodes[b].paused and b not in self._stopping]
            if pool and self._down_count() < self._down_limit():
                self._crash_broker(self.rng.choice(pool))

    def _cancel(self, tp: TopicPartition) -> None:
        c = self.cluster
        ctl = c.controller
        if ctl is not None:
            s = c.zk_state(tp)
            adding_in_sync = len(set(c.moving.get(tp, ((), ()))[0]) & set(s.isr if s else ()))
            result = ctl.reassign({tp: None})
            if adding_in_sync and result is not None and result[tp].code == 0:
                # The revert deletes them: records acked with them in the ISR lost a copy.
                self._deleted_in_sync[tp] = self._deleted_in_sync.get(tp, 0) + adding_in_sync
            self._note("reassign", str(tp), "cancel",
                       ("error", None if result is None else result[tp].code))

    def _add_partitions(self) -> None:
        c = self.cluster
        if self._added_partitions >= self.max_added_partitions:
            return
        topic = c.config.topic
        zk = c.zk
        c.sync_topic()
        if c.moving:
            self._note("add_partitions", "refused: a move is in progress")
            return
        parts = zk.get_topic_assignment(topic) or {}
        p = max(parts) + 1 if parts else 0
        n = c.config.brokers
        rf = min(c.config.replication_factor, n)
        parts[p] = [(p + i) % n for i in range(rf)]
        # An admin's write (AdminZkClient.createPartitions): no controller epoch.
        zk.set_topic_assignment(topic, parts)
        self._added_partitions += 1
        self._note("add_partitions", ("partition", p), tuple(parts[p]))

    def _elect(self) -> None:
        c = self.cluster
        ctl = c.controller
        if ctl is None or not ctl.active:
            return
        unclean = (c.config.replication.unclean_leader_election_enable
                   and self.rng.random() < 0.5)
        tps = [self.rng.choice(c.tps)] if unclean else list(c.tps)
        result = ctl.elect_leaders(tps, ELECTION_UNCLEAN if unclean else ELECTION_PREFERRED)
        self._note("elect", "unclean" if unclean else "preferred",
                   tuple(sorted((str(tp), r[0], r[2]) for tp, r in (result or {}).items())))

    def _alter_log_dirs(self) -> None:
        c = self.cluster
        picks: list[tuple[SimBroker, TopicPartition, list[str]]] = []
        for n in c.nodes:
            if not n.running or n.paused or n.rm is None or n.broker_id in self._stopping:
                continue
            lm, moving = n.log_manager, n.rm.alter_log_dirs_manager.moving
            live = [d for d in lm.live_log_dirs if d not in n.failed_dirs]
            for tp in sorted(n.rm.core.partitions):
                current = lm.log_dir_of.get(tp)
                others = [d for d in live if d != current]
                if current is not None and others and tp not in moving:
                    picks.append((n, tp, others))
        if not picks:
            return
        node, tp, others = self.rng.choice(picks)
        dest = self.rng.choice(others)
        assert node.rm is not None
        # Kafka's ReplicaManager.alterReplicaLogDirs, the shell's (the partition is known).
        result = node.rm.alter_log_dirs_manager.alter_replica_log_dirs({tp: dest},
                                                                       lambda _tp: True)
        code = int(result[tp])
        self._note("alter_log_dirs", ("broker", node.broker_id), str(tp), ("dir", dest),
                   ("error", code))
        if code == 0 and self.rng.random() < 1 / 3:
            self._later(1, 20, self.crash_aimed, node.broker_id, "alter_log_dirs")

    def _burst(self) -> None:
        producers = [p for p in self.cluster.producers]
        if not producers:
            return
        p = self.rng.choice(producers)
        n = self.rng.randint(10, 60)
        self._note("burst", ("records", n))
        p.produce(n)
