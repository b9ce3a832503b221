"""Simulated clients: idempotent producers (acks=all / acks=1) that retry, and consumers that
record what was acked and what was read.

Every produced batch holds one record with a unique value, so its CRC32C (which covers neither
the base offset nor the partition leader epoch the leader stamps) identifies it in any replica's
log. A producer records `acked[crc] = offset`; a consumer records `(offset, crc)` for every batch
it reads. The end-of-run checks compare both with the replicas' logs (NoAckedLoss; consumed data
never changes) and look for duplicates and out-of-order sequences (sim/producer_invariants.py).
Clients find leaders as a metadata request would: from the partition state in (simulated)
ZooKeeper.

An idempotent producer behaves as Kafka's (`enable.idempotence=true`): its producer id is its
client id (unique in the cluster, as the ids InitProducerId hands out), each batch carries the
next sequence number, at most five batches are in flight, and a batch refused with a retriable
error (NOT_LEADER_OR_FOLLOWER, NOT_ENOUGH_REPLICAS, timeouts...) or with
OUT_OF_ORDER_SEQUENCE_NUMBER while an earlier batch is unresolved is sent again, with the same
sequence, after `retry_backoff_ms`, in sequence order. OUT_OF_ORDER_SEQUENCE_NUMBER for the batch
right after the last acknowledged one means the partition lost acknowledged data (acks=1 after a
leader change), and a batch still unacknowledged after `delivery_timeout_ms` has an unknown fate:
either way the producer bumps its epoch and restarts its sequences at 0, as Kafka's does since
KIP-360 (a simulated InitProducerId with the current epoch): the batches already sent and
unresolved fail (they may or may not be in the log), the ones never sent are renumbered. A
non-idempotent producer (`idempotent=False`) sends each batch once and never retries: an unacked
write may or may not be in the log, and that is allowed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tidelog.protocol.records.batch import iter_batches
from tidelog.protocol.records.builder import build_values
from tidelog.replication.types import TopicPartition
from tidelog.sim.clock import Scheduler, Timer
from tidelog.sim.messages import (
    ConsumerFetchRequest,
    ConsumerFetchResponse,
    ProduceRequest,
    ProduceResponse,
)
from tidelog.sim.network import Network
from tidelog.sim.txn_invariants import read_committed
from tidelog.sim.txn_node import TxnRequest, TxnResponse

LeaderLookup = Callable[[TopicPartition], tuple[int, int]]  # -> (leader, leader epoch)

# Kafka's retriable produce errors: UNKNOWN_TOPIC_OR_PARTITION, LEADER_NOT_AVAILABLE,
# NOT_LEADER_OR_FOLLOWER, REQUEST_TIMED_OUT, NOT_ENOUGH_REPLICAS(_AFTER_APPEND),
# KAFKA_STORAGE_ERROR, FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH.
RETRIABLE_ERRORS = frozenset({3, 5, 6, 7, 19, 20, 56, 74, 75})
OUT_OF_ORDER_SEQUENCE_NUMBER = 45
_SEQUENCE_WRAP = 2**31


@dataclass(slots=True)
class ClientStats:
    sent: int = 0
    acked: int = 0
    errors: int = 0
    timeouts: int = 0
    fetched_batches: int = 0
    retries: int = 0
    failed: int = 0  # batches given up (non-retriable error, or an epoch bump)
    epoch_bumps: int = 0


@dataclass(slots=True)
class _Batch:
    value: bytes
    created_ms: int
    seq: int = -1
    epoch: int = -1
    data: bytes = b""
    crc: int = 0
    corr: int = 0  # the attempt in flight (0: none)
    timer: Timer | None = None
    sent: bool = False  # sent at least once: once unresolved, its fate is unknown
    retry_at: int = 0


class Producer:
    def __init__(self, node_id: int, tp: TopicPartition, acks: int, scheduler: Scheduler,
                 network: Network, leader_of: LeaderLookup, *, timeout_ms: int = 1500,
                 idempotent: bool = True, max_in_flight: int = 5, retry_backoff_ms: int = 100,
                 delivery_timeout_ms: int = 30_000) -> None:
        self.node_id = node_id
        self.tp = tp
        self.acks = acks
        self.scheduler = scheduler
        self.network = network
        self.leader_of = leader_of
        self.timeout_ms = timeout_ms
        self.idempotent = idempotent
        self.max_in_flight = max_in_flight if idempotent else 1 << 30
        self.retry_backoff_ms = retry_backoff_ms
        self.delivery_timeout_ms = delivery_timeout_ms
        self.producer_id = node_id if idempotent else -1
        self.producer_epoch = 0 if idempotent else -1
        self._next_seq = 0
        self._last_acked_seq = -1
        self._corr = 0
        self._values = 0
        self._queue: list[_Batch] = []  # unresolved batches, in sequence order
        self._by_corr: dict[int, _Batch] = {}
        self._drain_timer: Timer | None = None
        self.acked: dict[int, int] = {}  # batch crc -> offset (acks as configured)
        self.acked_at: dict[int, int] = {}  # batch crc -> virtual time of the ack
        self.error_codes: list[int] = []  # the error code of every refused attempt, in order
        # (crc, first offset, second offset): a batch acknowledged twice at different offsets
        self.double_acks: list[tuple[int, int, int]] = []
        self.stats = ClientStats()
        self.on_ack: Callable[[Producer, int, int], None] | None = None
        network.register(node_id, self.receive)

    @property
    def in_flight(self) -> int:
        """Batches not yet acknowledged or given up."""
        return len(self._queue)

    def produce(self, count: int = 1) -> None:
        now = self.scheduler.now_ms
        for _ in range(count):
            self._values += 1
            b = _Batch(b"c%d-%d" % (self.node_id, self._values), now)
            if self.idempotent:
                b.seq, b.epoch = self._next_seq, self.producer_epoch
                self._next_seq = (self._next_seq + 1) % _SEQUENCE_WRAP
            self._build(b)
            self.stats.sent += 1
            self._queue.append(b)
        self._drain()

    def _build(self, b: _Batch) -> None:
        b.data = bytes(build_values([b.value], now_ms=b.created_ms, producer_id=self.producer_id,
                                    producer_epoch=b.epoch, base_sequence=b.seq))
        b.crc = int.from_bytes(b.data[17:21], "big")

    def _drain(self) -> None:
        """Send the unsent batches in sequence order while fewer than `max_in_flight` are out;
        a batch waiting for its retry backoff holds back the ones after it."""
        queue = self._queue
        if not queue:
            return
        leader, _ = self.leader_of(self.tp)
        now = self.scheduler.now_ms
        in_flight = len(self._by_corr)
        for b in list(queue):
            if b.corr:
                continue
            if in_flight >= self.max_in_flight:
                return
            if leader < 0:
                if not self.idempotent:
                    self._give_up(b)  # as before: no leader, no retry
                    self.stats.errors += 1
                    continue
                self._drain_later(now + self.retry_backoff_ms)
                return
            if b.retry_at > now:
                self._drain_later(b.retry_at)
                return
            self._send(b, leader)
            in_flight += 1

    def _drain_later(self, at: int) -> None:
        t = self._drain_timer
        if t is not None and t.active and t.due_ms <= at:
            return
        if t is not None:
            t.cancel()
        self._drain_timer = self.scheduler.call_at(at, self._drain)

    def _send(self, b: _Batch, leader: int) -> None:
        self._corr += 1
        corr = self._corr
        if b.sent:
            self.stats.retries += 1
        b.corr, b.sent = corr, True
        b.timer = self.scheduler.schedule(self.timeout_ms + 200, self._timed_out, corr)
        self._by_corr[corr] = b
        self.network.send(self.node_id, leader, ProduceRequest(
            corr, self.acks, self.timeout_ms, self.tp, b.data))

    def _timed_out(self, corr: int) -> None:
        b = self._by_corr.pop(corr, None)
        if b is None:
            return
        b.corr = 0
        self.stats.timeouts += 1
        if self.idempotent:
            self._retry(b)
        else:
            self._give_up(b)
        self._drain()

    def receive(self, src: int, msg: object) -> None:
        if not isinstance(msg, ProduceResponse):
            return
        b = self._by_corr.pop(msg.corr_id, None)
        if b is None:
            return  # timed out already, or a duplicate
        b.corr = 0
        if b.timer is not None:
            b.timer.cancel()
        if msg.error == 0:
            self._acknowledged(b, msg.base_offset)
        else:
            self.stats.errors += 1
            self.error_codes.append(msg.error)
            if not self.idempotent:
                self._give_up(b)
            elif msg.error in RETRIABLE_ERRORS or (
                    msg.error == OUT_OF_ORDER_SEQUENCE_NUMBER
                    and b.seq != self._last_acked_seq + 1):
                # (an earlier batch is unresolved: this one may be in order once it lands)
                self._retry(b)
            elif msg.error == OUT_OF_ORDER_SEQUENCE_NUMBER:
                self._bump_epoch()  # acknowledged data is gone from the partition
            else:
                self._give_up(b)
        self._drain()

    def _acknowledged(self, b: _Batch, offset: int) -> None:
        self._queue.remove(b)
        earlier = self.acked.get(b.crc)
        if earlier is not None and earlier != offset:
            self.double_acks.append((b.crc, earlier, offset))
        self.acked[b.crc] = offset
        self.acked_at[b.crc] = self.scheduler.now_ms
        if b.epoch == self.producer_epoch and b.seq > self._last_acked_seq:
            self._last_acked_seq = b.seq
        self.stats.acked += 1
        if self.on_ack is not None:
            self.on_ack(self, b.crc, offset)

    def _retry(self, b: _Batch) -> None:
        now = self.scheduler.now_ms
        if now - b.created_ms >= self.delivery_timeout_ms:
            self._bump_epoch()  # delivery.timeout.ms: its fate stays unknown
            return
        b.retry_at = now + self.retry_backoff_ms

    def _give_up(self, b: _Batch) -> None:
        if b.corr:
            self._by_corr.pop(b.corr, None)
            b.corr = 0
        if b.timer is not None:
            b.timer.cancel()
        self._queue.remove(b)
        self.stats.failed += 1

    def _bump_epoch(self) -> None:
        """KIP-360: a new epoch from sequence 0. Batches already sent and unresolved fail
        (their late answers are ignored); those never sent are renumbered."""
        self.stats.epoch_bumps += 1
        self.producer_epoch += 1
        self._next_seq = 0
        self._last_acked_seq = -1
        for b in list(self._queue):
            if b.sent:
                self._give_up(b)
            else:
                b.seq, b.epoch = self._next_seq, self.producer_epoch
                self._next_seq += 1
                self._build(b)


class Consumer:
    """Fetches from the leader at its position, forever, recording (offset, crc) of each batch."""

    def __init__(self, node_id: int, tp: TopicPartition, scheduler: Scheduler, network: Network,
                 leader_of: LeaderLookup, *, poll_interval_ms: int = 20,
                 max_wait_ms: int = 50) -> None:
        self.node_id = node_id
        self.tp = tp
        self.scheduler = scheduler
        self.network = network
        self.leader_of = leader_of
        self.poll_interval_ms = poll_interval_ms
        self.max_wait_ms = max_wait_ms
        self.position = 0
        self.consumed: dict[int, int] = {}  # offset -> crc
        self.max_hw_seen = 0
        self.hw_regressions = 0  # HW lower than one seen before (across leader changes)
        self.offset_violations: list[tuple[int, int]] = []  # (previous position, offset read)
        self._corr = 0
        self._waiting: int | None = None
        self._deadline: Timer | None = None
        self.stats = ClientStats()
        self.running = False
        network.register(node_id, self.receive)

    def start(self) -> None:
        if not self.running:
            self.running = True
            self.scheduler.schedule(self.poll_interval_ms, self._poll)

    def _poll(self) -> None:
        if not self.running:
            return
        leader, epoch = self.leader_of(self.tp)
        self._corr += 1
        self._waiting = self._corr
        if leader >= 0:
            self.network.send(self.node_id, leader, self._fetch_request(self._corr, epoch))
        # Whatever happens to the request, poll again after a bounded wait.
        self._deadline = self.scheduler.schedule(self.max_wait_ms + 100, self._expire, self._corr)

    def _fetch_request(self, corr: int, leader_epoch: int) -> object:
        return ConsumerFetchRequest(corr, self.tp, self.position, leader_epoch, self.max_wait_ms)

    def _expire(self, corr: int) -> None:
        if self._waiting == corr:
            self._waiting = None
            self.stats.timeouts += 1
            self._poll()

    def receive(self, src: int, msg: object) -> None:
        if not isinstance(msg, ConsumerFetchResponse) or msg.corr_id != self._waiting:
            return
        self._waiting = None
        if self._deadline is not None:
            self._deadline.cancel()
        if msg.error == 0:
            self._take(msg)
        else:
            self.stats.errors += 1
        self.scheduler.schedule(self.poll_interval_ms if msg.error else 1, self._poll)

    def _take(self, msg: ConsumerFetchResponse) -> None:
        if msg.high_watermark < self.max_hw_seen:
            self.hw_regressions += 1
        self.max_hw_seen = max(self.max_hw_seen, msg.high_watermark)
        for batch in iter_batches(msg.records):
            off = batch.base_offset
            if off < self.position and batch.last_offset < self.position:
                continue  # the batch we asked from the middle of is delivered whole
            if off < self.position:
                pass
            elif off != self.position:
                self.offset_violations.append((self.position, off))
            self.consumed[off] = batch.crc
            self.position = batch.last_offset + 1
            self.stats.fetched_batches += 1


@dataclass(slots=True)
class ClientSet:
    producers: list[Producer] = field(default_factory=list)
    consumers: list[Consumer] = field(default_factory=list)


# -- transactions ------------------------------------------------------------------------------
# Coordinator answers a transactional producer retries after a back-off (Kafka's
# TransactionManager: COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR,
# CONCURRENT_TRANSACTIONS, REQUEST_TIMED_OUT).
TXN_RETRIABLE = frozenset({7, 14, 15, 16, 51})
INVALID_PRODUCER_EPOCH = 47
PRODUCER_FENCED = 90
_FENCED = frozenset({INVALID_PRODUCER_EPOCH, PRODUCER_FENCED})
READ_COMMITTED = 1


@dataclass(slots=True)
class TxnStats:
    transactions: int = 0
    committed: int = 0
    aborted: int = 0
    undecided: int = 0  # fenced, timed out or failed before the outcome was learnt
    retries: int = 0
    fenced: int = 0
    epoch_bumps: int = 0


class TxnProducer:
    """A transactional producer as Kafka's (`transactional.id`): InitProducerId, then
    transactions of AddPartitionsToTxn, one batch per partition (its records named by
    `txn_value`), and EndTxn commit or abort. Coordinator requests are retried on retriable
    answers; a produce error aborts the transaction and bumps the epoch (KIP-360); a fenced
    producer (a newer instance of its id, or the coordinator's timeout abort) stops, and
    `on_fenced` may start the next instance. With probability `stall_share` a transaction stays
    open past `transaction.timeout.ms` before its EndTxn (the coordinator aborts it).

    What it wrote and learnt goes to the `ledger` (sim/txn_invariants.TxnLedger); a success
    answered to a request sent after a newer instance of the id got its epoch is a violation
    (FencedProducerRefused)."""

    def __init__(self, node_id: int, transactional_id: str, tps: list[TopicPartition],
                 scheduler: Scheduler, network: Network, leader_of: LeaderLookup,
                 coordinator_of: Callable[[str], int], ledger: Any, rng: Any, *,
                 transaction_timeout_ms: int = 3000, request_timeout_ms: int = 1500,
                 retry_backoff_ms: int = 100, abort_share: float = 0.25,
                 stall_share: float = 0.03,
                 on_fenced: Callable[[TxnProducer], None] | None = None,
                 on_end: Callable[[TxnProducer], None] | None = None) -> None:
        self.node_id = node_id
        self.transactional_id = transactional_id
        self.tps = tps
        self.scheduler = scheduler
        self.network = network
        self.leader_of = leader_of
        self.coordinator_of = coordinator_of
        self.ledger = ledger
        self.rng = rng
        self.transaction_timeout_ms = transaction_timeout_ms
        self.request_timeout_ms = request_timeout_ms
        self.retry_backoff_ms = retry_backoff_ms
        self.abort_share = abort_share
        self.stall_share = stall_share
        self.on_fenced = on_fenced
        self.on_end = on_end  # told when an EndTxn is first sent
        self.producer_id = -1
        self.producer_epoch = -1
        self.running = False  # begins new transactions
        self.phase = "new"  # new, init, add, produce, end, idle, fenced
        self.txn: tuple[str, int] | None = None
        self._seqs: dict[TopicPartition, int] = {}
        self._batches: dict[TopicPartition, tuple[bytes, int]] = {}  # unacked: (data, count)
        self._pending: dict[int, tuple[str, Any, int, Timer]] = {}  # corr -> (what, arg, sent)
        self._corr = 0
        self._commit = True
        self._bump_after_end = False
        self.stats = TxnStats()
        network.register(node_id, self.receive)

    @property
    def busy(self) -> bool:
        """In a transaction (or initializing): its outcome is still to come."""
        return self.phase in ("init", "add", "produce", "end")

    def start(self) -> None:
        self.running = True
        self._init(None)

    def next_sequence(self, tp: TopicPartition) -> int:
        """The sequence of this instance's next batch to `tp` under its current epoch."""
        return self._seqs.get(tp, 0)

    def stop(self) -> None:
        """No new transactions; the one in progress runs to its end."""
        self.running = False

    # -- requests ------------------------------------------------------------------------
    def _request(self, dest: int, what: str, msg_args: tuple[Any, ...] | None,
                 arg: Any = None) -> None:
        """Track a request (its answer or its timeout); a coordinator request (`msg_args`) is
        sent here, a produce by the caller."""
        self._corr += 1
        corr = self._corr
        timer = self.scheduler.schedule(self.request_timeout_ms, self._timed_out, corr)
        self._pending[corr] = (what, arg, self.scheduler.now_ms, timer)
        if dest >= 0 and msg_args is not None:
            self.network.send(self.node_id, dest, TxnRequest(corr, what, msg_args))

    def _to_coordinator(self, what: str, args: tuple[Any, ...], arg: Any = None) -> None:
        self._request(self.coordinator_of(self.transactional_id), what, args, arg)

    def _timed_out(self, corr: int) -> None:
        entry = self._pending.pop(corr, None)
        if entry is not None:
            self._answer(entry[0], entry[1], entry[2], 7, None)  # REQUEST_TIMED_OUT

    def receive(self, src: int, msg: object) -> None:
        if isinstance(msg, TxnResponse):
            entry = self._pending.pop(msg.corr_id, None)
            if entry is not None:
                entry[3].cancel()
                self._answer(entry[0], entry[1], entry[2], msg.error, msg)
        elif isinstance(msg, ProduceResponse):
            entry = self._pending.pop(msg.corr_id, None)
            if entry is not None:
                entry[3].cancel()
                self._answer(entry[0], entry[1], entry[2], msg.error, msg)

    def _later(self, fn: Callable[..., None], *args: Any) -> None:
        self.stats.retries += 1
        self.scheduler.schedule(self.retry_backoff_ms, fn, *args)

    def _answer(self, what: str, arg: Any, sent_ms: int, error: int, msg: Any) -> None:
        if self.phase == "fenced":
            return
        if error == 0 and what in ("add", "end"):
            self.ledger.check_not_fenced(self.transactional_id, self.producer_epoch, sent_ms,
                                         what, self.scheduler.now_ms)
        if what == "init":
            self._on_init(arg, error, msg)
        elif what == "add":
            self._on_add(error)
        elif what == "produce":
            self._on_produce(arg, error)
        elif what == "end":
            self._on_end(error)

    # -- InitProducerId --------------------------------------------------------------------
    def _init(self, expected: tuple[int, int] | None) -> None:
        self.phase = "init"
        self.txn = None
        self._to_coordinator("init", (self.transactional_id, self.transaction_timeout_ms,
                                      expected), expected)

    def _on_init(self, expected: tuple[int, int] | None, error: int, msg: Any) -> None:
        if error == 0:
            self.producer_id, self.producer_epoch = msg.producer_id, msg.producer_epoch
            self._seqs.clear()
            self.ledger.granted(self.transactional_id, self.producer_epoch,
                                self.scheduler.now_ms)
            self.phase = "idle"
            self.scheduler.schedule(self.rng.randint(1, 50), self._begin)
        elif error in TXN_RETRIABLE:
            self._later(self._init, expected)
        else:
            self._fenced()

    def _fenced(self) -> None:
        self.phase = "fenced"
        self.running = False
        self.stats.fenced += 1
        if self.txn is not None:
            self.stats.undecided += 1
        for _, _, _, timer in self._pending.values():
            timer.cancel()
        self._pending.clear()
        if self.on_fenced is not None:
            self.on_fenced(self)

    def _bump(self) -> None:
        """KIP-360: after an abortable error, a new epoch under the same producer id."""
        self.stats.epoch_bumps += 1
        self._bump_after_end = False
        self._init((self.producer_id, self.producer_epoch))

    # -- a transaction ---------------------------------------------------------------------
    def _begin(self) -> None:
        if not self.running or self.phase != "idle":
            return
        self.txn = (self.transactional_id, self.ledger.next_number(self.transactional_id))
        self.stats.transactions += 1
        chosen = self.rng.sample(self.tps, self.rng.randint(1, min(2, len(self.tps))))
        now = self.scheduler.now_ms
        self._batches = {}
        for tp in sorted(chosen):
            count = self.rng.randint(1, 3)
            values = [self.ledger.value(self.txn, i, count) for i in range(count)]
            self._batches[tp] = (bytes(build_values(
                values, now_ms=now, producer_id=self.producer_id,
                producer_epoch=self.producer_epoch, base_sequence=self._seqs.get(tp, 0),
                transactional=True)), count)
        self._commit = self.rng.random() >= self.abort_share
        self._add()

    def _add(self) -> None:
        self.phase = "add"
        self._to_coordinator("add", (self.transactional_id, self.producer_id,
                                     self.producer_epoch, sorted(self._batches)))

    def _on_add(self, error: int) -> None:
        if error == 0:
            self.phase = "produce"
            assert self.txn is not None
            for tp, (_, count) in self._batches.items():
                self.ledger.wrote(self.txn, tp, count)
            for tp in list(self._batches):
                self._produce(tp)
        else:
            self._coordinator_error(error, self._add)

    def _coordinator_error(self, error: int, retry: Callable[[], None]) -> None:
        """Retry after a back-off; stop when fenced; after any other error (the transaction's
        fate unknown to this producer) a new epoch."""
        if error in TXN_RETRIABLE:
            self._later(retry)
        elif error in _FENCED:
            self._fenced()
        else:
            self.stats.undecided += 1
            self._bump()

    def _produce(self, tp: TopicPartition) -> None:
        if self.phase != "produce" or tp not in self._batches:
            return
        leader, _ = self.leader_of(tp)
        self._request(leader, "produce", None, tp)
        if leader >= 0:
            self.network.send(self.node_id, leader, ProduceRequest(
                self._corr, -1, self.request_timeout_ms, tp, self._batches[tp][0],
                self.transactional_id))

    def _on_produce(self, tp: TopicPartition, error: int) -> None:
        if self.phase != "produce":
            return
        if error == 0:
            _, count = self._batches.pop(tp)
            self._seqs[tp] = self._seqs.get(tp, 0) + count
            if not self._batches:
                self._ready()
        elif error in RETRIABLE_ERRORS:
            self._later(self._produce, tp)
        elif error in _FENCED:
            self._fenced()
        else:
            # An abortable error (e.g. OUT_OF_ORDER_SEQUENCE_NUMBER): abort, then a new epoch
            # (KIP-360), which restarts the sequences.
            self._commit = False
            self._bump_after_end = True
            self._batches.clear()
            self._end()

    def _ready(self) -> None:
        if self.rng.random() < self.stall_share:
            # A stalled application: the coordinator's timeout aborts the transaction.
            self.scheduler.schedule(2 * self.transaction_timeout_ms, self._end)
        else:
            self.scheduler.schedule(self.rng.randint(0, 20), self._end)

    def _end(self) -> None:
        if self.phase not in ("produce", "end"):
            return
        if self.phase != "end" and self.on_end is not None:
            self.on_end(self)
        self.phase = "end"
        self._to_coordinator("end", (self.transactional_id, self.producer_id,
                                     self.producer_epoch, self._commit))

    def _on_end(self, error: int) -> None:
        if error == 0:
            assert self.txn is not None
            self.ledger.outcome(self.txn, self._commit, self.scheduler.now_ms)
            if self._commit:
                self.stats.committed += 1
            else:
                self.stats.aborted += 1
            self.txn = None
            if self._bump_after_end:
                self._bump()
                return
            self.phase = "idle"
            self.scheduler.schedule(self.rng.randint(1, 50), self._begin)
        else:
            self._coordinator_error(error, self._end)


class TxnConsumer(Consumer):
    """A read_committed consumer of one partition: fetches up to the LSO with the aborted
    transactions, filters as Kafka's client (sim/txn_invariants.read_committed) and hands what
    it returns to the ledger."""

    def __init__(self, node_id: int, tp: TopicPartition, scheduler: Scheduler,
                 network: Network, leader_of: LeaderLookup, ledger: Any, *,
                 poll_interval_ms: int = 20, max_wait_ms: int = 50) -> None:
        super().__init__(node_id, tp, scheduler, network, leader_of,
                         poll_interval_ms=poll_interval_ms, max_wait_ms=max_wait_ms)
        self.ledger = ledger
        self.last_stable_offset = 0
        self.records_read = 0

    def _fetch_request(self, corr: int, leader_epoch: int) -> object:
        return ConsumerFetchRequest(corr, self.tp, self.position, leader_epoch,
                                    self.max_wait_ms, READ_COMMITTED)

    def _take(self, msg: ConsumerFetchResponse) -> None:
        self.last_stable_offset = msg.last_stable_offset
        last = -1
        for batch in iter_batches(msg.records):
            last = batch.last_offset
        if last >= self.position:
            got = [r for r in read_committed(msg.records, msg.aborted_transactions)
                   if r.offset >= self.position]
            self.records_read += len(got)
            self.ledger.consumed(self.tp, got, self.scheduler.now_ms)
            self.position = last + 1
