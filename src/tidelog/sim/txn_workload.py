"""Transactions in a simulated cluster (`SimConfig.transactions`): the `__transaction_state`
topic, transactional producers and read_committed consumers, the ledger that checks them
(sim/txn_invariants.py) and the end of a run.

The topic is created with the cluster (Kafka creates it at the first FindCoordinator) with
`transaction.state.log.num.partitions` partitions, replication factor 3 and
min.insync.replicas 2, and is never moved. Each broker process hosts the coordinator of the
partitions it leads (sim/txn_node.py). Producer ids come from one counter for the cluster, as
ZooKeeper's producer-id blocks hand out ids no other broker hands out.

Workload: `producers_per_run` transactional ids, each writing transactions over the data
partitions (commit or abort at random, some left open past their timeout), a read_committed
consumer per data partition; `restart` starts a new instance of an id while the old one runs
on as a zombie (fenced by the new instance's InitProducerId); in `late_share` of the restarts a
batch the zombie sent earlier reaches its partition's leader only after the new instance got its
epoch (a produce request held in the network: same producer id, the zombie's epoch and next
sequence), right after. With KIP-890 verification the leader asks the coordinator, which knows the newer
epoch, and refuses it; without, the leader (whose log may not have seen the newer epoch) appends
it as the first batch of a transaction no coordinator knows: it hangs, holding the LSO, until a
marker of that producer id lands there, which may commit it (the ledger counts the batch as
given up: reading it is a NoAbortedRead). At the end, `finish` lets every
transaction be decided (the producers stop beginning new ones; the coordinators complete or
time out the rest) and the consumers read to the last stable offset, then the ledger's end
checks run.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from tidelog.coordinator.offsets import partition_for
from tidelog.coordinator.transaction.log import TRANSACTION_STATE_TOPIC_NAME
from tidelog.coordinator.transaction.state_manager import TransactionConfig
from tidelog.protocol.records.builder import build_values
from tidelog.replication.types import TopicPartition
from tidelog.sim.client import TxnConsumer, TxnProducer
from tidelog.sim.invariants import Violation
from tidelog.sim.messages import CLIENT_BASE, ProduceRequest, ProduceResponse
from tidelog.sim.tasks import SimFuture
from tidelog.sim.txn_invariants import TxnLedger

if TYPE_CHECKING:  # pragma: no cover
    from tidelog.sim.cluster import SimCluster
    from tidelog.sim.faults import FaultInjector

__all__ = ["TxnWorkload"]

_NODE_BASE = CLIENT_BASE + 5000
_FIRST_PRODUCER_ID = 100_000


class TxnWorkload:
    def __init__(self, cluster: SimCluster, num_partitions: int = 2,
                 transaction_timeout_ms: int = 3000) -> None:
        self.cluster = cluster
        cfg = cluster.config
        self.config = TransactionConfig(
            num_partitions=num_partitions, replication_factor=min(3, cfg.brokers),
            min_isr=min(2, cfg.brokers), max_timeout_ms=60_000,
            abort_timed_out_interval_ms=1000, request_timeout_ms=cfg.request_timeout_ms)
        self.transaction_timeout_ms = transaction_timeout_ms
        self.state_tps = [TopicPartition(TRANSACTION_STATE_TOPIC_NAME, p)
                          for p in range(num_partitions)]
        self.rng = random.Random(cluster.rng.getrandbits(64))
        self.ledger = TxnLedger()
        self.ledger.report = self._report
        self.producers: list[TxnProducer] = []
        self.current: dict[str, TxnProducer] = {}  # transactional id -> its newest instance
        self.consumers: list[TxnConsumer] = []
        self._next_pid = _FIRST_PRODUCER_ID
        self._nodes = 0
        self.running = False
        # Crashes aimed at a coordinator completing a transaction (the run's fault injector).
        self.injector: FaultInjector | None = None
        self.aim_share = 0.1
        # Restarts followed by a late produce of the zombie; their answers by error code.
        self.late_share = 0.5
        self.late_produces = 0
        self.late_answers: dict[int, int] = {}
        self._late_node: int | None = None

    def assignments(self) -> dict[TopicPartition, tuple[int, ...]]:
        n = self.cluster.config.brokers
        rf = self.config.replication_factor
        return {tp: tuple((tp.partition + 1 + i) % n for i in range(rf))
                for tp in self.state_tps}

    def _report(self, v: Violation) -> None:
        self.cluster.checker.fail(v.invariant, v.tp, v.detail)

    # -- what the brokers ask --------------------------------------------------------------
    def generate_producer_id(self) -> SimFuture:
        self._next_pid += 1
        fut = SimFuture()
        fut.set_result(self._next_pid)
        return fut

    def coordinator_of(self, transactional_id: str) -> int:
        """FindCoordinator: the leader of the id's `__transaction_state` partition."""
        tp = TopicPartition(TRANSACTION_STATE_TOPIC_NAME,
                            partition_for(transactional_id, self.config.num_partitions))
        return self.cluster.leader_of(tp)[0]

    # -- clients -----------------------------------------------------------------------------
    def _node_id(self) -> int:
        self._nodes += 1
        return _NODE_BASE + self._nodes

    def add_producer(self, transactional_id: str) -> TxnProducer:
        c = self.cluster
        # `c.tps` itself: partitions added during the run (CreatePartitions) are written too.
        p = TxnProducer(self._node_id(), transactional_id, c.tps, c.scheduler, c.network,
                        c.leader_of, self.coordinator_of, self.ledger,
                        random.Random(self.rng.getrandbits(64)),
                        transaction_timeout_ms=self.transaction_timeout_ms,
                        request_timeout_ms=c.config.request_timeout_ms,
                        on_fenced=self._on_fenced, on_end=self._on_end)
        self.producers.append(p)
        self.current[transactional_id] = p
        if self.running:
            p.start()
        return p

    def add_consumer(self, tp: TopicPartition, ledger: TxnLedger | None = None) -> TxnConsumer:
        c = self.cluster
        cons = TxnConsumer(self._node_id(), tp, c.scheduler, c.network, c.leader_of,
                           ledger or self.ledger)
        if ledger is None:
            self.consumers.append(cons)
        cons.start()
        return cons

    def start(self, producers: int = 2) -> None:
        self.running = True
        self._cover_partitions()
        for i in range(producers):
            self.add_producer(f"txn-{i}")

    def _cover_partitions(self) -> None:
        """A read_committed consumer for every data partition, also those added later."""
        covered = {c.tp for c in self.consumers}
        for tp in self.cluster.tps:
            if tp not in covered:
                self.add_consumer(tp)
        self.cluster.scheduler.schedule(500, self._cover_partitions)

    def restart(self) -> TxnProducer | None:
        """A new instance of a random id; the old one runs on until it is fenced."""
        if not self.running or not self.current:
            return None
        txn_id = self.rng.choice(sorted(self.current))
        self.cluster.trace_add(("txn_producer_restart", None, txn_id))
        zombie = self.current[txn_id]
        fresh = self.add_producer(txn_id)
        if self.rng.random() < self.late_share:
            self._late_produce(zombie, fresh, 1000)
        return fresh

    def _late_produce(self, zombie: TxnProducer, fresh: TxnProducer, tries: int) -> None:
        """Once `fresh` has an epoch newer than `zombie`'s (checked every 5 ms, `tries`
        times), a batch of the zombie is sent to a partition's leader 0-20 ms later (before
        the new instance's first write there, mostly)."""
        if zombie.producer_epoch < 0 or tries <= 0:
            return
        if fresh.producer_id != zombie.producer_id or fresh.producer_epoch <= \
                zombie.producer_epoch:
            self.cluster.scheduler.schedule(5, self._late_produce, zombie, fresh, tries - 1)
            return
        tp = self.rng.choice(self.cluster.tps)
        count = self.rng.randint(1, 2)
        txn = (zombie.transactional_id, self.ledger.next_number(zombie.transactional_id))
        records = bytes(build_values(
            [self.ledger.value(txn, i, count) for i in range(count)],
            now_ms=self.cluster.scheduler.now_ms, producer_id=zombie.producer_id,
            producer_epoch=zombie.producer_epoch, base_sequence=zombie.next_sequence(tp),
            transactional=True))
        self.ledger.given_up(txn, tp, count)
        self.cluster.scheduler.schedule(self.rng.randint(0, 20), self._send_late, txn, tp,
                                        records, zombie.producer_epoch)

    def _send_late(self, txn: tuple[str, int], tp: TopicPartition, records: bytes,
                   epoch: int) -> None:
        c = self.cluster
        if self._late_node is None:
            self._late_node = self._node_id()
            c.network.register(self._late_node, self._late_answer)
        leader, _ = c.leader_of(tp)
        self.late_produces += 1
        c.trace_add(("txn_late_produce", str(tp), txn[0], ("txn", txn[1]), ("epoch", epoch),
                     ("leader", leader)))
        if leader >= 0:
            c.network.send(self._late_node, leader, ProduceRequest(
                self.late_produces, -1, c.config.request_timeout_ms, tp, records, txn[0]))

    def _late_answer(self, src: int, msg: object) -> None:
        if isinstance(msg, ProduceResponse):
            self.late_answers[msg.error] = self.late_answers.get(msg.error, 0) + 1
            self.cluster.trace_add(("txn_late_produce_answer", str(msg.tp),
                                    ("error", msg.error), ("offset", msg.base_offset)))

    def restart_every(self, mean_ms: int) -> None:
        """Restart a random id's producer at exponential intervals of mean `mean_ms` while
        the workload runs."""
        def tick() -> None:
            if self.running:
                self.restart()
                schedule()

        def schedule() -> None:
            self.cluster.scheduler.schedule(max(1, int(self.rng.expovariate(1 / mean_ms))),
                                            tick)

        schedule()

    def _on_end(self, p: TxnProducer) -> None:
        """EndTxn sent: now and then the coordinator crashes a few ms later, often between
        its PrepareCommit/PrepareAbort and the markers (the successor completes it)."""
        if self.injector is not None and self.rng.random() < self.aim_share:
            coordinator = self.coordinator_of(p.transactional_id)
            if coordinator >= 0:
                self.cluster.scheduler.schedule(self.rng.randint(1, 8), self.injector.crash_aimed,
                                                coordinator, "txn_coordinator")

    def _on_fenced(self, p: TxnProducer) -> None:
        # The application restarts a fenced producer that is still the id's newest instance
        # (fenced by the coordinator's timeout abort); a zombie just ends.
        if self.running and self.current.get(p.transactional_id) is p:
            self.add_producer(p.transactional_id)

    # -- end of run --------------------------------------------------------------------------
    def stop(self) -> None:
        self.running = False
        for p in self.producers:
            p.stop()

    def read_to_end(self, tp: TopicPartition, consumers: list[TxnConsumer] | None = None
                    ) -> bool:
        """`tp`'s LSO is at its HW (every transaction there decided and its marker
        replicated) and its consumers read up to it."""
        leader = self.cluster.acting_leader(tp)
        if leader is None:
            return False
        part = leader.partition(tp)
        lso = part.last_stable_offset
        readers = [c for c in (self.consumers if consumers is None else consumers)
                   if c.tp == tp]
        return lso == part.high_watermark and bool(readers) and all(
            c.position >= lso for c in readers)

    def decided(self) -> bool:
        """No producer mid-transaction, every data partition read to its end."""
        return not any(p.busy for p in self.producers) and all(
            self.read_to_end(tp) for tp in self.cluster.tps)

    def unavailable(self) -> bool:
        """A partition (data or `__transaction_state`) left offline by KIP-966's rule: the
        transactions it holds or coordinates may stay open (unavailable, not unsafe)."""
        return any(self.cluster.offline_by_kip966(tp) for tp in (*self.state_tps,
                                                                  *self.cluster.tps))

    def finish(self, max_ms: int = 30_000, step_ms: int = 200) -> list[Violation]:
        """Stop the producers, wait (bounded) until every transaction is decided and read, then
        the ledger's end checks over the partitions read to their end. Transactions still open
        are a violation unless a partition is offline by KIP-966's rule."""
        self.stop()
        waited = 0
        while not self.decided() and waited < max_ms and not (
                waited >= 5000 and self.unavailable()):
            self.cluster.run_for(step_ms)
            waited += step_ms
        now = self.cluster.scheduler.now_ms
        out: list[Violation] = []
        if not self.decided() and not self.unavailable():
            open_ = [p.transactional_id for p in self.producers if p.busy]
            unread = [str(tp) for tp in self.cluster.tps if not self.read_to_end(tp)]
            out.append(Violation(now, "TransactionsDecided", None,
                                 f"after {waited} ms: producers mid-transaction {open_}, "
                                 f"partitions not read to their end {unread}"))
        ends = [tp for tp in self.cluster.tps if self.read_to_end(tp)]
        out += self.ledger.final_checks(ends, now)
        return out + self._read_final_logs(ends, max_ms)

    def _read_final_logs(self, tps: list[TopicPartition], max_ms: int,
                         step_ms: int = 100) -> list[Violation]:
        """The same checks for new read_committed readers of the final logs, from offset 0:
        what the logs hold after every crash, truncation and leader change (a reader during
        the run may have read records a truncation later took back)."""
        ledger = self.ledger.fresh_reader()
        readers = [self.add_consumer(tp, ledger) for tp in tps]
        waited = 0
        while not all(self.read_to_end(tp, readers) for tp in tps) and waited < max_ms:
            self.cluster.run_for(step_ms)
            waited += step_ms
        for r in readers:
            r.running = False
        now = self.cluster.scheduler.now_ms
        done = [tp for tp in tps if self.read_to_end(tp, readers)]
        out = [Violation(now, "TransactionsDecided", tp, "a reader of the final log did not "
                         "reach its LSO") for tp in tps if tp not in done]
        return out + ledger.final_checks(done, now)
