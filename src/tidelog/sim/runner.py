"""Random runs: a seed in, a summary out.

`run_seed(seed, steps)` builds a cluster from the seed, runs producers (acks=all and acks=1) and
a consumer per partition while the seed's faults play, for `steps` scheduler events; then it
heals everything, lets the cluster settle and runs the end-of-run checks. One seed in
`TXN_SEED_EVERY` also runs transactions (sim/txn_workload.py): two transactional ids, a
read_committed consumer per partition, restarted producer instances fencing their zombies (and
now and then a zombie's late produce); one transactional seed in four (a draw from the seed,
`runs_txn_verification`) turns KIP-890's transaction.partition.verification.enable off, giving
up the exactly-once invariants a late produce can break then (`VERIFICATION_OFF_ALLOWED`). One
in `JBOD_SEED_EVERY` gives each broker two log dirs, transactional seeds too. The invariants are
checked after every event throughout. Same seed, same run: `RunSummary.trace_digest` is the hash
of the whole trace.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from tidelog.sim.cluster import SimCluster, SimConfig
from tidelog.sim.faults import DEFAULT_FAULTS, FaultInjector
from tidelog.sim.invariants import Violation
from tidelog.sim.trace import format_entry


@dataclass(slots=True)
class RunSummary:
    seed: int
    events: int = 0
    virtual_ms: int = 0
    elections: int = 0
    unclean_elections: int = 0
    # Checks where a zombie leader's HW stood above a member that follows an unclean election
    # (ValidHighWatermark's exemption, sim/invariants.py).
    zombie_hw_exemptions: int = 0
    isr_shrinks: int = 0
    isr_expands: int = 0
    acked: int = 0  # acks=all
    committed: int = 0  # transactions whose commit was answered
    aborted: int = 0  # transactions whose abort was answered
    # transaction.partition.verification.enable in a transactional run (None: no transactions)
    txn_verification: bool | None = None
    late_produces: int = 0  # zombies' late produces sent (sim/txn_workload.py)
    late_appended: int = 0  # of those, appended (error NONE)
    log_dirs: int = 1  # per broker
    acked_leader_only: int = 0  # acks=1
    consumed: int = 0
    lost: int = 0  # acks=all writes missing at the end
    faults: dict[str, int] = field(default_factory=dict)
    violations: list[Violation] = field(default_factory=list)
    event_violations: int = 0  # of those, found by the per-event checks (not the end checks)
    converged: bool = False
    offline: int = 0  # partitions left offline by KIP-966's rule (unavailable, not unsafe)
    trace_digest: str = ""
    wall_s: float = 0.0
    trace_tail: list[str] = field(default_factory=list)
    # Invariants this run's configuration gives up (e.g. NoAckedLoss under unclean election).
    allowed: tuple[str, ...] = ()
    # The `tidelog sim` options a replay needs beyond the seed and steps (--unclean, ...).
    replay_args: str = ""

    @property
    def ok(self) -> bool:
        return self.converged and not any(v.invariant not in self.allowed
                                          for v in self.violations)

    @property
    def events_per_s(self) -> float:
        return self.events / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def setup(self) -> str:
        """What the seed drew besides its faults, where a replay must match it: transactions
        with KIP-890's verification on or off, two log dirs."""
        parts = []
        if self.txn_verification is not None:
            parts.append("transactions, transaction.partition.verification.enable="
                         + ("true" if self.txn_verification else "false"))
        if self.log_dirs > 1:
            parts.append(f"{self.log_dirs} log dirs")
        return ", ".join(parts)

    def report(self) -> str:
        setup = f" ({self.setup})" if self.setup else ""
        lines = [f"seed {self.seed}{setup}: {len(self.violations)} violation(s), converged="
                 f"{self.converged}; replay with: tidelog sim --seed {self.seed} "
                 f"--steps <same steps>{self.replay_args}"]
        lines += [f"  {v}" for v in self.violations[:20]]
        if self.trace_tail:
            lines.append("  last trace entries:")
            lines += [f"    {line}" for line in self.trace_tail]
        return "\n".join(lines)


def _naive(rule: str) -> SimConfig:
    base = SimConfig()
    rep = base.replication
    if rule == "truncate_to_hw":
        return replace(base, replication=rep.with_(truncate_to_hw=True))
    if rule == "no_epoch_fencing":
        return replace(base, replication=rep.with_(fence_leader_epochs=False))
    if rule == "committed_isr_hw":
        return replace(base, replication=rep.with_(maximal_isr=False))
    if rule == "no_eligibility":
        return replace(base, kip841_eligibility=False)
    if rule == "reelect_unclean":
        return replace(base, kip966_unclean_restart_rule=False,
                       replication=rep.with_(hw_requires_min_isr=False))
    raise ValueError(f"unknown naive rule {rule!r}; one of {', '.join(NAIVE_RULES)}")


