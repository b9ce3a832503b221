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
            self.network.send(self.node_id, leader, ConsumerFetchRequest(
                self._corr, self.tp, self.position, epoch, self.max_wait_ms))
        # Whatever happens to the request, poll again after a bounded wait.
        self._deadline = self.scheduler.schedule(self.max_wait_ms + 100, self._expire, self._corr)

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
        else:
            self.stats.errors += 1
        self.scheduler.schedule(self.poll_interval_ms if msg.error else 1, self._poll)


@dataclass(slots=True)
class ClientSet:
    producers: list[Producer] = field(default_factory=list)
    consumers: list[Consumer] = field(default_factory=list)