# The rules the fixes replaced, for random runs that show the simulator finds their bugs
# unscripted (`tidelog sim --naive-rule truncate_to_hw --seeds 50`).
NAIVE_RULES = ("truncate_to_hw", "no_epoch_fencing", "committed_isr_hw", "no_eligibility",
               "reelect_unclean")


# What unclean leader election gives up by design: acked (and consumed) data may be lost.
UNCLEAN_ALLOWED = ("NoAckedLoss", "ConsumedStable", "AckedConsumed")


def unclean_config(base: SimConfig | None = None) -> SimConfig:
    """Unclean election on and min.insync.replicas=1: acked data may be lost (allowed), but the
    per-event invariants must hold and every replica must still converge (truncation after
    divergent histories, out-of-range fetches)."""
    base = base or SimConfig()
    return replace(base, replication=base.replication.with_(unclean_leader_election_enable=True),
                   log_properties={**base.log_properties, "min.insync.replicas": 1})


def naive_config(rule: str) -> SimConfig:
    """The default random-run configuration with one naive rule switched on."""
    return _naive(rule)


def varied_config(seed: int, base: SimConfig | None = None) -> SimConfig:
    """`base` with timing knobs drawn from the seed (lag time, session timeout, fetch wait,
    link latency, checkpoint and page-cache intervals): safe to vary without touching
    NoAckedLoss's precondition (min.insync.replicas and acks stay as they are)."""
    rng = random.Random(seed * 7919 + 17)
    base = base or SimConfig()
    lag_ms = rng.choice((300, 1000, 3000))
    rep = base.replication.with_(
        replica_lag_time_max_ms=lag_ms,
        # At most the lag time, as the broker's config requires (KafkaConfig): a caught-up
        # follower's fetch waiting longer drops it from an idle partition's ISR, again and again.
        replica_fetch_wait_max_ms=min(rng.choice((10, 100, 500)), lag_ms),
        replica_fetch_backoff_ms=rng.choice((20, 100, 500)))
    link = replace(base.link, min_delay_ms=1, max_delay_ms=rng.choice((1, 3, 10, 30)))
    return replace(base, replication=rep, link=link,
                   session_timeout_ms=rng.choice((800, 1500, 4000)),
                   hw_checkpoint_ms=rng.choice((100, 500, 5000)),
                   os_flush_ms=rng.choice((50, 1000, 30_000)))


def build_cluster(seed: int, *, brokers: int = 3, partitions: int = 1,
                  config: SimConfig | None = None, trace: bool = True) -> SimCluster:
    base = config or SimConfig()
    cfg = replace(base, seed=seed, brokers=brokers, partitions=partitions, trace=trace,
                  replication_factor=min(base.replication_factor, brokers))
    if int(cfg.log_properties.get("min.insync.replicas", 1)) > cfg.replication_factor:
        cfg = replace(cfg, log_properties={**cfg.log_properties,
                                           "min.insync.replicas": cfg.replication_factor})
    return SimCluster(cfg)


# Seeds with seed % TXN_SEED_EVERY == TXN_SEED_EVERY - 1 run transactions too.
TXN_SEED_EVERY = 4


# Seeds with seed % JBOD_SEED_EVERY == 1 run with two log dirs per broker (when no configuration
# is given): a failed dir takes only its replicas offline, and replicas move between dirs.
JBOD_SEED_EVERY = 3


def runs_jbod(seed: int, config: SimConfig | None) -> bool:
    return config is None and seed % JBOD_SEED_EVERY == 1


# What a transactional run with KIP-890's verification off gives up: a zombie's late produce may
# open a transaction no coordinator ends (the LSO held: TransactionsDecided), or one a later
# marker of its producer id commits (NoAbortedRead, and the counts of CommittedExactlyOnce /
# AtomicVisibility where it lands inside another transaction).
VERIFICATION_OFF_ALLOWED = ("NoAbortedRead", "TransactionsDecided", "CommittedExactlyOnce",
                            "AtomicVisibility")


def runs_txn_verification(seed: int) -> bool:
    """The seed's transaction.partition.verification.enable: off in one transactional seed
    in four (a draw of its own, independent of which seeds run transactions or two dirs)."""
    return random.Random(f"transaction.partition.verification.enable {seed}").random() >= 0.25


def runs_transactions(seed: int, config: SimConfig | None) -> bool:
    """The default share of seeds with transactions; never under unclean election, which may
    lose acknowledged `__transaction_state` records by design."""
    unclean = config is not None and config.replication.unclean_leader_election_enable
    return seed % TXN_SEED_EVERY == TXN_SEED_EVERY - 1 and not unclean


def run_seed(seed: int, steps: int = 2000, *, brokers: int = 3, partitions: int = 1,
             faults: Iterable[str] = DEFAULT_FAULTS, produce_interval_ms: int = 25,
             settle_ms: int = 60_000, config: SimConfig | None = None, trace: bool = True,
             tail: int = 60, full_trace: bool = False,
             allowed: tuple[str, ...] = (), transactions: bool | None = None,
             txn_verification: bool | None = None) -> RunSummary:
    """`transactions`: None for the seed's default (`runs_transactions`); `txn_verification`
    (transaction.partition.verification.enable): None for the seed's (`runs_txn_verification`)."""
    t0 = time.perf_counter()
    replay = []
    if config is not None and config.replication.unclean_leader_election_enable:
        replay.append("--unclean")
    if transactions is None:
        transactions = runs_transactions(seed, config)
    elif transactions != runs_transactions(seed, config):
        replay.append("--transactions" if transactions else "--no-transactions")
    if runs_jbod(seed, config):
        config = SimConfig(log_dirs_per_broker=2)
    verification = None
    if transactions:
        verification = runs_txn_verification(seed) if txn_verification is None \
            else txn_verification
        config = replace(config or SimConfig(), transactions=True,
                         transaction_partition_verification_enable=verification)
        if not verification:
            allowed = (*allowed, *VERIFICATION_OFF_ALLOWED)
    if full_trace:
        config = replace(config or SimConfig(), trace_limit=None)
    cluster = build_cluster(seed, brokers=brokers, partitions=partitions, config=config,
                            trace=trace)
    if verification is not None:
        cluster.trace_add(("transaction.partition.verification.enable", None, verification))
    cluster.start()
    rng = cluster.rng
    for tp in cluster.tps:
        cluster.add_producer(tp, -1)
        cluster.add_producer(tp, 1)
        cluster.add_consumer(tp)
    producing = [True]

    def produce_loop(p: Any) -> None:
        if not producing[0]:
            return
        p.produce(1)
        cluster.scheduler.schedule(max(1, int(rng.expovariate(1 / produce_interval_ms))),
                                   produce_loop, p)

    for p in cluster.producers:
        cluster.scheduler.schedule(200 + rng.randint(0, produce_interval_ms), produce_loop, p)
    txn = cluster.txn
    if txn is not None:
        txn.start()
        txn.restart_every(4000)
    injector = FaultInjector(cluster, faults)
    injector.start(500)
    if txn is not None:
        txn.injector = injector
    cluster.run_events(steps)
    injector.stop()
    producing[0] = False
    cluster.heal()
    converged = cluster.settle(settle_ms)
    txn_final: list[Violation] = []
    if txn is not None:
        # Every transaction decided and read; the markers written meanwhile replicated.
        txn_final = txn.finish()
        converged = cluster.settle(settle_ms)
    # Let consumers read up to the final HW before comparing (bounded).
    cluster.drain_consumers()
    final = cluster.final_checks() + txn_final
    if txn_verification is not None and transactions and \
            txn_verification != runs_txn_verification(seed):
        replay.append("--txn-verification " + ("on" if txn_verification else "off"))
    summary = RunSummary(seed=seed, allowed=allowed,
                         replay_args="".join(f" {a}" for a in replay))
    summary.events = cluster.scheduler.events_run
    summary.virtual_ms = cluster.scheduler.now_ms
    ctl = cluster.controller
    if ctl is not None:
        summary.elections = ctl.stats.elections
        summary.unclean_elections = ctl.stats.unclean_elections
    summary.isr_shrinks = sum(n.stats.isr_shrinks for n in cluster.nodes)
    summary.isr_expands = sum(n.stats.isr_expands for n in cluster.nodes)
    summary.acked = sum(len(p.acked) for p in cluster.producers if p.acks == -1)
    summary.acked_leader_only = sum(len(p.acked) for p in cluster.producers if p.acks == 1)
    if txn is not None:
        summary.committed = len(txn.ledger.committed)
        summary.aborted = len(txn.ledger.aborted) - txn.late_produces
        summary.txn_verification = verification
        summary.late_produces = txn.late_produces
        summary.late_appended = txn.late_answers.get(0, 0)
    summary.log_dirs = cluster.config.log_dirs_per_broker
    summary.consumed = sum(len(c.consumed) for c in cluster.consumers)
    summary.lost = sum(1 for v in final if v.invariant == "NoAckedLoss")
    summary.faults = dict(injector.stats.injected)
    summary.violations = list(cluster.checker.violations) + final
    summary.event_violations = len(cluster.checker.violations)
    summary.zombie_hw_exemptions = cluster.checker.zombie_hw_exemptions
    summary.converged = converged
    summary.offline = sum(1 for tp in cluster.tps if cluster.offline_by_kip966(tp))
    summary.trace_digest = cluster.trace.digest()
    summary.wall_s = time.perf_counter() - t0
    if full_trace:
        summary.trace_tail = cluster.trace.lines()
    elif not summary.ok:
        # Appends are most of the trace; the tail shows the protocol events around the failure.
        entries = [e for e in cluster.trace.entries if e[1] != "append"]
        summary.trace_tail = [format_entry(e) for e in entries[-tail:]]
    return summary
